"""``raftmq chaos check`` exit codes and outputs, called directly and as a module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.analysis import analyze_run
from chaos.cli import EXIT_USAGE, check_main
from chaos.recorder import Recorder
from tests.paths import REPO_ROOT as REPO


def _write(path: Path, entries: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def _queue_history(second_offset: int) -> list[dict]:
    return [
        {"process": 0, "type": "invoke", "f": "append", "key": "q", "value": "a", "time": 0.0},
        {
            "process": 0,
            "type": "ok",
            "f": "append",
            "key": "q",
            "value": {"offset": 0},
            "time": 1.0,
        },
        {"process": 0, "type": "invoke", "f": "append", "key": "q", "value": "b", "time": 2.0},
        {
            "process": 0,
            "type": "ok",
            "f": "append",
            "key": "q",
            "value": {"offset": second_offset},
            "time": 3.0,
        },
        {
            "process": 1,
            "type": "invoke",
            "f": "read",
            "key": "q",
            "value": {"offset": 0, "n": 5},
            "time": 4.0,
        },
        {"process": 1, "type": "ok", "f": "read", "key": "q", "value": ["a", "b"], "time": 5.0},
    ]


def _hard_register_history(writers: int = 18) -> list[dict]:
    entries = [
        {"process": i, "type": "invoke", "f": "write", "value": i, "time": 0.0}
        for i in range(writers)
    ]
    entries += [
        {"process": 99, "type": "invoke", "f": "read", "time": 1.0},
        {"process": 99, "type": "ok", "f": "read", "value": 12345, "time": 2.0},
    ]
    return entries


def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path / "good.jsonl", _queue_history(1))
    bad = _write(tmp_path / "bad.jsonl", _queue_history(5))
    hard = _write(tmp_path / "hard.jsonl", _hard_register_history())
    assert check_main(["--model", "queue-log", "--format", "jsonl", str(good)]) == 0
    assert "linearizable" in capsys.readouterr().out
    assert check_main(["--model", "queue-log", "--format", "jsonl", str(bad)]) == 1
    assert "append('q', 'b') -> 5" in capsys.readouterr().out
    args = ["--model", "cas-register", "--format", "jsonl", str(hard), "--timeout", "0.0001"]
    assert check_main(args) == 2
    capsys.readouterr()
    assert check_main(["--model", "queue-log", "--format", "jsonl", str(tmp_path / "missing")]) == 3
    assert check_main(["--model", "nope", "--format", "jsonl", str(good)]) == 3
    assert check_main(["--help"]) == 0


def test_json_output_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _write(tmp_path / "bad.jsonl", _queue_history(5))
    report = tmp_path / "out.html"
    code = check_main(
        ["--model", "queue-log", "--format", "jsonl", str(bad), "--json", "--report", str(report)]
    )
    assert code == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["verdict"] == "not-linearizable"
    assert summary["operations"] == 3 and summary["partitions"] == 1
    assert summary["first_failure"]["key"] == "q"
    assert summary["first_failure"]["operation"]["description"] == "append('q', 'b') -> 5"
    assert summary["accounting"]["queues"]["q"]["ack_mismatches"]
    assert isinstance(summary["elapsed"], float)
    assert "append(&#x27;q&#x27;, &#x27;b&#x27;) -&gt; 5" in report.read_text()


@pytest.mark.live
def test_module_entry_point(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.jsonl", _queue_history(1))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "chaos.cli",
            "--model",
            "queue-log",
            "--format",
            "jsonl",
            str(good),
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "linearizable"


# ---------------------------------------------------------------- a run's own verdict

GROUPS = {"t/0": "g0", "t/1": "g1"}


def _run_history(path: Path, *, extra_copy_attempts: tuple[float, ...]) -> Path:
    """A run's history as `chaos run` writes it: queue and consumer-offset operations side
    by side, a fault, and a plain producer's message stored twice, with the attempts the
    SDK made for it (two: the first timed out, yet landed)."""
    now = [0.0]
    with Recorder(path, clock=lambda: now[0]) as rec:
        def at(t: float) -> Recorder:
            now[0] = t
            return rec

        at(0.5).fault_start("kill", {"nodes": [1], "leaders": {"g0": 1}})
        at(1).invoke(0, "append", "t/0", "p0-0")
        for t in extra_copy_attempts:
            at(t).attempt(0, "append", "t/0", "p0-0")
        at(5).complete(0, "ok", "append", "t/0", {"offset": 1})
        at(5.5).fault_end("kill")
        at(6).invoke(2, "append", "t/1", "i2-0")
        at(7).complete(2, "ok", "append", "t/1", {"offset": 0})
        key = ["cg0", "t/0"]
        at(8).invoke(3, "commit", key, 1)
        at(9).complete(3, "ok", "commit", key)
        at(10).invoke(3, "read", key, None)
        at(11).complete(3, "ok", "read", key, 1)
        for p, q, got in ((5, "t/0", ["p0-0", "p0-0"]), (6, "t/1", ["i2-0"])):
            at(12).invoke(p, "read", q, {"offset": 0, "n": 256})
            at(13).complete(p, "ok", "read", q, got)
    return path


def _run_dir(tmp_path: Path, *, attempts: tuple[float, ...], **facts: object) -> Path:
    """A run's directory: its history and the results.json `chaos run` would write."""
    out = tmp_path / "run"
    out.mkdir()
    history = _run_history(out / "history.jsonl", extra_copy_attempts=attempts)
    run = {"queue_groups": GROUPS, "drained": True, "unexpected_exits": {}, **facts}
    analysis = analyze_run(history, run, check_timeout=10.0)
    results = {**analysis.results, "options": {"check_timeout": 10.0}, "run": run}
    (out / "results.json").write_text(json.dumps(results, default=str))
    return out


