"""What every typed request and answer shares: fields declared once (`spec`), `decode`
from an untrusted header, `header()` to send, `describe()`, and the reference rows
`docs/protocol.md` is generated from."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, field, fields
from typing import Any, ClassVar, Self

from wire.protocol import Code, Op, RequestError, header_field

__all__ = ["Check", "WireType", "spec", "str_list"]

Check = Callable[[Any], Any]


def spec(kind: type, doc: str, *, default: Any = MISSING,
         check: Check | None = None) -> Any:
    """A field of a wire type: its msgpack kind, what it means, its default when it may
    be left out, and the check its value passes (returning it, or raising
    RequestError)."""
    meta = {"kind": kind, "doc": doc, "check": check}
    if default is MISSING:
        return field(metadata=meta)
    if isinstance(default, (list, dict)):
        raise TypeError("mutable defaults are given as tuples")
    return field(default=default, metadata=meta)


def str_list(name: str) -> Check:
    def check(v: Any) -> tuple[str, ...]:
        if not all(isinstance(x, str) for x in v):
            raise RequestError(Code.MALFORMED, f"{name} must be strings")
        return tuple(v)
    return check


_KIND_NAMES = {int: "integer", str: "string", bool: "boolean", list: "list", dict: "map",
               bytes: "binary"}


class WireType:
    """What every request and answer type shares: `decode`, `header`, `describe`."""

    OP: ClassVar[Op]
    ROLE: ClassVar[str]  # "request" or "answer"

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        """The instance a header describes, each field checked in declaration order."""
        values: dict[str, Any] = {}
        for name, kind, check, default in _plan(cls):
            if name not in h or h[name] is None and default is None:
                if default is MISSING:
                    header_field(h, name, kind)  # raises: missing
                values[name] = default
                continue
            v = header_field(h, name, kind)
            values[name] = check(v) if check is not None else v
        return cls(**values)

    def header(self) -> dict[str, Any]:
        """The header fields to send (those left at their defaults are left out)."""
        out: dict[str, Any] = {}
        for name, _kind, _check, default in _plan(type(self)):
            v = getattr(self, name)
            if default is not MISSING and v == default:
                continue
            out[name] = _plain(v)
        return out

    def describe(self) -> str:
        args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))  # type: ignore[arg-type]
        return f"{self.OP.name} {self.ROLE}({args})"

    @classmethod
    def reference(cls) -> list[str]:
        """Markdown table rows of the fields, for `docs/protocol.md`."""
        rows = ["| field | kind | | meaning |", "|---|---|---|---|"]
        for f in fields(cls):  # type: ignore[arg-type]
            need = "required" if f.default is MISSING else f"default `{_plain(f.default)!r}`"
            rows.append(f"| `{f.name}` | {_KIND_NAMES[f.metadata['kind']]} | {need} | "
                        f"{f.metadata['doc']} |")
        return rows


_Plan = tuple[tuple[str, type, Check | None, Any], ...]
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type[WireType]) -> _Plan:
    """Each field's name, kind, check and default, read once per type: every request
    a node serves is decoded with them, and `dataclasses.fields` costs more than the
    checks themselves."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = tuple((f.name, f.metadata["kind"], f.metadata["check"],
                                    f.default) for f in fields(cls))  # type: ignore[arg-type]
    return plan


def _plain(v: Any) -> Any:
    """A value as msgpack carries it (tuples as lists)."""
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v
