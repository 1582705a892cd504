"""The multi-batch PRODUCE request: many producer batches of one group in one request.

A producer spreading messages over thousands of queues has one small batch per queue at
a time; sent one request (and one Raft round) each, they cost the client, the leader and
every follower far more than the messages themselves. So, as Kafka's produce request
does, one request carries batches for many queues of one group, and the leader proposes
them together: one Ready, one fsync and one AppendEntries per follower for them all.

    request   header {op: PRODUCE, g: group, sizes: [bytes of batch 0, 1, ...]}
              body   the batches back to back, each exactly as `wire.records` frames it
    answer    header {results: [outcome 0, 1, ...]}, in request order, where an outcome is
              [0, base, n, index, dup, shift]    the batch is stored (or was a duplicate)
              [code, message, extra]             it is not, for this reason (`Code`);
                                                 `extra` holds e.g. `unknown`: True when it
                                                 may still be stored, and a `leader` hint

The leader stores the batches it accepts as one MESSAGES entry (`wire.records`), so
their messages' ids share the entry's index; `shift` is how far beyond the place of the
entry's first batch the batch sits (0 for that one, and when not given: older nodes),
to add to the record positions `encode_batch` gives. The single-batch answer carries it
as a field.

Each batch stands alone: a refused batch (malformed, unknown queue, out of sequence...)
is not stored and does not fail the others. A request without `sizes` is the older
single-batch form (the body is one batch; the answer's header is the outcome itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wire.protocol import Code, RequestError

__all__ = [
    "MAX_BATCHES",
    "check_sizes",
    "cut_batches",
    "decode_outcome",
    "encode_error",
    "encode_ok",
    "split_batches",
]

MAX_BATCHES = 4096  # batches in one request: bounds the answer and one proposal


def check_sizes(sizes: object) -> tuple[int, ...]:
    """A multi-batch request's `sizes`: 1..`MAX_BATCHES` positive batch sizes, or
    MALFORMED (for the whole request, nothing done)."""
    if not isinstance(sizes, list) or not 1 <= len(sizes) <= MAX_BATCHES:
        raise RequestError(Code.MALFORMED, f"field 'sizes' must list 1..{MAX_BATCHES} batch sizes")
    for s in sizes:
        if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
            raise RequestError(Code.MALFORMED, f"batch size {s!r} is not a positive integer")
    return tuple(sizes)


def cut_batches(sizes: Sequence[int], body: bytes) -> list[memoryview]:
    """The batches of a multi-batch request body (views, no copies), by sizes already
    checked (`check_sizes`); MALFORMED when they do not add up to the body."""
    mv = memoryview(body)
    out: list[memoryview] = []
    pos = 0
    for s in sizes:
        out.append(mv[pos : pos + s])
        pos += s
    if pos != len(mv):
        raise RequestError(
            Code.MALFORMED, f"batch sizes add up to {pos} bytes, the body has {len(mv)}"
        )
    return out


def split_batches(sizes: object, body: bytes) -> list[memoryview]:
    """The batches of a multi-batch request body (views, no copies); MALFORMED (for the
    whole request, nothing done) when `sizes` is not a list of positive sizes adding up
    to the body."""
    return cut_batches(check_sizes(sizes), body)


def encode_ok(base: int, n: int, index: int, dup: bool, shift: int = 0) -> list[Any]:
    """The outcome of a stored (or deduplicated) batch."""
    return [0, base, n, index, dup, shift]


def encode_error(exc: RequestError) -> list[Any]:
    """The outcome of a batch that was refused or whose fate is unknown."""
    return [int(exc.code), exc.message, dict(exc.extra)]


def decode_outcome(outcome: object) -> dict[str, Any]:
    """One batch's outcome as the single-batch answer's fields ({base, n, index, dup,
    shift}, shift 0 when not given); raises the batch's own error as `RequestError` (with
    its extra fields), and MALFORMED for an outcome that is not one of ours."""
    if isinstance(outcome, Sequence) and not isinstance(outcome, (str, bytes)) and outcome:
        code = outcome[0]
        if code == 0 and len(outcome) in (5, 6):
            return {"base": outcome[1], "n": outcome[2], "index": outcome[3], "dup": outcome[4],
                    "shift": outcome[5] if len(outcome) == 6 else 0}
        if isinstance(code, int) and code > 0 and len(outcome) == 3:
            try:
                c = Code(code)
            except ValueError:
                c = Code.INTERNAL
            extra = outcome[2] if isinstance(outcome[2], dict) else {}
            fields = {str(k): v for k, v in extra.items() if k not in ("code", "message")}
            raise RequestError(c, str(outcome[1]), **fields)
    raise RequestError(Code.MALFORMED, f"bad PRODUCE outcome {outcome!r}")
