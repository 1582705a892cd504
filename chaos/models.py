"""Sequential models: CAS register, key/value, raftmq's queue log and consumer offsets.

Inputs are plain tuples whose first element names the operation, so the search's inner loop
does nothing but index tuples. Outputs are plain values; ``UNKNOWN`` (a timed-out call whose
result was never seen) is accepted by every operation.

Queue log (one partition per queue; state: the immutable sequence of message ids in the log,
a ``LogState`` that shares prefixes so appends and cache look-ups stay O(1))
- ``("append", queue, msg) -> offset``: legal iff ``offset == len(log)``; the message is added.
  A timed-out append (output ``UNKNOWN``, pending forever) may take effect at any point after
  its call or never.
- ``("read", queue, offset, n) -> msgs``: legal iff ``msgs == log[offset:offset + n]`` at the
  linearization point. So a read returning fewer than ``n`` messages is legal only if it
  stopped at the end of the log, and a read at or past the end must return nothing. Brokers
  that may return short batches in the middle of the log (size limits) use
  ``QueueLogModel(short_reads="prefix")``, which only requires ``msgs`` to be the first
  ``len(msgs)`` messages from ``offset``.

Consumer offsets (one partition per ``(group, queue)``): a plain register, initially ``None``.
``("commit", key, offset)`` is a write and may move the offset backwards (an operator reset is a
commit too); ``("delete", key)`` (the consumer group deleted) sets it back to ``None``;
``("read", key) -> offset`` returns the last committed value. Pass ``monotonic=True`` for a
broker that ignores commits below the current offset.

Topic configuration (one partition per topic; state: its queue count, ``None`` while it does
not exist). Each operation is one request of one attempt, and a definite refusal says what
the state was, so it is an output too:
- ``("create", topic, n) -> "ok" | "exists"``: "ok" iff the topic did not exist (now n queues);
  "exists" iff it did (unchanged);
- ``("grow", topic, n) -> "ok" | "refused"``: "ok" iff it did not exist or had at most n
  queues (now n; growing a missing topic creates it); "refused" iff it had more;
- ``("delete", topic) -> "ok" | "missing"``: "ok" iff it existed, "missing" iff not; then
  it does not exist;
- ``("read", topic) -> n | None``.
An operation of unknown outcome takes the effect its "ok" would have, or none.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from .model import INFINITY, UNKNOWN, Model, Operation

__all__ = [
    "MODELS",
    "CasRegisterModel",
    "ConsumerOffsetModel",
    "KeyValueModel",
    "LogState",
    "QueueLogModel",
    "TopicConfigModel",
    "drop_unobserved_commits",
    "drop_unseen_appends",
    "make_model",
    "pin_read_appends",
    "quiescent_segments",
]

READ = "read"
WRITE = "write"
CAS = "cas"
GET = "get"
PUT = "put"
APPEND = "append"
COMMIT = "commit"
DELETE = "delete"
CREATE = "create"
GROW = "grow"


class _Unseen:
    """Stand-in for a message id that no read in the partition returned."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unread>"


UNSEEN = _Unseen()


def _show(value: Any) -> str:
    if value is UNKNOWN:
        return "?"
    if value is None:
        return "nil"
    return repr(value) if isinstance(value, str) else str(value)


class CasRegisterModel(Model[Any, tuple, Any]):
    """A single register starting at ``None`` (Jepsen's etcd test).

    Inputs ``("read",)``, ``("write", v)``, ``("cas", old, new)``; outputs: the value read,
    anything for a write, ``True``/``False`` for whether the cas applied.
    """

    name = "cas-register"

    def init(self) -> Any:
        return None

    def step(self, state: Any, input: tuple, output: Any) -> tuple[bool, Any]:
        op = input[0]
        if op == READ:
            return (output is UNKNOWN or output == state), state
        if op == WRITE:
            return True, input[1]
        if state == input[1]:
            return (output is UNKNOWN or output is True), input[2]
        return (output is UNKNOWN or output is False), state

    def is_read_only(self, input: tuple, output: Any) -> bool:
        # a cas known to have failed leaves the register as it was
        return input[0] == READ or (input[0] == CAS and output is False)

    def always_legal(self, input: tuple, output: Any) -> bool:
        return output is UNKNOWN or input[0] == WRITE

    def describe_operation(self, input: tuple, output: Any) -> str:
        op = input[0]
        if op == READ:
            return f"read() -> {_show(output)}"
        if op == WRITE:
            return f"write({_show(input[1])})"
        result = "?" if output is UNKNOWN else ("ok" if output else "fail")
        return f"cas({_show(input[1])}, {_show(input[2])}) -> {result}"

    def describe_state(self, state: Any) -> str:
        return _show(state)

    def explain(self, state: Any, input: tuple, output: Any) -> str:
        return f"the register holds {_show(state)}"


