"""Replicated state: what every replica of a group derives from its committed entries.

`statemachine.BrokerState` composes the parts (`broker.state.parts`); the ConsumeQueues
and their sealed chunks are its on-disk indexes. Nothing here reaches the network or a
clock: the same log gives the same state on every replica.
"""
