"""The Spark source's options and offset arithmetic (`raftmq.spark.options`), without Spark."""

from __future__ import annotations

import json

import pytest

from raftmq.spark.options import (
    OptionError,
    QueueRange,
    admit,
    offsets_from_json,
    offsets_to_json,
    parse_options,
    resolve,
    split_ranges,
    times_for,
)

BASE = {"namesrv": "127.0.0.1:9876", "subscribe": "t"}


def test_defaults_follow_the_kafka_source() -> None:
    batch = parse_options(BASE, batch=True)
    assert (batch.starting, batch.ending, batch.fail_on_data_loss) == ("earliest", "latest", True)
    stream = parse_options(BASE, batch=False)
    assert stream.starting == "latest"
    opts = parse_options({**BASE, "STARTINGOFFSETS": '{"t": {"0": -2, "1": 7}}',
                          "failOnDataLoss": "False", "maxOffsetsPerTrigger": "100",
                          "minPartitions": "8", "namesrv": "a:1, b:2"}, batch=False)
    assert opts.starting == {"t": {0: -2, 1: 7}}
    assert opts.namesrv == ("a:1", "b:2")
    assert parse_options({**BASE, "tags": "B || A"}, batch=True).tags == ("A", "B")
    assert parse_options({**BASE, "tags": "*"}, batch=True).tags is None
    assert parse_options({**BASE, "filter": "a > 5"}, batch=True).sql == "a > 5"
    assert parse_options(BASE, batch=True).sql is None
    assert (opts.fail_on_data_loss, opts.max_offsets_per_trigger, opts.min_partitions) == (
        False, 100, 8)


def test_timestamps_win_over_offsets_and_the_single_one_over_the_json() -> None:
    opts = parse_options({**BASE, "startingTimestamp": "1700000000000",
                          "startingOffsetsByTimestamp": '{"t": {"0": 5}}',
                          "endingOffsetsByTimestamp": '{"t": {"1": 9}}',
                          "startingOffsetsByTimestampStrategy": "LATEST"}, batch=True)
    assert opts.starting_times == 1_700_000_000_000
    assert opts.ending_times == {"t": {1: 9}}
    assert opts.missing_start == "latest"
    assert parse_options(BASE, batch=True).starting_times is None
    assert times_for(9, [("t", 0), ("t", 1)], "x") == {("t", 0): 9, ("t", 1): 9}
    assert times_for({"t": {1: 9}}, [("t", 0), ("t", 1)], "x") == {("t", 1): 9}
    with pytest.raises(OptionError, match="does not read"):
        times_for({"u": {0: 1}}, [("t", 0)], "endingOffsetsByTimestamp")
    with pytest.raises(OptionError, match="batch queries only"):
        parse_options({**BASE, "endingTimestamp": "5"}, batch=False)


