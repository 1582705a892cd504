"""The time budget of one served connection, and the memory pools several connections share.

A connection that holds a buffer must be making progress, or it is closed: every
socket is a reader's memory the other end controls. `Budget` names the limits, and
`Watch` applies them to one connection as the deadline of its reads:

* a frame once its first byte arrived must be complete within `frame_timeout` (a
  half-sent frame is dropped with the connection, its buffer released);
* with nothing in flight and no bytes arriving, a connection is closed after
  `idle_timeout`;
* when a login is required (`login_timeout` set), the connection must have logged in
  (`Caller.log_in`) within `login_timeout` of its start, frames before that may not
  exceed `login_max_frame`.

A deadline that passes raises `ProtocolError(TIMEOUT)` from the read, which the serving
loop answers with one error frame (id 0) before closing, as for any broken stream.

`BytePool` is memory several connections draw from (the request bodies in flight of
one user, and the frames they are reading; the large frames a name server reads): a
frame larger than `RESERVE_OVER` is taken from the pool as soon as its length is known,
before its body is read, and reading waits until it fits, so many connections together
hold no more than the limit (plus one request admitted while under it), and other pools
are not affected.
While a reader waits for the pool, the frame's deadline does not run (the wait is the
server's, not the sender's); it starts again when reading resumes.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from wire.protocol import Code, FrameDecoder, ProtocolError

__all__ = ["RESERVE_OVER", "Budget", "BytePool", "Watch"]

#: Frames up to this size are read without setting memory aside first: one read's worth.
RESERVE_OVER = 64 << 10


@dataclass(frozen=True, slots=True)
class Budget:
    """Time (and, before a login, frame size) limits of a connection; None: no limit."""

    frame_timeout: float | None = None
    idle_timeout: float | None = None
    login_timeout: float | None = None  # set: a login is required within this many seconds
    login_max_frame: int | None = None  # the frame limit until then

    def __post_init__(self) -> None:
        for name in ("frame_timeout", "idle_timeout", "login_timeout"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.login_max_frame is not None and self.login_max_frame < 64:
            raise ValueError(f"login_max_frame must be at least 64, got {self.login_max_frame}")


class Watch:
    """One connection's deadlines, kept as the deadline of its current read.

    The serving loop tells it what happens (bytes arrived, a frame completed, a request
    started or finished, the caller logged in); `read` waits for bytes no longer than
    the earliest deadline that applies now, and `rearm` moves a read already waiting
    when that changes (the last request finished: the idle clock starts)."""

    def __init__(self, budget: Budget, decoder: FrameDecoder, *,
                 since: float | None = None) -> None:
        self.budget = budget
        self._decoder = decoder
        self._full_frame = decoder.max_frame
        now = trio.current_time()
        self._started = now if since is None else since  # (the login deadline counts from it)
        self._quiet_since = now  # nothing in flight since then
        self._partial_since: float | None = None  # first byte of an unfinished frame
        self._inflight = 0
        self._logged_in = budget.login_timeout is None
        self._scope: trio.CancelScope | None = None
        # sets memory aside for a frame before its body is read; True: it had to wait
        self.reserve: Callable[[int], Awaitable[bool]] | None = None
        self._reserved = False  # for the frame being read
        if not self._logged_in and budget.login_max_frame is not None:
            decoder.max_frame = min(decoder.max_frame, budget.login_max_frame)

    @property
    def logged_in(self) -> bool:
        return self._logged_in

    def deadline(self) -> tuple[float, str]:
        """The earliest deadline now, and what it is for."""
        when, why = self._earliest()
        return when, self._reason(why)

    def _earliest(self) -> tuple[float, str]:
        """The earliest deadline now and which one it is ("" for none): asked before every
        read, so the words that say why are written only once one has passed."""
        b = self.budget
        when, why = math.inf, ""
        if not self._logged_in and b.login_timeout is not None:
            when, why = self._started + b.login_timeout, "login"
        if self._partial_since is not None:
            if b.frame_timeout is not None and self._partial_since + b.frame_timeout < when:
                when, why = self._partial_since + b.frame_timeout, "frame"
        elif self._inflight == 0:
            idle = b.idle_timeout
            if idle is not None and self._quiet_since + idle < when:
                when, why = self._quiet_since + idle, "idle"
        return when, why

    def _reason(self, why: str) -> str:
        b = self.budget
        if why == "login":
            return f"no login within {b.login_timeout:g} s of connecting"
        if why == "frame":
            return f"a frame was not completed within {b.frame_timeout:g} s of its first byte"
        if why == "idle":
            return f"idle for {b.idle_timeout:g} s with nothing in flight"
        return ""

    def rearm(self) -> None:
        if self._scope is not None:
            self._scope.deadline = self._earliest()[0]

    async def read(self, read: trio.abc.ReceiveStream, max_bytes: int) -> bytes | bytearray:
        """`read_some` within the deadline; `ProtocolError(TIMEOUT)` once it passed."""
        from .framing import read_some

        with trio.CancelScope(deadline=self._earliest()[0]) as scope:
            self._scope = scope
            try:
                return await read_some(read, max_bytes)
            finally:
                self._scope = None
        raise ProtocolError(Code.TIMEOUT, f"closing the connection: {self.deadline()[1]}")

    async def before_read(self) -> None:
        """Set memory aside for a large frame whose length is known, once, before its body
        is read (`reserve`); time spent waiting for it does not count against the frame."""
        if self.reserve is None or self._reserved:
            return
        size = self._decoder.pending_frame()
        if size is None or size <= RESERVE_OVER:
            return
        self._reserved = True
        if await self.reserve(size):
            self._partial_since = trio.current_time()

    def received(self) -> None:
        """Bytes arrived and no frame is complete yet."""
        if self._partial_since is None and self._decoder.buffered:
            self._partial_since = trio.current_time()

    def frame_done(self) -> None:
        """A frame was taken whole; bytes left behind start the next one."""
        now = trio.current_time()
        self._partial_since = now if self._decoder.buffered else None
        self._quiet_since = now
        self._reserved = False

    def started(self) -> None:
        self._inflight += 1

    def finished(self) -> None:
        self._inflight -= 1
        if not self._inflight:
            self._quiet_since = trio.current_time()
            self.rearm()

    def log_in(self) -> None:
        """The caller logged in: full frames, no login deadline, the longer idle one."""
        if self._logged_in:
            return
        self._logged_in = True
        self._decoder.max_frame = self._full_frame
        self.rearm()


class BytePool:
    """Bytes that several connections draw from (one user's request bodies in flight).

    `wait_room` lets a request in once the pool is under its limit, `take` counts its
    body (a request is admitted whole, so one larger than the limit still runs, alone);
    `take_fitting` sets a frame aside before it is read, once it fits; `give` returns
    either."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a byte pool's limit must be positive, got {limit}")
        self.limit = limit
        self.held = 0
        self._freed = trio.lowlevel.ParkingLot()

    @property
    def full(self) -> bool:
        return self.held >= self.limit

    async def wait_room(self) -> None:
        while self.held >= self.limit:
            await self._freed.park()

    async def take_fitting(self, nbytes: int) -> bool:
        """Take `nbytes` once they fit under the limit (or the pool is empty: one larger
        than the limit is taken alone); True when that meant waiting."""
        waited = False
        while self.held and self.held + nbytes > self.limit:
            waited = True
            await self._freed.park()
        self.held += nbytes
        return waited

    def take(self, nbytes: int) -> None:
        self.held += nbytes

    def give(self, nbytes: int) -> None:
        self.held -= nbytes
        self._freed.unpark_all()
