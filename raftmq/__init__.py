"""raftmq: what users import and run — client SDK, CLI and configuration."""