class KeyValueModel(Model[Any, tuple, Any]):
    """Strings per key: ``("get", k)``, ``("put", k, v)``, ``("append", k, v)``; missing is "".

    Partitioned by key by default; ``partitioned=False`` checks the whole map as one state (a
    sorted tuple of items), which is slower but does not rely on P-compositionality.
    """

    name = "kv"

    def __init__(self, partitioned: bool = True) -> None:
        self.partitioned = partitioned

    def init(self) -> Any:
        return "" if self.partitioned else ()

    def step(self, state: Any, input: tuple, output: Any) -> tuple[bool, Any]:
        if not self.partitioned:
            return self._step_map(state, input, output)
        op = input[0]
        if op == GET:
            return (output is UNKNOWN or output == state), state
        if op == PUT:
            return True, input[2]
        return True, state + input[2]

    def _step_map(self, state: tuple, input: tuple, output: Any) -> tuple[bool, tuple]:
        items = dict(state)
        op, key = input[0], input[1]
        current = items.get(key, "")
        if op == GET:
            return (output is UNKNOWN or output == current), state
        items[key] = input[2] if op == PUT else current + input[2]
        return True, tuple(sorted(items.items()))

    def partition_key(self, input: tuple) -> Hashable:
        return input[1] if self.partitioned else None

    def is_read_only(self, input: tuple, output: Any) -> bool:
        return input[0] == GET

    def always_legal(self, input: tuple, output: Any) -> bool:
        return output is UNKNOWN or input[0] in (PUT, APPEND)

    def describe_operation(self, input: tuple, output: Any) -> str:
        op, key = input[0], input[1]
        if op == GET:
            return f"get({key!r}) -> {_show(output)}"
        return f"{op}({key!r}, {_show(input[2])})"

    def explain(self, state: Any, input: tuple, output: Any) -> str:
        value = state if self.partitioned else dict(state).get(input[1], "")
        return f"key {input[1]!r} holds {value!r}"

    def describe_state(self, state: Any) -> str:
        if self.partitioned:
            return repr(state)
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in state) + "}"


class LogState:
    """Immutable log of message ids: a persistent list that shares its prefix.

    Reads see it as a sequence (``len``, indexing and slicing give tuples). Appending is O(1)
    and the hash is computed incrementally, so the search cache holds one small node per
    state instead of a copy of the whole log, and looks states up in constant time. A
    jump pointer per node (Myers' applicative random-access stack) finds the node at any
    offset in O(log n) steps, so a read far below the tail (a re-read, the final drain)
    does not walk the whole log.
    """

    __slots__ = ("prev", "last", "size", "_hash", "jump")

    def __init__(self, prev: LogState | None = None, last: Any = None) -> None:
        self.prev = prev
        self.last = last
        if prev is None:
            self.size = 0
            self._hash = hash(())
            self.jump: LogState | None = None
        else:
            self.size = prev.size + 1
            self._hash = hash((prev._hash, last))
            a = prev.jump
            b = a.jump if a is not None else None
            if a is not None and b is not None and prev.size - a.size == a.size - b.size:
                self.jump = b
            else:
                self.jump = prev

    @classmethod
    def of(cls, messages: Sequence[Any]) -> LogState:
        """The log holding `messages` in order."""
        state = EMPTY_LOG
        for m in messages:
            state = cls(state, m)
        return state

    def _node(self, size: int) -> LogState:
        """The ancestor holding the first `size` messages (0 <= size <= self.size)."""
        node: Any = self
        while node.size > size:
            jump = node.jump
            node = jump if jump is not None and jump.size >= size else node.prev
        return node

    def append(self, message: Any) -> LogState:
        return LogState(self, message)

    def __len__(self) -> int:
        return self.size

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, LogState) or self.size != other.size or self._hash != other._hash:
            return False
        a: LogState | None = self
        b: LogState | None = other
        while a is not b and a is not None and b is not None:
            if a.last != b.last:
                return False
            a, b = a.prev, b.prev
        return True

    def window(self, start: int, stop: int) -> tuple:
        """Messages at offsets ``start <= offset < stop`` (clamped to the log)."""
        stop = min(stop, self.size)
        start = max(start, 0)
        if start >= stop:
            return ()
        node: Any = self._node(stop)
        out = []
        for _ in range(stop - start):
            out.append(node.last)
            node = node.prev
        out.reverse()
        return tuple(out)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, stride = index.indices(self.size)
            if stride != 1:
                return tuple(self)[index]
            return self.window(start, stop)
        if index < 0:
            index += self.size
        if not 0 <= index < self.size:
            raise IndexError("log offset out of range")
        return self.window(index, index + 1)[0]

    def __iter__(self) -> Any:
        return iter(self.window(0, self.size))

    def __repr__(self) -> str:
        return f"LogState({self.window(0, self.size)!r})"


