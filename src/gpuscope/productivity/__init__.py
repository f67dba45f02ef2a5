"""One truth about every GPU-hour: productive, busy but not productive, degraded, idle or down.

:class:`ProductivityModel` is the one home of the model; the API, dashboard, reports, the demo's
terminal view and ``sim-eval --report`` all read it.
"""

from gpuscope.productivity.ledger import GROUPINGS
from gpuscope.productivity.model import ProductivityModel
from gpuscope.productivity.states import CAUSES, STATES

__all__ = ["CAUSES", "GROUPINGS", "STATES", "ProductivityModel"]
