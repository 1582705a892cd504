"""History parsers: Jepsen logs, EDN key/value logs and JSON lines."""

from __future__ import annotations

import json

import pytest

from chaos.histories import (
    Keyword,
    load_operations,
    parse_edn,
    parse_edn_kv,
    parse_faults,
    parse_jepsen_log,
    parse_jsonl,
    records_to_operations,
)
from chaos.linearizability import CheckResult, check_operations
from chaos.model import INFINITY, UNKNOWN, EventKind, events_to_operations
from chaos.models import CasRegisterModel, QueueLogModel


def _jepsen(*lines: str) -> list[str]:
    return [f"INFO  jepsen.util - {line}" for line in lines]


def test_jepsen_log_matching_and_outcomes() -> None:
    events = parse_jepsen_log(
        _jepsen(
            "0\t:invoke\t:write\t1",
            "1\t:invoke\t:cas\t[1 2]",
            "0\t:ok\t:write\t1",
            "2\t:invoke\t:read\tnil",
            "1\t:fail\t:cas\t[1 2]",
            "2\t:fail\t:read\t:timed-out",
            "3\t:invoke\t:write\t4",
            "3\t:info\t:write\t:timed-out",
            "4   :invoke   :read   nil",
            "4   :ok   :read   1",
        )
    )
    ops = events_to_operations(events)
    by_input = {op.input: op for op in ops}
    assert by_input[("write", 1)].output is None
    assert by_input[("cas", 1, 2)].output is False
    assert by_input[("write", 4)].output is UNKNOWN and by_input[("write", 4)].return_ == INFINITY
    reads = [op for op in ops if op.input == ("read",)]
    assert [r.output for r in reads] == [UNKNOWN, 1]
    assert check_operations(CasRegisterModel(), ops).result is CheckResult.OK


def test_jepsen_fail_write_is_dropped_and_errors_name_the_line() -> None:
    events = parse_jepsen_log(_jepsen("0 :invoke :write 3", "0 :fail :write 3"))
    assert events == []
    with pytest.raises(ValueError, match="line 1"):
        parse_jepsen_log(_jepsen("0 :ok :read 3"))
    with pytest.raises(ValueError, match="line 1"):
        parse_jepsen_log(["garbage"])


def test_edn_parser() -> None:
    value = parse_edn(
        '{:process 3, :type :ok, :f :get, :key "k, \\"q\\"", :value [1 -2 3.5 nil true]}'
    )
    assert value == {
        "process": 3,
        "type": "ok",
        "f": "get",
        "key": 'k, "q"',
        "value": [1, -2, 3.5, None, True],
    }
    assert isinstance(value["type"], Keyword) and repr(value["type"]) == ":ok"
    with pytest.raises(ValueError):
        parse_edn("{:a 1")
    with pytest.raises(ValueError):
        parse_edn("{:a}")


def test_edn_kv_events() -> None:
    events = parse_edn_kv(
        [
            '{:process 0, :type :invoke, :f :put, :key "a", :value "x"}',
            '{:process 1, :type :invoke, :f :get, :key "a", :value nil}',
            '{:process 0, :type :ok, :f :put, :key "a", :value "x"}',
            '{:process 1, :type :ok, :f :get, :key "a", :value "x"}',
            '{:process 2, :type :invoke, :f :append, :key "a", :value "y"}',
            '{:process 2, :type :fail, :f :append, :key "a", :value "y"}',
        ]
    )
    assert [e.kind for e in events] == [
        EventKind.CALL,
        EventKind.CALL,
        EventKind.RETURN,
        EventKind.RETURN,
    ]
    assert events[1].value == ("get", "a") and events[3].value == "x"


def _jsonl(*entries: dict) -> list[str]:
    return [json.dumps(e) for e in entries]


