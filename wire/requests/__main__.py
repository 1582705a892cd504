"""`python -m wire.requests > docs/protocol.md`."""

from wire.requests.reference import main

main()
