"""The one framing and connection layer every raftmq process speaks through.

Clients, nodes and name servers all import it:

* `framing` — the serving loop (trio): requests each in its own task, answers coalesced
  per connection, and a `Caller` per connection given to every handler (who is calling;
  `Caller.request` calls that client back on the same connection);
* `connection` — the client's multiplexed connections (anyio), which also answer the
  requests a server sends them (`ConnectionPool.on_request`);
* `blocking` — the plain-socket client for tools and tests;
* `peerauth` — the peer handshake (HMAC challenge-response over the cluster secret) that
  makes a connection a peer's;
* `tls` — the SSL-context hook every way in and out goes through;
* `logs` — the JSON-lines logging of every server process.

The frame format itself is `wire.protocol`.
"""
