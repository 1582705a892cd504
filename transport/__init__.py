"""The one framing and connection layer every raftmq process speaks through.

Clients, nodes and name servers all import it: `framing` serves requests on a connection
(trio), `connection` multiplexes requests from a client (anyio), `blocking` is the plain
socket version for tools and tests, and `logs` the JSON-lines logging every server
process uses. The frame format itself is `broker.protocol`.
"""
