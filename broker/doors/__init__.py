"""Request doors: what a node answers to clients and peers.

A door decodes its request (the typed requests of `wire.requests` where they exist),
validates it once, and reaches groups through `broker.runtime.leading.GroupLead`.
`security.Guard` stands in front of every door.
"""
