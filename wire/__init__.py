"""The wire: what every raftmq process agrees on, below the broker, the name server, the
transport and the SDK.

`protocol` (frames, op codes, error codes, name rules), `records` (the batch format,
stored as sent), `produce` (the multi-batch PRODUCE request) and `txn` (which group
coordinates a transactional id). Nothing here imports another raftmq package.
"""