EMPTY_LOG = LogState()


class QueueLogModel(Model[LogState, tuple, Any]):
    """Per-queue append-only log; see the module docstring for the exact rules."""

    name = "queue-log"

    def __init__(self, short_reads: str = "end", initial: LogState | None = None) -> None:
        if short_reads not in ("end", "prefix"):
            raise ValueError("short_reads must be 'end' or 'prefix'")
        self.strict = short_reads == "end"
        self.initial = EMPTY_LOG if initial is None else initial
        """The log before the history starts: empty, or what earlier segments of a split
        history left (`quiescent_segments`)."""

    def init(self) -> LogState:
        return self.initial

    def step(self, state: LogState, input: tuple, output: Any) -> tuple[bool, LogState]:
        if input[0] == APPEND:
            if output is UNKNOWN or output == state.size:
                return True, LogState(state, input[2])
            return False, state
        if output is UNKNOWN:
            return True, state
        offset = input[2]
        if not isinstance(output, tuple) or offset < 0:
            return False, state
        k = len(output)
        if self.strict:
            # exactly the slice [offset, offset + n): full, or cut short by the end of the log
            if k != max(0, min(input[3], state.size - offset)):
                return False, state
        elif k > input[3]:
            return False, state
        return (k == 0 or output == state.window(offset, offset + k)), state

    def doomed(self, state: LogState, input: tuple, output: Any) -> bool:
        # the log only grows and its prefix never changes
        size = state.size
        if output is UNKNOWN:
            return False
        if input[0] == APPEND:
            return not isinstance(output, int) or output < size
        offset = input[2]
        if not isinstance(output, tuple) or offset < 0:
            return True
        k = len(output)
        if size >= offset + k:
            return True  # everything the read returned is already fixed, and it did not fit
        present = max(0, size - offset)
        return present > 0 and output[:present] != state.window(offset, size)

    def partition_key(self, input: tuple) -> Hashable:
        return input[1]

    def prepare(self, history: Sequence[Operation]) -> list[tuple]:
        """Replace ids of messages no read returned by one placeholder.

        Reads compare message ids, so an id nobody read only matters through the offset it
        occupies. Erasing it makes logs that differ only in such ids equal in the search
        cache, and makes timed-out appends of unread messages interchangeable, which keeps
        the search from trying every order of them.
        """
        seen: set[object] = set()
        for op in history:
            if op.input[0] == READ and isinstance(op.output, tuple):
                seen.update(op.output)
        return [
            ("append", op.input[1], UNSEEN)
            if op.input[0] == APPEND and op.input[2] not in seen
            else op.input
            for op in history
        ]

    def is_read_only(self, input: tuple, output: Any) -> bool:
        return input[0] == READ

    def always_legal(self, input: tuple, output: Any) -> bool:
        return output is UNKNOWN

    def describe_operation(self, input: tuple, output: Any) -> str:
        if input[0] == APPEND:
            return f"append({_show(input[1])}, {_show(input[2])}) -> {_show(output)}"
        if isinstance(output, tuple):
            shown = "[" + ", ".join(_show(m) for m in output) + "]"
        else:
            shown = _show(output)
        return f"read({_show(input[1])}, @{input[2]}, n={input[3]}) -> {shown}"

    def explain(self, state: LogState, input: tuple, output: Any) -> str:
        size = state.size
        if input[0] == APPEND:
            return f"the log holds {size} message(s), so an append now gets offset {size}"
        offset, n = input[2], input[3]
        window = ", ".join(_show(m) for m in state.window(offset, offset + n))
        return f"the log holds {size} message(s); [{offset}, {offset + n}) is [{window}]"

    def describe_state(self, state: LogState) -> str:
        size = len(state)
        if size > 12:
            head = ", ".join(_show(m) for m in state.window(0, 4))
            tail = ", ".join(_show(m) for m in state.window(size - 4, size))
            return f"[{head}, ... {size - 8} more ..., {tail}] (len {size})"
        return "[" + ", ".join(_show(m) for m in state) + "]"


