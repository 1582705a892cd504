"""The wire: what every raftmq process agrees on, below the broker, the name server, the
transport and the SDK.

`protocol` (frames, op codes, error codes, name rules), `records` (the batch format,
stored as sent), `produce` (the multi-batch PRODUCE request), `txn` (which group
coordinates a transactional id) and `security` (user names, SCRAM verifiers, ACL
operations). Nothing here imports another raftmq package.
"""
