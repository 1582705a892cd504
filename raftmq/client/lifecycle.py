"""`start()` and `close()` beside `async with`, for code that cannot keep a block open
around a client's life (a web framework's startup and shutdown hooks, a class that owns
a client).

`await client.start()` enters the client as `async with` does and returns it; `await
client.close()` leaves it as the end of the block does (a producer flushes, a push
consumer commits). Both must run in one task: the client's task group belongs to the
task that started it, as with `async with`. `close()` ends only what `start()` began,
once; it does nothing otherwise.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

__all__ = ["StartClose"]


class StartClose:
    """Gives a client with `__aenter__`/`__aexit__` a `start()` and a `close()`."""

    _started_by_start = False

    async def __aenter__(self) -> Any:  # the client's own
        raise NotImplementedError

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:  # the client's own
        raise NotImplementedError

    async def start(self) -> Self:
        """Open the client as `async with` does; pair it with `close()` in this task."""
        await self.__aenter__()
        self._started_by_start = True
        return self

    async def close(self) -> None:
        """Leave what `start()` opened, as the end of an `async with` block does."""
        if not self._started_by_start:
            return
        self._started_by_start = False
        await self.__aexit__(None, None, None)