def pin_read_appends(ops: Sequence[Operation]) -> list[Operation]:
    """Give an unknown-outcome append the offset the reads prove it took.

    When every offset where reads saw message m but no acknowledged append of m landed
    comes down to one offset X, and exactly one append of m has an unknown outcome, that
    append must have happened while the log had X entries: no other operation can put m
    at X. Saying so (output X, still pending forever) leaves the set of valid
    linearizations unchanged, but the search no longer tries the append at every point
    before a read pins it, which is what explodes on chaos histories with recovered
    appends and at-least-once duplicates.

    The same holds for k > 1 copies: when reads saw m at exactly k offsets X1 < ... < Xk
    that no acknowledged append of m took, and m has exactly k appends of unknown
    outcome, all pending forever, then each Xi needs one of them, so all k take effect,
    one per offset. Pending appends with one input and output are interchangeable (a
    linearization that has a later-called one take effect first stays valid with the two
    swapped), so some linearization has them take effect in call order, at ascending
    offsets: the i-th called is pinned to Xi. A producer that retried a send after
    timeouts leaves such copies, each an append of unknown outcome (`queue_operations`);
    unpinned, the search tried every order of every retried message's copies at every
    point between their sends and the read that saw them.
    """
    seen: dict[tuple[Hashable, Any], set[int]] = {}
    acked: dict[tuple[Hashable, Any], set[int]] = {}
    unknown: dict[tuple[Hashable, Any], list[int]] = {}
    for i, op in enumerate(ops):
        kind, key = op.input[0], op.input[1]
        if kind == READ and isinstance(op.output, tuple):
            for k, msg in enumerate(op.output):
                seen.setdefault((key, msg), set()).add(op.input[2] + k)
        elif kind == APPEND:
            slot = (key, op.input[2])
            if op.output is UNKNOWN:
                unknown.setdefault(slot, []).append(i)
            elif isinstance(op.output, int):
                acked.setdefault(slot, set()).add(op.output)
    out = list(ops)
    for slot, indexes in unknown.items():
        left = sorted(seen.get(slot, set()) - acked.get(slot, set()))
        if len(indexes) != len(left) or (
            len(indexes) > 1 and not all(ops[i].pending for i in indexes)
        ):
            continue
        for i, offset in zip(sorted(indexes, key=lambda i: ops[i].call), left, strict=True):
            op = ops[i]
            out[i] = Operation(op.client_id, op.input, op.call, offset, op.return_)
    return out