@pytest.mark.parametrize(("options", "message"), [
    ({"subscribe": "t"}, "'namesrv' is required"),
    ({"namesrv": "x:1"}, "exactly one of"),
    ({**BASE, "subscribePattern": "t.*"}, "exactly one of"),
    ({"namesrv": "x:1", "subscribePattern": "("}, "not a regular expression"),
    ({"namesrv": "x:1", "assign": '{"t": 3}'}, "assign must be JSON"),
    ({"namesrv": "x:1", "assign": '{"t": [-1]}'}, "assign must be JSON"),
    ({**BASE, "startingTimestamp": "-1"}, "startingTimestamp is epoch milliseconds"),
    ({**BASE, "endingTimestamp": "soon"}, "endingTimestamp is epoch milliseconds"),
    ({**BASE, "startingOffsetsByTimestamp": '{"t": {"0": -1}}'}, "a time is epoch"),
    ({**BASE, "startingOffsetsByTimestamp": "[1]"}, "must be an object of topics"),
    ({**BASE, "startingTimestamp": "1", "startingOffsetsByTimestampStrategy": "never"},
     "'error' or 'latest'"),
    ({**BASE, "startingOffsets": "latest"}, "not allowed in a batch query"),
    ({**BASE, "startingOffsets": '{"t": {"0": -1}}'}, "not allowed in a batch query"),
    ({**BASE, "endingOffsets": "earliest"}, "not allowed"),
    ({**BASE, "endingOffsets": '{"t": {"0": -2}}'}, "not allowed"),
    ({**BASE, "startingOffsets": '{"t": {"x": 1}}'}, "not a number"),
    ({**BASE, "startingOffsets": '{"t": {"0": -3}}'}, "offset must be"),
    ({**BASE, "startingOffsets": "soon"}, "'earliest', 'latest' or JSON"),
    ({**BASE, "failOnDataLoss": "maybe"}, "'true' or 'false'"),
    ({**BASE, "minPartitions": "0"}, "positive integer"),
    ({**BASE, "maxOffsetsPerTrigger": "x"}, "positive integer"),
    ({**BASE, "kafka.bootstrap.servers": "x"}, "unknown option"),
    ({**BASE, "tags": "a b"}, "bad tag subscription"),
    ({**BASE, "filter": "a > 'x'"}, r"filter: .*\(line 1, column 5\)"),
    ({**BASE, "filter": "a = 1 )"}, r"filter: .*column 7"),
])
def test_bad_options_are_refused_by_name(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options(options, batch=True)


def test_a_stream_may_start_at_latest_but_has_no_end() -> None:
    assert parse_options({**BASE, "startingOffsets": '{"t": {"0": -1}}'}, batch=False)
    with pytest.raises(OptionError, match="batch queries only"):
        parse_options({**BASE, "endingOffsets": "latest"}, batch=False)


def test_offsets_json_round_trips_with_string_queue_ids() -> None:
    offsets = {"b": {10: 3, 2: 0}, "a": {0: 7}}
    as_json = offsets_to_json(offsets)
    assert json.dumps(as_json) == '{"a": {"0": 7}, "b": {"2": 0, "10": 3}}'
    assert offsets_from_json(json.dumps(as_json)) == offsets


def test_resolve_turns_earliest_and_latest_into_each_queue_s_bounds() -> None:
    bounds = {("t", 0): (5, 50), ("t", 1): (0, 9)}
    assert resolve("earliest", bounds, "startingOffsets") == {"t": {0: 5, 1: 0}}
    assert resolve("latest", bounds, "endingOffsets") == {"t": {0: 50, 1: 9}}
    assert resolve({"t": {0: -1}}, bounds, "startingOffsets") == {"t": {0: 50, 1: 0}}
    assert resolve({"t": {1: 4}}, bounds, "endingOffsets") == {"t": {0: 50, 1: 4}}
    with pytest.raises(OptionError, match="does not read"):
        resolve({"t": {2: 0}}, bounds, "startingOffsets")


def test_split_ranges_meets_min_partitions_and_covers_every_offset_once() -> None:
    ranges = [QueueRange("t", 0, 0, 100), QueueRange("t", 1, 10, 13), QueueRange("t", 2, 5, 5)]
    assert split_ranges(ranges, None) == ranges[:2]  # empty ranges are no partition
    pieces = split_ranges(ranges, 10)
    assert len(pieces) >= 10
    for q, lo, hi in ((0, 0, 100), (1, 10, 13)):
        got = sorted(o for p in pieces if p.queue == q for o in range(p.start, p.end))
        assert got == list(range(lo, hi))


def test_admit_shares_the_limit_by_backlog_and_never_starves_a_queue() -> None:
    start = {"t": {0: 0, 1: 100, 2: 7}}
    latest = {"t": {0: 1000, 1: 110, 2: 7, 3: 4}}
    assert admit(start, latest, None) == latest
    end = admit(start, latest, 100)
    taken = {q: end["t"][q] - start["t"].get(q, latest["t"][q]) for q in end["t"]}
    assert taken[0] == 99 and taken[1] == 1 and taken[2] == 0  # 1000:10 of 100
    assert end["t"][3] == 4  # a new queue absent from start: its own start is its end here
    assert sum(taken.values()) <= 100
    assert admit(start, latest, 100_000) == latest
