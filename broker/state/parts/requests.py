"""Client-request deduplication: control entries a client may send twice.

A control entry carrying `req` = [client id, sequence] is a request that may be retried
(after a leader change whose first copy was committed after all). The first copy applies
and its result is remembered; a later copy is answered with that result and changes
nothing, so a retried offset commit can never roll back a later one. Per client the last
`REQUEST_WINDOW` results are kept; a sequence older than those is refused
(STALE_REQUEST: its outcome is unknown) rather than applied again. At most `MAX_CLIENTS`
clients are remembered (the least recently seen go first), and clients silent since
before the retention horizon are forgotten.

The `req` check and the lookup come before the wrapped record is even decoded: a
duplicate is answered as the first copy was, whatever it carries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.state.parts.base import ApplyResult, ControlResult, Part, Refused
from wire.protocol import REQUEST_ID_RULE, Code, valid_request_id

__all__ = ["MAX_CLIENTS", "REQUEST_WINDOW", "Requests"]

REQUEST_WINDOW = 64  # control requests remembered per client (retries outlive no more)
MAX_CLIENTS = 1 << 16  # clients remembered at all; the least recently seen go first


@dataclass(slots=True)
class _Client:
    """What one client's retried control requests need: the results of its last
    `REQUEST_WINDOW` requests by sequence, and the highest sequence forgotten since."""

    floor: int  # sequences at or below it are no longer remembered (-1: none forgotten)
    results: dict[int, tuple[str, int, int]]  # seq -> (op, applied, skipped), oldest first
    last_index: int  # Raft index of the newest request, for forgetting silent clients


class Requests(Part):
    """client id -> its remembered results, least recently seen first."""

    name = "requests"
    version = 1

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self._clients: dict[int, _Client] = {}

    def deduplicate(self, raw_req: object, index: int,
                    apply: Callable[[], ApplyResult]) -> ApplyResult:
        """Run `apply` (the request's own handler) unless request `raw_req` was applied
        before; Refused for a malformed id or a forgotten sequence, and when `apply` is."""
        req = valid_request_id(raw_req)
        if req is None:
            raise Refused(Code.MALFORMED, f"{REQUEST_ID_RULE}, got {raw_req!r}")
        cid, seq = req
        client = self._clients.get(cid)
        seen = client.results.get(seq) if client is not None else None
        if seen is not None:
            result: ApplyResult = ControlResult(seen[0], seen[1], seen[2], dup=True)
        elif client is not None and seq <= client.floor:
            raise Refused(Code.STALE_REQUEST, f"request {seq} of client {cid} is older than "
                          f"the {REQUEST_WINDOW} remembered; its outcome is unknown")
        else:
            result = apply()  # raises when refused: nothing to remember
            if client is None:
                client = _Client(-1, {}, index)
            if isinstance(result, ControlResult):
                client.results[seq] = (result.op, result.applied, result.skipped)
                if len(client.results) > REQUEST_WINDOW:
                    oldest = min(client.results)
                    del client.results[oldest]
                    client.floor = max(client.floor, oldest)
        assert client is not None
        self._clients.pop(cid, None)  # (re)inserted last: the most recently seen
        self._clients[cid] = client
        client.last_index = index
        if len(self._clients) > MAX_CLIENTS:
            del self._clients[next(iter(self._clients))]
        return result

    def retained(self, min_index: int) -> int:
        for c in [c for c, st in self._clients.items() if st.last_index < min_index]:
            del self._clients[c]
        return 0

    def section(self) -> Any:
        # in least-recently-seen order, which is itself state (it decides who goes first)
        return [
            [cid, st.floor, st.last_index, [[seq, *r] for seq, r in st.results.items()]]
            for cid, st in self._clients.items()
        ]

    def load(self, version: int, section: Any) -> None:
        if version != 1:
            raise ValueError(f"unsupported requests section version {version!r}")
        for cid, floor, last_index, results in section:
            self._clients[int(cid)] = _Client(
                int(floor), {int(seq): (str(op), int(a), int(k))
                             for seq, op, a, k in results}, int(last_index))
