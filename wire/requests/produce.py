"""PRODUCE: a producer's batches for one group, stored as one entry of its log.

The body's format (batches back to back, each as `wire.records` frames it) and each
batch's outcome in a multi-batch answer are `wire.produce`'s; these types are the
header around them. PRODUCE is the hot path, so both types decode and encode by hand
(the same fields, checks and codes as the generic `WireType` code, which a test holds
them to) rather than walking their dataclass fields on every request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from wire.produce import check_sizes
from wire.protocol import Op
from wire.requests.base import WireType, spec

__all__ = ["ProduceAnswer", "ProduceRequest"]

_decode = WireType.decode.__func__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequest(WireType):
    """The body is one batch (`sizes` left out: the single-batch form every node takes),
    or `len(sizes)` batches back to back (`wire.produce`)."""

    OP: ClassVar[Op] = Op.PRODUCE
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group (its leader answers); every batch's queue is one it "
                  "hosts")
    sizes: tuple[int, ...] = spec(list, "the byte size of each batch in the body, 1 to "
                                  "4,096 of them (the multi-batch form)", default=(),
                                  check=check_sizes)

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        g = h.get("g")
        if type(g) is str:
            if "sizes" not in h:
                return cls(g=g)
            sizes = h["sizes"]
            if type(sizes) is list:
                return cls(g=g, sizes=check_sizes(sizes))
        return _decode(cls, h)  # type: ignore[no-any-return]  # refuses, naming the field

    def header(self) -> dict[str, Any]:
        if self.sizes:
            return {"g": self.g, "sizes": list(self.sizes)}
        return {"g": self.g}


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceAnswer(WireType):
    """The single-batch form's outcome (`base` ... `shift`), or the multi-batch form's
    `results`; a single batch refused is the request's error."""

    OP: ClassVar[Op] = Op.PRODUCE
    ROLE: ClassVar[str] = "answer"
    base: int | None = spec(int, "single batch: the offset of its first message (-1 when "
                            "acknowledged before the commit, a test mutation)",
                            default=None)
    n: int | None = spec(int, "single batch: its messages", default=None)
    index: int | None = spec(int, "single batch: the Raft index of the entry holding it "
                             "(message ids name it)", default=None)
    dup: bool | None = spec(bool, "single batch: a retry stored before (an idempotent "
                            "producer's sequence): the first copy's outcome",
                            default=None)
    shift: int | None = spec(int, "single batch: how far beyond the entry's first batch "
                             "it sits, to add to the record positions (0 when left out: "
                             "older nodes)", default=None)
    results: tuple[list[Any], ...] | None = spec(
        list, "multi-batch: an outcome per batch, in request order: `[0, base, n, index, "
        "dup, shift]` stored, or `[code, message, extra]` refused (`wire.produce`)",
        default=None, check=tuple)

    def header(self) -> dict[str, Any]:
        base, n, index, dup, shift = self.base, self.n, self.index, self.dup, self.shift
        if (self.results is None and base is not None and n is not None and index is not None
                and dup is not None and shift is not None):  # a stored batch: every time
            return {"base": base, "n": n, "index": index, "dup": dup, "shift": shift}
        out: dict[str, Any] = {name: v for name, v in (
            ("base", base), ("n", n), ("index", index), ("dup", dup), ("shift", shift))
            if v is not None}
        if self.results is not None:
            out["results"] = list(self.results)
        return out
