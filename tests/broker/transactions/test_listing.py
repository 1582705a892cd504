"""TX_LIST answers fit in one frame header: a group that remembers thousands of decisions
(10,000 per participant) answers as many rows as fit, and says its lists were cut, rather
than a header the client's reader refuses (closing the connection, so the admin could
never list transactions again while that node leads the groups)."""

from __future__ import annotations

from broker.doors.transactions import LIST_HEADER_BUDGET, participant, tx_listing
from broker.state.parts.txpart import Decision
from broker.state.statemachine import BrokerState
from wire.protocol import MAX_HEADER, FrameDecoder, encode_frame, ok_header


def remembering(gid: str, decisions: int) -> BrokerState:
    state = BrokerState(gid)
    part = participant(state)
    for i in range(decisions):
        part._decide(("h", f"{gid}-{i:032x}"), Decision(i % 2 == 0, "operator", i + 1, 1))
    return state


def test_a_short_listing_is_whole() -> None:
    listing = tx_listing([("g0", remembering("g0", 5))], "", 1000)
    assert listing["truncated"] is False and listing["limit"] == 1000
    assert [r["id"] for r in listing["decided"]] == [f"g0-{i:032x}" for i in range(4, -1, -1)]
    assert all(r["g"] == "g0" and r["kind"] == "half" for r in listing["decided"])


def test_thousands_of_decisions_are_cut_to_fit_one_header() -> None:
    states = [(g, remembering(g, 10_000)) for g in ("g0", "g1", "g2")]
    listing = tx_listing(states, "", 10_000)
    header = encode_frame(ok_header(7, **listing))
    assert len(header) <= LIST_HEADER_BUDGET + 64 < MAX_HEADER
    assert listing["truncated"] is True and 1 <= listing["limit"] < 10_000
    # the newest decisions of every group, as many of each as the limit says
    for g in ("g0", "g1", "g2"):
        rows = [r for r in listing["decided"] if r["g"] == g]
        assert len(rows) == listing["limit"]
        assert rows[0]["id"] == f"{g}-{9_999:032x}"
    # and the reader takes it
    dec = FrameDecoder(max_frame=8 << 20)
    dec.feed(header)
    frame = dec.next_frame()
    assert frame is not None and frame.header["id"] == 7


def test_one_id_is_found_however_many_decisions_there_are() -> None:
    states = [("g0", remembering("g0", 10_000))]
    want = f"g0-{17:032x}"  # old: far past the cut of the whole listing
    listing = tx_listing(states, want, 10_000)
    assert listing["truncated"] is False
    assert [(r["id"], r["commit"]) for r in listing["decided"]] == [(want, False)]


def test_a_small_budget_still_answers_one_row_per_list() -> None:
    listing = tx_listing([("g0", remembering("g0", 100))], "", 50, budget=10)
    assert listing["limit"] == 1 and listing["truncated"] is True
    assert len(listing["decided"]) == 1
