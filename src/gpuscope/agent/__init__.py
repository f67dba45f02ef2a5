"""The per-node agent: collect every interval, send to the hub, spool to disk while it is away."""

from gpuscope.agent.agent import (
    Agent,
    collect_once_json,
    default_node_name,
    default_spool_dir,
    run_until_signalled,
)
from gpuscope.agent.sender import Backoff, Sender
from gpuscope.agent.spool import Spool, SpoolError

__all__ = [
    "Agent",
    "Backoff",
    "Sender",
    "Spool",
    "SpoolError",
    "collect_once_json",
    "default_node_name",
    "default_spool_dir",
    "run_until_signalled",
]