_TIMING = ("checker_seconds", "linearizability", "offsets_linearizability", "analysis_seconds")


def _same_verdict(saved: dict, rechecked: dict) -> None:
    for key, value in saved.items():
        if key not in (*_TIMING, "options", "run"):
            assert rechecked[key] == value, key


@pytest.mark.parametrize(
    ("attempts", "facts", "code", "problems"),
    [
        ((1.1, 3.0), {}, 0, []),  # the retry explains the second copy
        ((1.1,), {}, 1, ["duplicated_unretried: 1", "not linearizable: t/0"]),
        ((1.1, 3.0), {"unexpected_exits": {"node2": -9}},
         1, ["nodes exited on their own: {'node2': -9}"]),
        ((1.1, 3.0), {"drained": False},
         1, ["the final drain did not reach the end of every queue"]),
    ],
)
def test_a_run_is_rechecked_with_its_own_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], attempts: tuple[float, ...],
    facts: dict, code: int, problems: list[str],
) -> None:
    out = _run_dir(tmp_path, attempts=attempts, **facts)
    saved = json.loads((out / "results.json").read_text())
    assert saved["problems"] == problems
    for argv in ([str(out)], ["--history", str(out / "history.jsonl")],
                 [str(out / "history.jsonl")]):
        assert check_main([*argv, "--json"]) == code
        rechecked = json.loads(capsys.readouterr().out)
        _same_verdict(saved, rechecked)
        assert rechecked["check_timeout"] == 10.0  # the run's own limit
    assert check_main([str(out)]) == code  # the human table says the same
    text = capsys.readouterr().out
    assert ("valid" if code == 0 else "INVALID") in text
    assert f"{saved['duplicated_retried']} with a matching retry" in text


def test_an_undrained_history_without_its_facts_is_unknown_not_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An acknowledged message no read reached (its queue was never drained): it is
    neither lost nor kept, so the verdict is unknown and says why, not valid; once a
    read after the acknowledgement reaches the queue's end without it, it is lost."""

    def run(tmp: Path, *, drain_t0: bool) -> Path:
        out = tmp / ("drained" if drain_t0 else "undrained")
        out.mkdir()
        with Recorder(out / "history.jsonl", clock=iter(range(100)).__next__) as rec:
            rec.invoke(0, "append", "t/0", "p0-0")
            rec.complete(0, "ok", "append", "t/0", {"offset": 0})
            rec.invoke(1, "append", "t/1", "p1-0")
            rec.complete(1, "ok", "append", "t/1", {"offset": 0})
            for q, got in (("t/1", ["p1-0"]), ("t/0", [])) if drain_t0 else (("t/1", ["p1-0"]),):
                rec.invoke(2, "read", q, {"offset": 0, "n": 256})
                rec.complete(2, "ok", "read", q, got)
        return out

    assert check_main([str(run(tmp_path, drain_t0=False)), "--json"]) == 2
    results = json.loads(capsys.readouterr().out)
    assert results["verdict"] == "unknown" and results["unread"] == 1
    assert "never read back" in results["unknown"]["unread"]
    assert check_main([str(run(tmp_path, drain_t0=True)), "--json"]) == 1
    results = json.loads(capsys.readouterr().out)
    assert results["verdict"] == "invalid" and results["lost"] == 1


