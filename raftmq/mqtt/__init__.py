"""An MQTT 3.1.1 gateway to raftmq (`raftmq mqtt`): devices publish and subscribe with
any MQTT client; messages live in raftmq topics, behind the same logins and ACLs.

The protocol's packets are read and written with amqtt's codec (`amqtt.mqtt`: a kept
asyncio MQTT implementation whose packet classes parse and build every 3.1.1 packet),
rather than a codec written here; the session logic is ours because amqtt's broker
acknowledges a QoS 1 PUBLISH before any hook could store it, and here a PUBACK must
mean "committed on a majority" (`raftmq.mqtt.gateway`). MQTT 5 is not spoken: amqtt's
codec is 3.1.1 only. The mapping between MQTT topic names and raftmq topics is
`raftmq.mqtt.mapping`.
"""
