"""`python -m tests.fuzz TARGET [--runs N] [--all]`: fuzz with atheris (`make fuzz`).

The corpus directory of each target is read and grown; a crashing input is written to
`tests/fuzz/crashes/` (keep it in the corpus once fixed). `--runs` counts inputs per
target. Prints one line per target: inputs run, corpus size, seconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
CRASHES = HERE / "crashes"


def _run_one(name: str, runs: int, max_len: int) -> int:
    """Run atheris on one target in this process (it exits when done)."""
    import atheris

    # everything the targets reach is imported here first, instrumented for coverage
    with atheris.instrument_imports(include=["broker", "raftlog", "namesrv", "transport",
                                             "msgpack", "raftmq.filter", "lark"]):
        from tests.fuzz import targets
    target = targets.TARGETS[name]
    corpus = CORPUS / name
    corpus.mkdir(parents=True, exist_ok=True)
    if not any(corpus.iterdir()):
        for i, seed in enumerate(targets.seeds(name)):
            (corpus / f"seed-{i}").write_bytes(seed)
    CRASHES.mkdir(exist_ok=True)
    args = [sys.argv[0], str(corpus), f"-runs={runs}", f"-max_len={max_len}",
            f"-artifact_prefix={CRASHES}/{name}-", "-timeout=10", "-rss_limit_mb=2048",
            "-print_final_stats=1"]
    atheris.Setup(args, target)
    atheris.Fuzz()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz")
    p.add_argument("target", nargs="?", help="frame, batch, snapshot, commitlog or filter")
    p.add_argument("--all", action="store_true", help="every target, one after another")
    p.add_argument("--runs", type=int, default=250_000, help="inputs per target")
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:  # nothing of the product imported yet: atheris instruments it
        return _run_one(args.target, args.runs, args.max_len)
    from tests.fuzz.targets import TARGETS

    names = list(TARGETS) if args.all or not args.target else [args.target]
    failed = 0
    for name in names:
        if name not in TARGETS:
            p.error(f"unknown target {name!r} (known: {', '.join(TARGETS)})")
        t0 = time.monotonic()
        rc = subprocess.run([sys.executable, "-m", "tests.fuzz", name, "--one", "--runs",
                             str(args.runs), "--max-len", str(args.max_len)],
                            cwd=HERE.parent.parent).returncode
        size = sum(1 for _ in (CORPUS / name).iterdir())
        print(f"fuzz {name}: {args.runs} inputs, exit {rc}, corpus {size} files, "
              f"{time.monotonic() - t0:.0f} s", flush=True)
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
