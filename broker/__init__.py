"""The broker: one node process hosting replicas of many Raft groups.

Layers, each importing only those below it (`docs/architecture.md` draws them):

* `broker.state`: the replicated state machine and its parts, fed committed entries in
  log order (no sockets, no clocks: the simulator runs them as they are).
* `broker.runtime`: what runs a group and reaches it: the group registry, `GroupLead`
  (lead / propose / read with a barrier), Raft traffic between nodes, admission, the
  name-server registrar, metrics.
* `broker.doors`: the request handlers clients and peers talk to, and the guard in front
  of them.
* `broker.duties`: leader-side tasks beside the state machine (transaction markers and
  check-back, retention).
* `broker.node`: the process that composes all of the above; `broker.config` is its
  configuration, read by every layer.
"""