def test_jsonl_records_and_queue_operations() -> None:
    lines = _jsonl(
        {"process": 0, "type": "invoke", "f": "append", "key": "q", "value": "a", "time": 1.0},
        {"process": 1, "type": "invoke", "f": "append", "key": "q", "value": "b", "time": 1.5},
        {
            "process": 0,
            "type": "ok",
            "f": "append",
            "key": "q",
            "value": {"offset": 0},
            "time": 2.0,
        },
        {"process": 1, "type": "info", "f": "append", "key": "q", "value": None, "time": 3.0},
        {"process": 2, "type": "invoke", "f": "append", "key": "q", "value": "c", "time": 3.0},
        {"process": 2, "type": "fail", "f": "append", "key": "q", "value": None, "time": 3.5},
        {
            "process": 3,
            "type": "invoke",
            "f": "read",
            "key": "q",
            "value": {"offset": 0, "n": 8},
            "time": 4.0,
        },
        {"process": 3, "type": "ok", "f": "read", "key": "q", "value": ["a", "b"], "time": 5.0},
        {"process": 4, "type": "invoke", "f": "append", "key": "q", "value": "d", "time": 6.0},
    )
    records = parse_jsonl(lines)
    assert [(r.f, r.status) for r in records] == [
        ("append", "ok"),
        ("append", "info"),
        ("append", "fail"),
        ("read", "ok"),
        ("append", "info"),
    ]
    assert records[1].return_ == INFINITY
    ops = records_to_operations(records, "queue-log")
    assert len(ops) == 4  # the failed append is dropped
    assert ops[0].output == 0 and ops[1].output is UNKNOWN
    assert ops[2].input == ("read", "q", 0, 8) and ops[2].output == ("a", "b")
    assert check_operations(QueueLogModel(), ops).result is CheckResult.OK


def test_jsonl_errors_and_other_models() -> None:
    with pytest.raises(ValueError, match="line 1"):
        parse_jsonl(['{"process": 0, "type": "ok", "f": "read"}'])
    with pytest.raises(ValueError, match="line 2"):
        parse_jsonl(['{"process": 0, "type": "invoke", "f": "read"}', "{nope"])
    records = parse_jsonl(
        _jsonl(
            {"process": 0, "type": "invoke", "f": "cas", "value": [None, 1], "time": 0},
            {"process": 0, "type": "ok", "f": "cas", "value": False, "time": 1},
            {"process": 1, "type": "invoke", "f": "commit", "key": ["g", 0], "value": 5, "time": 0},
            {"process": 1, "type": "ok", "f": "commit", "key": ["g", 0], "time": 1},
        )
    )
    assert records_to_operations(records[:1], "cas-register")[0].output is False
    assert records_to_operations(records[1:], "consumer-offset")[0].input == ("commit", ("g", 0), 5)
    with pytest.raises(ValueError):
        records_to_operations(records[:1], "queue-log")


def test_load_operations_rejects_mismatched_format(tmp_path) -> None:
    path = tmp_path / "h.log"
    path.write_text("")
    with pytest.raises(ValueError):
        load_operations(path, "jepsen-log", "kv")
    with pytest.raises(ValueError):
        load_operations(path, "csv", "kv")


def test_nemesis_lines_are_faults_not_operations() -> None:
    lines = [
        '{"process": 0, "type": "invoke", "f": "append", "key": "q", "value": "a", "time": 1}',
        '{"process": "nemesis", "type": "invoke", "f": "kill", "value": {"nodes": [2]}, "time": 1.5}',
        '{"process": 0, "type": "ok", "f": "append", "key": "q", "value": {"offset": 0}, "time": 2}',
        '{"process": "nemesis", "type": "invoke", "f": "pause", "value": {"nodes": [1]}, "time": 2.5}',
        '{"process": "nemesis", "type": "info", "f": "kill", "time": 3}',
    ]
    records = parse_jsonl(lines)
    assert [(r.f, r.status, r.result) for r in records] == [("append", "ok", {"offset": 0})]
    faults = parse_faults(lines)
    assert [(f.f, f.value, f.start, f.end) for f in faults] == [
        ("kill", {"nodes": [2]}, 1.5, 3.0),
        ("pause", {"nodes": [1]}, 2.5, float("inf")),
    ]
    with pytest.raises(ValueError, match="never started"):
        parse_faults(['{"process": "nemesis", "type": "info", "f": "kill", "time": 3}'])


def test_attempt_lines_belong_to_the_open_operation_of_their_process() -> None:
    inv = {"process": 0, "type": "invoke", "f": "append", "key": "q", "value": "a", "time": 1}
    lines = _jsonl(
        inv,
        {**inv, "type": "attempt", "time": 1.5},
        {"process": 1, "type": "invoke", "f": "read", "key": "q", "time": 1.6},
        {**inv, "type": "attempt", "time": 2.5},
        {"process": 0, "type": "info", "f": "append", "key": "q", "time": 3},
        {"process": 1, "type": "ok", "f": "read", "key": "q", "value": [], "time": 4},
    )
    records = parse_jsonl(lines)
    assert [(r.f, r.attempts, r.line) for r in records] == [
        ("append", (1.5, 2.5), 1), ("read", (), 3)
    ]
    with pytest.raises(ValueError, match="line 3: ok time 2.0 precedes an attempt at 2.5"):
        parse_jsonl(_jsonl(inv, {**inv, "type": "attempt", "time": 2.5},
                           {**inv, "type": "ok", "value": 0, "time": 2}))
