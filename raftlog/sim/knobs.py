"""Every tunable of a simulated history, all drawn from the run's one seeded PRNG.

A run is fully described by (seed, steps, nodes, mutation): the knobs below are a pure
function of those, so a failing seed replays exactly. Fault profiles give the knobs a
shape (a lossy network, a crashing cluster with a slow disk, leader churn); a mutation
only shifts which profile is likely, it never adds a fault Raft does not promise to
survive.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

__all__ = ["Knobs", "PROFILES", "SHELL_MUTATIONS", "nodes_for_seed"]

#: Mutations the simulated shell implements itself (the core knows the others).
SHELL_MUTATIONS = frozenset({"ack-before-fsync", "serve-corrupt"})

MS = 1_000  # virtual time is in microseconds


@dataclass(frozen=True)
class Knobs:
    seed: int
    nodes: int
    mutation: str | None
    profile: str
    # Raft configuration.
    election_ticks: int
    heartbeat_ticks: int
    max_append_bytes: int
    max_inflight: int
    check_quorum: bool
    pre_vote: bool
    preferred_leader: int | None
    # Clocks: each node ticks every `tick_us * (1 ± tick_skew)`, jittered per tick.
    tick_us: int
    tick_skew: float
    # Network.
    latency_min_us: int
    latency_max_us: int
    drop_p: float
    dup_p: float
    reorder_p: float
    # Disk.
    fsync_min_us: int
    fsync_max_us: int
    torn_p: float
    # Faults: one nemesis action every `fault_mean_us` on average, chosen by weight.
    fault_mean_us: int
    fault_weights: tuple[tuple[str, int], ...]
    down_mean_us: int
    partition_mean_us: int
    flap_p: float  # chance a newly elected leader is cut off moments after winning
    # Connection drops: the shell tells a core "link to X dropped" (`leader_unreachable`)
    # every `link_drop_mean_us` on average (0: never) on a random link, and on every
    # live peer's side when a node crashes (`link_drop_on_crash`).
    link_drop_mean_us: int
    link_drop_on_crash: bool
    # Disk corruption: every `corrupt_mean_us` on average (0: never) an entry on one
    # replica's disk goes bad while peers still hold it intact (see the nemesis).
    corrupt_mean_us: int
    # Lost state: every `lose_state_mean_us` on average (0: never) a replica restarts
    # with its log but without its snapshot and state (a damaged snapshot file), and
    # rebuilds from a leader's snapshot (`raftlog.core`, "Lost state").
    lose_state_mean_us: int
    # Clients.
    client_mean_us: int
    op_weights: tuple[tuple[str, int], ...]
    payload_max: int
    reconfig: bool

    @classmethod
    def draw(
        cls,
        rng: random.Random,
        seed: int,
        nodes: int,
        mutation: str | None = None,
        *,
        reconfig_supported: bool = True,
        **overrides: object,
    ) -> Knobs:
        """Knobs drawn from the run's PRNG (seeded with `seed`); `overrides` pin chosen
        fields (hypothesis uses this)."""
        profile = _pick(rng, _PROFILE_WEIGHTS[mutation])
        k: dict[str, object] = {
            "seed": seed,
            "nodes": nodes,
            "mutation": mutation,
            "profile": profile,
            "election_ticks": rng.choice((6, 10, 15)),
            "heartbeat_ticks": rng.choice((1, 1, 2, 3)),
            "max_append_bytes": rng.choice((1, 256, 4096, 1 << 20)),
            "max_inflight": rng.choice((1, 4, 64)),
            "check_quorum": rng.random() < 0.8,
            "pre_vote": rng.random() < 0.8,
            "preferred_leader": rng.randint(1, nodes) if rng.random() < 0.15 else None,
            "tick_us": 10 * MS,
            "tick_skew": rng.uniform(0.0, 0.2),
            "latency_min_us": rng.randint(100, 2 * MS),
            "latency_max_us": 0,  # set below
            "drop_p": rng.uniform(0.0, 0.03),
            "dup_p": rng.uniform(0.0, 0.03),
            "reorder_p": rng.uniform(0.0, 0.3),
            "fsync_min_us": rng.randint(200, 2 * MS),
            "fsync_max_us": 0,  # set below
            "torn_p": rng.uniform(0.0, 0.5),
            "fault_mean_us": rng.randint(100 * MS, 400 * MS),
            "fault_weights": _FAULTS_DEFAULT,
            "down_mean_us": rng.randint(50 * MS, 400 * MS),
            "partition_mean_us": rng.randint(50 * MS, 600 * MS),
            "flap_p": rng.choice((0.0, 0.0, 0.1, 0.3)),
            "client_mean_us": rng.randint(3 * MS, 30 * MS),
            "op_weights": (
                ("propose", 80),
                ("read", 12),
                ("transfer", 4),
                ("reconfig", 4),
                ("compact", rng.choice((0, 3, 8))),
            ),
            "payload_max": rng.choice((16, 64, 2048)),
            "reconfig": reconfig_supported and rng.random() < 0.3,
        }
        k["latency_max_us"] = int(k["latency_min_us"]) + rng.randint(1 * MS, 25 * MS)  # type: ignore[call-overload]
        k["fsync_max_us"] = int(k["fsync_min_us"]) + rng.randint(0, 15 * MS)  # type: ignore[call-overload]
        # Drawn from a stream of their own, so that every other knob of a seed stays
        # what it was before these existed.
        links = random.Random(f"link-drops/{seed}")
        k["link_drop_mean_us"] = links.choice((0, 50 * MS, 200 * MS, 800 * MS))
        k["link_drop_on_crash"] = links.random() < 0.8
        corrupts = random.Random(f"corruption/{seed}")
        k["corrupt_mean_us"] = corrupts.choice((0, 0, 100 * MS, 400 * MS))
        if mutation == "serve-corrupt":
            k["corrupt_mean_us"] = 20 * MS  # the mutation only shows where disks go bad
        k["lose_state_mean_us"] = random.Random(f"lost-state/{seed}").choice(
            (0, 0, 300 * MS, 1000 * MS))
        PROFILES[profile](rng, k)
        k.update(overrides)
        return cls(**k)  # type: ignore[arg-type]

    def replace(self, **changes: object) -> Knobs:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def describe(self) -> str:
        """All knobs, one per line, for the head of a verbose run."""
        return "\n".join(
            f"  {f.name} = {getattr(self, f.name)!r}" for f in dataclasses.fields(self)
        )

    @property
    def election_timeout_us(self) -> int:
        return self.election_ticks * self.tick_us


def nodes_for_seed(seed: int) -> int:
    """Runs without `--nodes` alternate between three- and five-node groups."""
    return 3 if seed % 2 == 0 else 5


def _pick(rng: random.Random, weights: tuple[tuple[str, int], ...]) -> str:
    return rng.choices([name for name, _ in weights], [w for _, w in weights])[0]


_FAULTS_DEFAULT: tuple[tuple[str, int], ...] = (
    ("crash", 10),
    ("crash_leader", 5),
    ("crash_majority", 2),
    ("pause", 4),
    ("isolate", 6),
    ("isolate_leader", 5),
    ("split", 5),
    ("one_way", 3),
    ("bridge", 3),
    ("ring", 3),
    ("heal", 4),
    ("wipe", 2),
)


def _calm(rng: random.Random, k: dict[str, object]) -> None:
    k["fault_mean_us"] = rng.randint(300 * MS, 1000 * MS)


def _mixed(rng: random.Random, k: dict[str, object]) -> None:
    pass


def _lossy(rng: random.Random, k: dict[str, object]) -> None:
    """A bad network: loss, duplicates, reordering and every partition shape."""
    k["drop_p"] = rng.uniform(0.02, 0.25)
    k["dup_p"] = rng.uniform(0.0, 0.15)
    k["reorder_p"] = rng.uniform(0.1, 0.6)
    k["fault_mean_us"] = rng.randint(40 * MS, 200 * MS)
    k["fault_weights"] = (
        ("crash", 2),
        ("isolate", 8),
        ("isolate_leader", 8),
        ("split", 8),
        ("one_way", 4),
        ("bridge", 4),
        ("ring", 4),
        ("heal", 4),
    )


def _crashy(rng: random.Random, k: dict[str, object]) -> None:
    """Frequent crashes, often of a majority at once, while a slow disk lags behind."""
    k["fsync_min_us"] = rng.randint(5 * MS, 40 * MS)
    k["fsync_max_us"] = k["fsync_min_us"] + rng.randint(20 * MS, 150 * MS)  # type: ignore[operator]
    k["torn_p"] = rng.uniform(0.0, 0.3)
    k["fault_mean_us"] = rng.randint(40 * MS, 150 * MS)
    k["down_mean_us"] = rng.randint(20 * MS, 150 * MS)
    k["client_mean_us"] = rng.randint(1 * MS, 8 * MS)
    k["fault_weights"] = (
        ("crash", 6),
        ("crash_leader", 4),
        ("crash_majority", 8),
        ("pause", 2),
        ("isolate", 2),
        ("heal", 1),
        ("wipe", 2),
    )


def _churn(rng: random.Random, k: dict[str, object]) -> None:
    """Leaders change often while logs are only partly replicated (the Figure 8 shape)."""
    k["max_append_bytes"] = 1  # one entry per append: followers ack entry by entry
    k["flap_p"] = rng.uniform(0.5, 1.0)
    k["max_inflight"] = rng.choice((1, 2, 4))
    k["drop_p"] = rng.uniform(0.05, 0.3)
    k["election_ticks"] = rng.choice((4, 6))
    k["heartbeat_ticks"] = 2
    k["fault_mean_us"] = rng.randint(20 * MS, 80 * MS)
    k["partition_mean_us"] = rng.randint(20 * MS, 150 * MS)
    k["down_mean_us"] = rng.randint(20 * MS, 100 * MS)
    k["client_mean_us"] = rng.randint(5 * MS, 12 * MS)
    k["fault_weights"] = (
        ("crash_leader", 8),
        ("isolate_leader", 10),
        ("crash", 3),
        ("split", 4),
        ("one_way", 3),
        ("heal", 3),
    )


#: Profile name → function that reshapes the default knobs.
PROFILES = {
    "calm": _calm,
    "mixed": _mixed,
    "lossy": _lossy,
    "crashy": _crashy,
    "churn": _churn,
}

_BASE = (("calm", 1), ("mixed", 4), ("lossy", 3), ("crashy", 3), ("churn", 3))
_PROFILE_WEIGHTS: dict[str | None, tuple[tuple[str, int], ...]] = {
    None: _BASE,
    "ack-before-fsync": (("crashy", 1),),
    "commit-old-term": (("churn", 1),),
    "no-prevote-term-check": (("lossy", 1), ("churn", 1)),
    "serve-corrupt": (("calm", 1), ("mixed", 1)),
    "snapshot-no-base": _BASE,
}