def test_a_runs_history_mixes_queues_and_offsets_for_one_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--model picks its own operations out of a run's history, and counts copies the
    same way as the run: one per recorded attempt."""
    out = _run_dir(tmp_path, attempts=(1.1, 3.0))
    history = str(out / "history.jsonl")
    assert check_main(["--model", "queue-log", "--format", "jsonl", history, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["operations"] == 5  # 2 appends, 1 copy the retry explains, 2 reads
    assert check_main(["--model", "consumer-offset", history, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["operations"] == 2
    (tmp_path / "bad").mkdir()
    bad = _run_dir(tmp_path / "bad", attempts=(1.1,))
    assert check_main(["--model", "queue-log", str(bad / "history.jsonl")]) == 1


def test_a_history_without_results_is_checked_alone_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = _run_history(tmp_path / "h.jsonl", extra_copy_attempts=(1.1, 3.0))
    assert check_main(["--history", str(history), "--json", "--timeout", "5"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["verdict"] == "valid" and "note" in results
    assert results["unavailability"][0]["groups"] == {"g0": None}  # no groups known


def test_a_check_out_of_time_is_unknown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    out.mkdir()
    with Recorder(out / "history.jsonl", clock=iter(range(10**6)).__next__) as rec:
        for i in range(3000):  # more search steps than one slice: the deadline is looked at
            rec.invoke(0, "append", "t/0", f"p0-{i}")
            rec.attempt(0, "append", "t/0", f"p0-{i}")
            rec.complete(0, "ok", "append", "t/0", {"offset": i})
        rec.invoke(5, "read", "t/0", {"offset": 0, "n": 1024})
        rec.complete(5, "ok", "read", "t/0", [f"p0-{i}" for i in range(1024)])
    assert check_main([str(out), "--timeout", "1e-9", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["verdict"] == "unknown"


_APPEND = {"process": 0, "type": "invoke", "f": "append", "key": "q", "value": "a", "time": 0}
_READ = {"process": 1, "type": "invoke", "f": "read", "key": "q", "value": {"offset": 0, "n": 2},
         "time": 2}


def _done(invoke: dict, value: object, kind: str = "ok") -> dict:
    return {**invoke, "type": kind, "value": value, "time": invoke["time"] + 1}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_APPEND, _done(_APPEND, {"offset": 0}), _READ, _done(_READ, None)],
         "list of message ids"),
        ([_APPEND, _done(_APPEND, {"offset": 0}), _READ, _done(_READ, 7)], "list of message ids"),
        ([_APPEND, _done(_APPEND, {"offset": 0}), _READ, _done(_READ, [{"id": "a"}])],
         "list of message ids"),
        ([{**_APPEND, "value": {"id": "a"}}, _done({**_APPEND, "value": {"id": "a"}}, {})],
         "message id"),
        ([_APPEND, _done(_APPEND, {"offset": "zero"})], "offset"),
        ([_APPEND, _done(_APPEND, None)], "offset"),
        ([{**_READ, "value": {"offset": "0"}}], "offset and n"),
        ([{**_READ, "value": [0, 2]}], "offset"),
        (["{broken"], "invalid JSON"),
        ([[1, 2]], "needs 'process' and 'type'"),
        ([{**_APPEND, "process": {"p": 0}}], "'process' must be"),
        ([{**_APPEND, "time": [1]}], "'time' must be"),
        ([{**_APPEND, "key": {"q": 1}}], "'key' must be"),
        ([{**_APPEND, "type": "maybe"}], "unknown type"),
        ([{**_APPEND, "type": "attempt"}], "no pending invoke"),
        ([_APPEND, {**_APPEND, "type": "attempt", "value": "b", "time": 0.5}], "does not match"),
        ([{**_APPEND, "f": "write"}], "neither a queue operation"),
    ],
)
def test_malformed_run_histories_exit_3_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list, message: str
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "history.jsonl").write_text(
        "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    )
    for argv in ([str(out)], ["--model", "queue-log", str(out / "history.jsonl")]):
        if "neither" in message and "--model" in argv:
            continue
        assert check_main(argv) == EXIT_USAGE, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("model", "entries", "message"),
    [
        ("cas-register", [{"process": 0, "type": "invoke", "f": "cas", "value": 3}], "[old, new]"),
        ("kv", [{"process": 0, "type": "invoke", "f": "put", "key": "k", "value": 3}], "string"),
        ("consumer-offset", [
            {"process": 0, "type": "invoke", "f": "read", "key": ["g", "q"]},
            {"process": 0, "type": "ok", "f": "read", "key": ["g", "q"], "value": {"o": 1}},
        ], "an offset read"),
    ],
)
def test_malformed_values_for_other_models_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, entries: list, message: str
) -> None:
    path = _write(tmp_path / "h.jsonl", entries)
    assert check_main(["--model", model, str(path)]) == EXIT_USAGE
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ("{nope", "invalid JSON"),
        ("[]", "not a results object"),
        ('{"run": 5}', "no 'run' facts"),
        ('{"run": {"queue_groups": ["g0"]}}', "queue_groups"),
        ('{"run": {"queue_groups": {}, "drained": "yes"}}', "drained"),
    ],
)
def test_malformed_results_beside_a_history_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], results: str, message: str
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    _run_history(out / "history.jsonl", extra_copy_attempts=(1.1, 3.0))
    (out / "results.json").write_text(results)
    assert check_main([str(out)]) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_check_usage_errors_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_main([]) == EXIT_USAGE
    assert check_main([str(tmp_path)]) == EXIT_USAGE  # a directory without a history
    assert "no history" in capsys.readouterr().err
    out = _run_dir(tmp_path, attempts=(1.1, 3.0))
    assert check_main([str(out), "--history", str(out / "history.jsonl")]) == EXIT_USAGE
    assert check_main([str(out), "--format", "edn-kv"]) == EXIT_USAGE
    assert check_main([str(out), "--timeout", "-1"]) == EXIT_USAGE
    assert check_main([str(out), "--search-memory", "0"]) == EXIT_USAGE
    history = str(out / "history.jsonl")
    assert check_main(["--model", "queue-log", history, "--search-memory", "5"]) == EXIT_USAGE
    assert "--search-memory takes a run's history" in capsys.readouterr().err
