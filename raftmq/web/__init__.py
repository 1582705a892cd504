"""The HTTP side of raftmq: a JSON API any language can call and the web console.

Both are one ASGI application served by hypercorn's trio worker (`raftmq.web.server`).
The application is a client of the cluster like any SDK user: each request acts as the
user it authenticated as, so the nodes' own ACLs decide what it may do.
"""
