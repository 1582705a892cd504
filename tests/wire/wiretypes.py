"""What every typed request and answer is held to, for the per-area tests: its header
decodes back to it, a required field left out and a field of the wrong kind are
MALFORMED naming the field."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

import pytest

from wire.protocol import Code, RequestError
from wire.requests import WireType

#: A value of another kind than each declared one (an int is never a bool, nor a bool
#: an int).
WRONG = {int: "1", str: 5, bool: 1, list: "x", dict: [1]}


def round_trip(x: WireType) -> None:
    assert type(x).decode(x.header()) == x, x.describe()


def required(kind: type[WireType]) -> list[str]:
    return [f.name for f in fields(kind) if f.default is MISSING]  # type: ignore[arg-type]


def refused(kind: type[WireType], header: dict[str, Any], code: Code = Code.MALFORMED,
            *says: str) -> RequestError:
    with pytest.raises(RequestError) as caught:
        kind.decode(header)
    assert caught.value.code == code, caught.value
    for word in says:
        assert word in caught.value.message, (word, caught.value.message)
    return caught.value


def holds_to_its_fields(x: WireType, *, lenient: tuple[str, ...] = ()) -> None:
    """The round trip; each required field left out is MALFORMED naming it; each field
    of the wrong kind too (but the `lenient` ones, taken as left out)."""
    kind = type(x)
    round_trip(x)
    h = x.header()
    for name in required(kind):
        refused(kind, {k: v for k, v in h.items() if k != name}, Code.MALFORMED,
                f"missing field {name!r}")
    for f in fields(kind):  # type: ignore[arg-type]
        bad = {**h, f.name: WRONG[f.metadata["kind"]]}
        if f.name in lenient:
            kind.decode(bad)
            continue
        refused(kind, bad, Code.MALFORMED, repr(f.name))
