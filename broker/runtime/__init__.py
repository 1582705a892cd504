"""The node's runtime pieces that doors and duties stand on.

The registry of hosted groups, `GroupLead` (the one way to ask "do I lead this group",
propose a control record, read behind a ReadIndex barrier), Raft traffic and requests
between nodes, the connection budget, `hosted.json`, the name-server registrar and the
node's metrics. Nothing here imports the doors, the duties or the node.
"""
