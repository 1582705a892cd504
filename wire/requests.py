"""One frozen, validated type per request and per answer of the wire protocol.

A request's header is a msgpack map from an untrusted peer. Its type says once which
fields it has, of what kind, which are optional (and their defaults) and how each is
checked, and `decode` turns a header into an instance or raises `RequestError` with the
code and message a malformed header has always had (MALFORMED naming the field, or the
field's own check's code, e.g. INVALID_NAME for a bad topic name). The node's doors
decode at the trust boundary and use typed values from there on; the SDK builds its
headers from the same types (`header()`), so both ends agree by construction; and
`docs/protocol.md` is generated from them (`python -m wire.requests`, held current by a
test).

The types of the ops not listed in `TYPES` yet are still described by the comments on
`wire.protocol.Op`, which the generated reference quotes for them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Self

from wire.protocol import (
    Code,
    Op,
    RequestError,
    check_request_id,
    header_field,
    is_int,
    validate_group_name,
    validate_topic_name,
)

__all__ = [
    "TYPES",
    "CommitOffsetAnswer",
    "CommitOffsetRequest",
    "FetchAnswer",
    "FetchRequest",
    "QueryOffsetAnswer",
    "QueryOffsetRequest",
    "WireType",
    "is_offset_item",
    "reference",
]

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


def _str_list(name: str) -> Check:
    def check(v: Any) -> tuple[str, ...]:
        if not all(isinstance(x, str) for x in v):
            raise RequestError(Code.MALFORMED, f"{name} must be strings")
        return tuple(v)
    return check


def is_offset_item(item: object, kind: type[list[Any]] | type[tuple[Any, ...]] = list) -> bool:
    """One committed offset, [topic, queue, offset >= 0], as a `kind`: a list as it
    travels in COMMIT_OFFSET, a tuple as the state machine's `CommitOffsets` record holds
    it (its `validate` applies this same rule)."""
    return (isinstance(item, kind) and len(item) == 3 and isinstance(item[0], str)
            and is_int(item[1]) and is_int(item[2]) and item[2] >= 0)


def _offset_items(v: Any) -> tuple[tuple[str, int, int], ...]:
    out = []
    for item in v:
        if not is_offset_item(item):
            raise RequestError(Code.MALFORMED, "offsets must be [[topic, queue, offset>=0], ...]")
        out.append((validate_topic_name(item[0]), item[1], item[2]))
    return tuple(out)


_KIND_NAMES = {int: "integer", str: "string", bool: "boolean", list: "list", dict: "map"}


class WireType:
    """What every request and answer type shares: `decode`, `header`, `describe`."""

    OP: ClassVar[Op]
    ROLE: ClassVar[str]  # "request" or "answer"

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        """The instance a header describes, each field checked in declaration order."""
        values: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            kind, check = f.metadata["kind"], f.metadata["check"]
            if f.name not in h or h[f.name] is None and f.default is None:
                if f.default is MISSING:
                    header_field(h, f.name, kind)  # raises: missing
                values[f.name] = f.default
                continue
            v = header_field(h, f.name, kind)
            values[f.name] = check(v) if check is not None else v
        return cls(**values)

    def header(self) -> dict[str, Any]:
        """The header fields to send (those left at their defaults are left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.default is not MISSING and v == f.default:
                continue
            out[f.name] = _plain(v)
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


def _plain(v: Any) -> Any:
    """A value as msgpack carries it (tuples as lists)."""
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


# ---------------------------------------------------------------------- reads


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchRequest(WireType):
    OP: ClassVar[Op] = Op.FETCH
    ROLE: ClassVar[str] = "request"
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queue: int = spec(int, "the queue id")
    offset: int = spec(int, "the first offset wanted")
    max: int = spec(int, "messages at most (the node caps it at 1,024)", default=32)
    max_bytes: int = spec(int, "record bytes at most (capped at 8 MiB)", default=1 << 20)
    wait_ms: int = spec(int, "how long the node holds the request at the end of the queue "
                        "(long polling; capped at 60 s)", default=15_000)
    tags: tuple[str, ...] = spec(list, "only messages with one of these tags (by hash; "
                                 "the exact match is the client's)", default=(),
                                 check=_str_list("tags"))
    g: str | None = spec(str, "the group the client's route names: only that group's "
                         "ready leader answers", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchAnswer(WireType):
    OP: ClassVar[Op] = Op.FETCH
    ROLE: ClassVar[str] = "answer"
    g: str = spec(str, "the group that answered")
    next: int = spec(int, "where to fetch next (past messages a tag filter skipped)")
    min: int = spec(int, "the queue's first readable offset")
    end: int = spec(int, "the queue's end offset")
    msgs: tuple[Any, ...] = spec(list, "one row per message: offset, Raft index, place "
                                 "in the body and store time; the body holds the records")


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryOffsetRequest(WireType):
    OP: ClassVar[Op] = Op.QUERY_OFFSET
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queue: int = spec(int, "the queue id")
    g: str | None = spec(str, "the group the client's route names", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryOffsetAnswer(WireType):
    OP: ClassVar[Op] = Op.QUERY_OFFSET
    ROLE: ClassVar[str] = "answer"
    offset: int = spec(int, "the committed offset (the next to consume), -1 when none")


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitOffsetRequest(WireType):
    OP: ClassVar[Op] = Op.COMMIT_OFFSET
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    offsets: tuple[tuple[str, int, int], ...] = spec(
        list, "`[topic, queue, offset]` each: the next offset to consume",
        check=_offset_items)
    req: tuple[int, int] | None = spec(
        list, "`[client id, sequence]`: a retried commit is applied once", default=None,
        check=check_request_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitOffsetAnswer(WireType):
    OP: ClassVar[Op] = Op.COMMIT_OFFSET
    ROLE: ClassVar[str] = "answer"
    dup: bool = spec(bool, "a retry whose first copy was applied already")


#: The typed ops: request type and answer type.
TYPES: dict[Op, tuple[type[WireType], type[WireType]]] = {
    Op.FETCH: (FetchRequest, FetchAnswer),
    Op.QUERY_OFFSET: (QueryOffsetRequest, QueryOffsetAnswer),
    Op.COMMIT_OFFSET: (CommitOffsetRequest, CommitOffsetAnswer),
}


def reference(op_comments: Mapping[Op, str]) -> str:
    """`docs/protocol.md`: every op, its request and answer from their types, or, for an
    op not typed yet, the comment on `Op` (`op_comments`)."""
    out = ["# The raftmq wire protocol: requests and answers", "",
           "Generated by `python -m wire.requests` from the types in `wire/requests.py`",
           "(a test holds it current); the frame format is in `wire/protocol.py`.", ""]
    for op in sorted(Op, key=int):
        out.append(f"## {op.name} ({int(op)})")
        out.append("")
        typed = TYPES.get(op)
        if typed is None:
            out.append("Not typed yet; from the comment on `Op`:")
            out.append("")
            out.append("    " + op_comments.get(op, "(no description)").replace("\n", "\n    "))
            out.append("")
            continue
        for t in typed:
            out.append(f"{t.ROLE.capitalize()}: `{t.__name__}`")
            out.append("")
            out += t.reference()
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def op_comments(source: str) -> dict[Op, str]:
    """The comment after each `NAME = n` line of `Op` in `wire/protocol.py`'s source,
    with its continuation lines."""
    out: dict[Op, str] = {}
    lines = source.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("class Op("))
    current: Op | None = None
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break
        body = line.strip()
        name, sep, rest = body.partition(" = ")
        if sep and name.isupper() and name in Op.__members__:
            current = Op[name]
            _num, _hash, comment = rest.partition("#")
            out[current] = comment.strip()
        elif body.startswith("#") and current is not None and line.startswith("    #  "):
            out[current] += " " + body.lstrip("#").strip()
        else:
            current = None if not body.startswith("#") else current
    return out


def main() -> None:
    import pathlib

    import wire.protocol

    source = pathlib.Path(wire.protocol.__file__).read_text()
    sys.stdout.write(reference(op_comments(source)))


if __name__ == "__main__":
    main()
