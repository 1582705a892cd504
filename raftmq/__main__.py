"""`python -m raftmq ARGS` is the `raftmq` command, for environments without the console
script on PATH (and for the chaos harness, which starts nodes with `sys.executable`)."""

import sys

from raftmq.cli import main

if __name__ == "__main__":
    sys.exit(main())