def quiescent_segments(ops: Sequence[Operation]) -> list[tuple[LogState, list[Operation]]]:
    """Split one queue's operations at quiescent points into segments checkable one by one,
    each from the log the previous ones must have left: (initial log, operations) pairs.

    A cut at time t (a call time; operations called before t go before it) is made only
    where the log at t is known, namely when

    1. every operation called before t returned before t, except reads of unknown outcome
       (the search drops them) and appends of unknown outcome pinned to an offset
       (`pin_read_appends`);
    2. no append called before t has an unknown offset: neither a timed-out one nobody
       pinned, nor one acknowledged without an offset;
    3. the offsets of the appends called before t are exactly 0..L-1, each once, and the
       one at L-1 returned (so it is not one of the pinned ones of rule 1).

    Then H is linearizable iff H1 (before t, from the current log) and H2 (from the log S
    of the messages at offsets 0..L-1) both are. Only if: a linearization of H puts every
    finite operation within its call and return, so each finite operation of H1 before
    every operation of H2 (called at or after t); a pinned append of H1 at offset X < L-1
    precedes the append at L-1 (logs only grow), which returned before t, so it precedes H2
    too; reads of unknown outcome constrain nothing. So H's linearization is one of H1
    followed by one of H2, and after H1 the log holds exactly its appends, at their
    offsets 0..L-1 (rule 2 leaves no other append in H1): S. If: a linearization of H1
    (ending in S) followed by one of H2 (from S) is a legal sequence, and it respects real
    time, since no operation of H2 returned before an operation of H1 was called. A queue
    whose history has a rule-2 append (typically a queue that was not drained) is cut
    only before the first one. Each segment is searched alone, so the search's memory
    follows the longest busy stretch of the queue, not the run.
    """
    order = sorted(ops, key=lambda op: op.call)
    out: list[tuple[LogState, list[Operation]]] = []
    state = EMPTY_LOG
    current: list[Operation] = []
    horizon = -INFINITY  # latest return among operations so far (finite, or pinned appends)
    placed: dict[int, Any] = {}  # offset -> message of appends so far
    top = -1  # highest offset of an append so far
    last_finite = -1  # highest offset of an append that returned
    duplicate = False
    blocked = False
    for op in order:
        if (current and not blocked and not duplicate and horizon < op.call
                and len(placed) == top + 1 and top == last_finite):
            out.append((state, current))
            for offset in range(state.size, len(placed)):
                state = state.append(placed[offset])
            current = []
        current.append(op)
        kind, output = op.input[0], op.output
        if kind == APPEND:
            if not isinstance(output, int) or isinstance(output, bool) or output < 0:
                blocked = True  # rule 2, for the rest of the queue
                continue
            if output in placed:
                duplicate = True  # the search decides; no more cuts
            placed[output] = op.input[2]
            top = max(top, output)
            if op.pending:
                continue
            last_finite = max(last_finite, output)
        elif op.pending:
            continue  # a read of unknown outcome
        horizon = max(horizon, op.return_)
    if current or not out:
        out.append((state, current))
    return out


def drop_unseen_appends(ops: Sequence[Operation]) -> list[Operation]:
    """Leave out unknown-outcome appends that no read saw, when the reads cover the log.

    Per queue, let E be one past the highest offset any acknowledged append, pinned
    append or read names. When reads returned a message at every offset below E, an
    unknown-outcome append u whose message no read returned can take effect last, after
    every other operation, where it changes nothing anyone saw; so dropping it keeps the
    verdict. Why: in any linearization u lands at some offset Y. Y < E is impossible, since
    a read returned another message at Y, and Y was filled either before u (then u cannot
    land there) or by u (then that read, coming later, would have returned u). So Y >= E,
    and every operation after u is an append without a known offset (acknowledged and
    pinned ones lie below E) or a read that returned nothing at or past Y: a read covering
    offset Y would have returned u, a short read would have had to end at Y + 1 or later.
    Removing u therefore invalidates nothing after it, and u can go last instead, where an
    append of unknown outcome is always legal. Conversely, a linearization without u
    extends with u last. Without this, each such append (typically a timed-out send that
    never reached the log) stays at the front of the search's entry list until the very
    end, and every configuration walks past all of them: search time grew with the
    number of timeouts times the history's length. A queue whose reads leave a hole (not
    drained) keeps all its appends.
    """
    seen: dict[Hashable, set[Any]] = {}
    covered: dict[Hashable, set[int]] = {}
    top: dict[Hashable, int] = {}
    for op in ops:
        kind, key = op.input[0], op.input[1]
        if kind == READ and isinstance(op.output, tuple):
            start = op.input[2]
            seen.setdefault(key, set()).update(op.output)
            covered.setdefault(key, set()).update(range(start, start + len(op.output)))
            if op.output:
                top[key] = max(top.get(key, 0), start + len(op.output))
        elif kind == APPEND and isinstance(op.output, int):
            top[key] = max(top.get(key, 0), op.output + 1)
    full = {key for key, end in top.items() if len(covered.get(key, ())) >= end}
    full |= {op.input[1] for op in ops} - set(top)  # nothing placed at all
    return [
        op for op in ops
        if not (
            op.input[0] == APPEND and op.pending and op.output is UNKNOWN
            and op.input[1] in full and op.input[2] not in seen.get(op.input[1], ())
        )
    ]


