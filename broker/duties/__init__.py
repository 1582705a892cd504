"""Leader-side duties: small tasks beside the state machine of each group this node leads.

A duty reads its group's applied state and proposes control records (or, through
`broker.state.parts.moves`, messages) through `GroupLead`; what it decides is in the log,
so a new leader's duty carries on from there.

`base.py` is what a duty is (`Duty`: its `run(gid)` for a group led here); `registry.py`
lists them (`DUTIES`, as `PARTS` lists the state's parts) and starts and cancels them
as this node's leaderships change (`LeaderDuties`); `transactions.py` and `retention.py`
are the duties.
"""
