"""The state-machine side of the admin tools: growing a topic and deleting a consumer
group's offsets, as control entries every replica applies alike."""

from __future__ import annotations

from broker.state.statemachine import (
    ControlResult,
    ErrorResult,
    control_create_topic,
    control_delete_group,
    control_delete_topic,
    control_grow_topic,
    control_offsets,
)
from raftlog.types import EntryType
from tests.broker.state.test_statemachine import Feed, assert_no_change, with_topic
from wire.protocol import Code


def test_grow_topic_adds_queues_and_keeps_what_was_there() -> None:
    f = with_topic("t", 4, (0, 2))
    f.produce("t", 0, 3)
    f.control(control_offsets("cg", [("t", 0, 2)]))
    assert f.control(control_grow_topic("t", 6, [0, 2, 4])) == ControlResult("grow_topic", 1)
    cfg = f.state.topic("t")
    assert cfg is not None and cfg.queues == 6 and cfg.hosted == (0, 2, 4)
    assert f.state.queue_range("t", 0) == (0, 3)  # messages stay
    assert f.state.queue_range("t", 4) == (0, 0)  # the new queue is empty
    assert f.state.consumer_offset("cg", "t", 0) == 2  # offsets stay
    f.produce("t", 4, 2)
    assert f.state.queue_range("t", 4) == (0, 2)
    # the same again changes nothing (a retried request)
    assert f.control(control_grow_topic("t", 6, [0, 2, 4])) == ControlResult("grow_topic", 0)


def test_grow_topic_joins_a_new_group_and_never_shrinks() -> None:
    f = Feed()
    assert f.control(control_grow_topic("t", 6, [5])) == ControlResult("grow_topic", 1)
    assert f.state.queue_range("t", 5) == (0, 0)

    def grown() -> Feed:
        g = with_topic("t", 4, (0, 2))
        g.control(control_grow_topic("t", 6, [0, 2, 4]))
        return g

    for bad in ([0, 2], [0, 4]):  # a queue dropped
        r = assert_no_change(grown, control_grow_topic("t", 6, bad), EntryType.CONTROL)
        assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED
    r = assert_no_change(grown, control_grow_topic("t", 5, [0, 2, 4]), EntryType.CONTROL)
    assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED  # fewer queues


def test_delete_group_forgets_only_that_groups_offsets() -> None:
    f = with_topic("t", 2, (0, 1))
    f.control(control_offsets("cg", [("t", 0, 0), ("t", 1, 0)]))
    f.control(control_offsets("other", [("t", 0, 0)]))
    assert f.control(control_delete_group("cg")) == ControlResult("delete_group", 2)
    assert f.state.consumer_offsets() == {("other", "t", 0): 0}
    assert f.control(control_delete_group("cg")) == ControlResult("delete_group", 0)


def test_a_retried_admin_write_never_undoes_what_came_after_it() -> None:
    """Each admin write is retried by the client when its answer is lost. A retry whose
    first copy was applied after all must change nothing: a group delete must not wipe an
    offset committed since, a topic delete must not delete the topic created again since,
    a grow must not undo a delete."""
    f = with_topic("t", 1, (0,))
    f.control(control_offsets("cg", [("t", 0, 0)]))
    first = f.control(control_delete_group("cg", req=(7, 1)))
    assert first == ControlResult("delete_group", 1)
    f.control(control_offsets("cg", [("t", 0, 0)]))
    assert f.control(control_delete_group("cg", req=(7, 1))) == ControlResult(
        "delete_group", 1, dup=True)
    assert f.state.consumer_offset("cg", "t", 0) == 0

    f.control(control_delete_topic("t", req=(7, 2)))
    f.control(control_create_topic("t", 1, (0,)))
    assert f.control(control_delete_topic("t", req=(7, 2))).dup  # type: ignore[union-attr]
    assert "t" in f.state.topics()

    f.control(control_grow_topic("t", 2, (0, 1), req=(7, 3)))
    f.control(control_delete_topic("t", req=(7, 4)))
    assert f.control(control_grow_topic("t", 2, (0, 1), req=(7, 3))).dup  # type: ignore[union-attr]
    assert "t" not in f.state.topics()