class ConsumerOffsetModel(Model[Any, tuple, Any]):
    """Committed consumer offset per ``(group, queue)``: a register (see module docstring)."""

    name = "consumer-offset"

    def __init__(self, monotonic: bool = False) -> None:
        self.monotonic = monotonic

    def init(self) -> Any:
        return None

    def step(self, state: Any, input: tuple, output: Any) -> tuple[bool, Any]:
        if input[0] == COMMIT:
            offset = input[2]
            if self.monotonic and state is not None and offset < state:
                return True, state
            return True, offset
        if input[0] == DELETE:
            return True, None
        return (output is UNKNOWN or output == state), state

    def partition_key(self, input: tuple) -> Hashable:
        return input[1]

    def is_read_only(self, input: tuple, output: Any) -> bool:
        return input[0] == READ

    def always_legal(self, input: tuple, output: Any) -> bool:
        return input[0] in (COMMIT, DELETE) or output is UNKNOWN

    def describe_operation(self, input: tuple, output: Any) -> str:
        if input[0] == COMMIT:
            return f"commit({_show(input[1])}, {input[2]})"
        if input[0] == DELETE:
            return f"delete({_show(input[1])})"
        return f"read({_show(input[1])}) -> {_show(output)}"

    def describe_state(self, state: Any) -> str:
        return _show(state)

    def explain(self, state: Any, input: tuple, output: Any) -> str:
        return f"the committed offset is {_show(state)}"


class TopicConfigModel(Model[Any, tuple, Any]):
    """A topic's queue count, ``None`` while it does not exist (see module docstring)."""

    name = "topic-config"

    def init(self) -> Any:
        return None

    def step(self, state: Any, input: tuple, output: Any) -> tuple[bool, Any]:
        op = input[0]
        if op == READ:
            return (output is UNKNOWN or output == state), state
        if op == CREATE:
            took = state is None
            if output is UNKNOWN:
                return True, input[2] if took else state
            return (output == ("ok" if took else "exists")), input[2] if took else state
        if op == GROW:
            took = state is None or state <= input[2]
            if output is UNKNOWN:
                return True, input[2] if took else state
            return (output == ("ok" if took else "refused")), input[2] if took else state
        if op == DELETE:
            if output is UNKNOWN:
                return True, None
            return (output == ("missing" if state is None else "ok")), None
        return False, state

    def partition_key(self, input: tuple) -> Hashable:
        return input[1]

    def is_read_only(self, input: tuple, output: Any) -> bool:
        return input[0] == READ

    def always_legal(self, input: tuple, output: Any) -> bool:
        return output is UNKNOWN and input[0] in (READ, CREATE, GROW, DELETE)

    def describe_operation(self, input: tuple, output: Any) -> str:
        args = ", ".join(_show(a) for a in input[1:])
        return f"{input[0]}({args}) -> {_show(output)}"

    def describe_state(self, state: Any) -> str:
        return "absent" if state is None else f"{state} queues"

    def explain(self, state: Any, input: tuple, output: Any) -> str:
        return f"the topic is {self.describe_state(state)}"


def drop_unobserved_commits(ops: Sequence[Operation]) -> list[Operation]:
    """Leave out commits of unknown outcome whose offset no read returned.

    Such a commit can always take effect last, after every read, where it changes nothing
    anyone saw; and wherever else a linearization puts it, no read sees its value, so
    the same order without it is valid too. Dropping it keeps the verdict and spares the
    search from trying it at every point (consumer offsets are unique per commit, so a
    read names the commit it saw).
    """
    observed = {
        (op.input[1], op.output)
        for op in ops
        if op.input[0] == READ and op.output is not UNKNOWN
    }
    return [
        op for op in ops
        if not (op.input[0] == COMMIT and op.pending and (op.input[1], op.input[2]) not in observed)
    ]


MODELS: dict[str, Callable[[], Model]] = {
    "cas-register": CasRegisterModel,
    "kv": KeyValueModel,
    "queue-log": QueueLogModel,
    "consumer-offset": ConsumerOffsetModel,
    "topic-config": TopicConfigModel,
}


def make_model(name: str) -> Model:
    """Model by its CLI name."""
    try:
        return MODELS[name]()
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None
