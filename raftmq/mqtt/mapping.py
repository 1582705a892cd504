"""How MQTT topic names map onto raftmq topics (pure functions, no I/O).

An MQTT topic name's first level is the raftmq topic; the whole name travels with the
message as its `mqtt.topic` property, and its second level, when it is a valid tag,
becomes the message's tag (so raftmq consumers can filter by it):

    sensors/temperature/room1  ->  topic "sensors", tag "temperature",
                                   property mqtt.topic = "sensors/temperature/room1"

A message sent to topic "sensors" by a raftmq client (no `mqtt.topic` property) is seen
by MQTT subscribers as "sensors/<tag>" when it has a tag, else as "sensors".

A subscription's filter must name its raftmq topic literally in its first level; the
levels after it may use `+` (one level) and `#` (any number of levels, last), matched
against each message's MQTT topic name.
"""

from __future__ import annotations

from wire.protocol import RequestError, validate_topic_name
from wire.records import Message, tag_problem

__all__ = ["MQTT_TOPIC_PROPERTY", "RETAIN_PROPERTY", "FilterProblem", "matches",
           "mqtt_topic_of", "raftmq_target", "subscription_topic"]

MQTT_TOPIC_PROPERTY = "mqtt.topic"
RETAIN_PROPERTY = "mqtt.retain"


class FilterProblem(ValueError):
    """A topic name or filter this gateway cannot map."""


def raftmq_target(mqtt_topic: str) -> tuple[str, str]:
    """(raftmq topic, tag) a PUBLISH to `mqtt_topic` goes to; the tag may be ""."""
    levels = mqtt_topic.split("/")
    if any(c in mqtt_topic for c in "+#"):
        raise FilterProblem(f"a topic name has no wildcards: {mqtt_topic!r}")
    try:
        topic = validate_topic_name(levels[0])
    except RequestError as exc:
        raise FilterProblem(f"the first level of {mqtt_topic!r} is not a raftmq topic "
                            f"name: {exc.message}") from None
    tag = levels[1] if len(levels) > 1 and levels[1] and tag_problem(levels[1]) is None else ""
    return topic, tag


def subscription_topic(mqtt_filter: str) -> str:
    """The raftmq topic a subscription filter reads (its literal first level)."""
    levels = mqtt_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise FilterProblem(f"'#' is a whole last level: {mqtt_filter!r}")
        if "+" in level and level != "+":
            raise FilterProblem(f"'+' is a whole level: {mqtt_filter!r}")
    if levels[0] in ("+", "#"):
        raise FilterProblem(f"the first level names a raftmq topic, no wildcard: "
                            f"{mqtt_filter!r}")
    try:
        return validate_topic_name(levels[0])
    except RequestError as exc:
        raise FilterProblem(exc.message) from None


def matches(mqtt_filter: str, mqtt_topic: str) -> bool:
    """MQTT 3.1.1 topic matching (section 4.7) of one name against one filter."""
    f, t = mqtt_filter.split("/"), mqtt_topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)


def mqtt_topic_of(msg: Message) -> str:
    """The MQTT topic name a raftmq message is delivered under."""
    name = msg.properties.get(MQTT_TOPIC_PROPERTY)
    if name:
        return name
    return f"{msg.topic}/{msg.tags}" if msg.tags else msg.topic
