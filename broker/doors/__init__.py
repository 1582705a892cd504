"""Request doors: what a node answers to clients and peers, one door per area.

`produce`, `reads`, `offsets`, `topics`, `cluster`, `heartbeats` and `transactions` each
answer one area's ops (`handlers()`), on what they share in `base`; `service` builds them,
each with what it needs, and dispatches on their merged table. A door decodes its request
(the typed requests of `wire.requests` where they exist), validates it once, and reaches
groups through `broker.runtime.leading.GroupLead`. `security.Guard` stands in front of
every door.
"""
