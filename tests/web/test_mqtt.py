"""The MQTT gateway against a live cluster with authentication and ACLs, through a real
`raftmq mqtt` process and paho-mqtt over loopback: a QoS 1 publish is acknowledged once
a raftmq consumer can read it, a raftmq send reaches an MQTT subscriber (wildcards
matched on the levels after the topic), retained messages reach late subscribers, a bad
login is refused, and the ACLs decide."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from raftmq.client import connect_admin, connect_producer
from raftmq.localcluster import LocalCluster
from tests.secured_cluster import ROOT, secured_cluster
from tests.web.server_process import serving
from transport.scram import PASSWORD_ENV, USER_ENV, Credentials

pytestmark = pytest.mark.live

DEVICE = Credentials("device", "device's password")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with secured_cluster(tmp_path_factory.mktemp("mqtt"), groups=1, user=DEVICE,
                         rules=(["--allow", "publish", "--topic", "sensors"],
                                ["--allow", "subscribe", "--topic", "sensors"]),
                         topics=dict.fromkeys(("sensors", "commands", "secret"), 2)) as c:
        yield c


@pytest.fixture(autouse=True)
def as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' own SDK clients log in as root (the gateway never sees this)."""
    monkeypatch.setenv(USER_ENV, ROOT.user)
    monkeypatch.setenv(PASSWORD_ENV, ROOT.password)


@pytest.fixture(scope="module")
def broker(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[str, int]]:
    logs = tmp_path_factory.mktemp("mqttgw")
    with serving("mqtt", cluster.namesrv_addr, logs / "mqtt.log") as address:
        host, port = address.rsplit(":", 1)
        yield host, int(port)


def client(broker: tuple[str, int], creds: Credentials | None,
           client_id: str = "") -> tuple[mqtt.Client, int]:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                    protocol=mqtt.MQTTv311)
    if creds is not None:
        c.username_pw_set(creds.user, creds.password)
    codes: queue.Queue[int] = queue.Queue()
    c.on_connect = lambda _c, _u, _f, rc, _p: codes.put(rc.value)
    c.connect(*broker)
    c.loop_start()
    return c, codes.get(timeout=30)


@pytest.fixture
def root_mqtt(broker: tuple[str, int]) -> Iterator[mqtt.Client]:
    c, rc = client(broker, ROOT)
    assert rc == 0
    yield c
    c.disconnect()
    c.loop_stop()


def test_a_qos1_publish_is_acknowledged_once_a_consumer_can_read_it(
        root_mqtt: mqtt.Client, cluster: LocalCluster) -> None:
    info = root_mqtt.publish("sensors/temperature/room1", b"21.5", qos=1)
    info.wait_for_publish(timeout=30)
    assert info.is_published()
    # the PUBACK came after the commit: a consumer reads it now
    with connect_admin(cluster.namesrv_addr) as admin:
        topic = admin.describe_topic("sensors")
    from raftmq.client import connect_pull_consumer

    with connect_pull_consumer(cluster.namesrv_addr, "mqtt-check") as consumer:
        bodies = []
        for q in topic.queues:
            assert q.end_offset is not None
            res = consumer.pull("sensors", q.queue, 0, max=100, wait_ms=0)
            bodies += [(m.body, m.tags, m.properties.get("mqtt.topic")) for m in res.messages]
    assert (b"21.5", "temperature", "sensors/temperature/room1") in bodies


def test_a_raftmq_send_reaches_matching_mqtt_subscribers(
        root_mqtt: mqtt.Client, cluster: LocalCluster) -> None:
    got: queue.Queue[tuple[str, bytes]] = queue.Queue()
    root_mqtt.on_message = lambda _c, _u, m: got.put((m.topic, m.payload))
    subscribed: queue.Queue[list[int]] = queue.Queue()
    root_mqtt.on_subscribe = lambda _c, _u, _m, codes, _p: subscribed.put(
        [c.value for c in codes])
    root_mqtt.subscribe([("commands/+/on", 1), ("commands/lamp/#", 0)])
    assert subscribed.get(timeout=30) == [1, 0]
    with connect_producer(cluster.namesrv_addr) as p:
        p.send("commands", b"no match", tags="fan")  # "commands/fan": matches neither
        p.send("commands", b"tagged", tags="lamp")  # "commands/lamp": matches lamp/#
    root_mqtt.publish("commands/heater/on", b"via mqtt", qos=1).wait_for_publish(30)
    seen = set()
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        try:
            seen.add(got.get(timeout=1))
        except queue.Empty:
            pass
    assert seen == {("commands/lamp", b"tagged"), ("commands/heater/on", b"via mqtt")}


def test_a_retained_message_reaches_a_later_subscriber(
        root_mqtt: mqtt.Client, broker: tuple[str, int]) -> None:
    root_mqtt.publish("sensors/status", b"online", qos=1, retain=True).wait_for_publish(30)
    late, rc = client(broker, ROOT)
    assert rc == 0
    got: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
    late.on_message = lambda _c, _u, m: got.put((m.topic, m.payload, m.retain))
    late.subscribe("sensors/#", 1)
    assert got.get(timeout=30) == ("sensors/status", b"online", True)
    late.disconnect()
    late.loop_stop()


def test_a_bad_login_is_refused(broker: tuple[str, int]) -> None:
    c, rc = client(broker, Credentials("device", "wrong"))
    c.loop_stop()
    assert rc == 0x86  # (paho's reason code for 3.1.1's 4) bad user name or password
    c, rc = client(broker, None)
    c.loop_stop()
    assert rc == 0x87  # (3.1.1's 5) not authorized: this cluster needs a login


def test_the_acls_decide_what_a_device_may_publish_and_read(
        broker: tuple[str, int], cluster: LocalCluster) -> None:
    dev, rc = client(broker, DEVICE)
    assert rc == 0
    assert dev.publish("sensors/x", b"allowed", qos=1).wait_for_publish(30) is None
    subscribed: queue.Queue[list[int]] = queue.Queue()
    dev.on_subscribe = lambda _c, _u, _m, codes, _p: subscribed.put(
        [c.value for c in codes])
    dev.subscribe([("secret/#", 1), ("sensors/#", 1)])
    assert subscribed.get(timeout=30) == [0x80, 1]
    dropped: queue.Queue[int] = queue.Queue()
    dev.on_disconnect = lambda _c, _u, _f, rc, _p: dropped.put(rc.value)
    before = _ends(cluster, "secret")
    info = dev.publish("secret/x", b"refused", qos=1)
    dropped.get(timeout=30)  # no PUBACK: the gateway closed the connection
    assert not info.is_published()
    assert _ends(cluster, "secret") == before
    dev.loop_stop()


def _ends(cluster: LocalCluster, topic: str) -> list[int | None]:
    with connect_admin(cluster.namesrv_addr) as admin:
        return [q.end_offset for q in admin.describe_topic(topic).queues]
