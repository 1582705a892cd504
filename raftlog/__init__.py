"""raftlog: Raft consensus (a sans-I/O core) and the CommitLog it replicates.

Knows nothing of topics or messages; `broker` gives entries their meaning.
"""
