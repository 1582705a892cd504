"""The parts the broker state machine is composed of (see `broker.state.parts.base`)."""
