"""Majority arithmetic over a set of voters (etcd's `quorum.MajorityConfig`).

Pure functions: who counts is always the voter set passed in, so learners and nodes that
were removed never tip a decision.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

__all__ = ["committed_index", "has_quorum", "majority", "vote_result"]


def majority(voters: Collection[int]) -> int:
    """How many of `voters` make a quorum."""
    return len(voters) // 2 + 1


def has_quorum(voters: Collection[int], ids: Iterable[int]) -> bool:
    """Whether the voters among `ids` (each counted once) form a quorum."""
    return len(set(ids) & set(voters)) >= majority(voters)


def vote_result(voters: Collection[int], votes: Mapping[int, bool]) -> bool | None:
    """True once a quorum granted, False once a quorum refused, else None (undecided)."""
    q = majority(voters)
    granted = sum(1 for v, ok in votes.items() if ok and v in voters)
    if granted >= q:
        return True
    refused = sum(1 for v, ok in votes.items() if not ok and v in voters)
    if refused >= q:
        return False
    return None


def committed_index(voters: Collection[int], match: Mapping[int, int]) -> int:
    """The highest index a quorum of `voters` holds, by their `match` indexes; 0 when too
    few voters are known to make a quorum."""
    matches = sorted((match[v] for v in voters if v in match), reverse=True)
    q = majority(voters)
    return matches[q - 1] if len(matches) >= q else 0
