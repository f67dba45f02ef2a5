"""The hub's clock: detectors are evaluated every second, store upkeep runs every minute.

Upkeep has a thread of its own: the hourly seal of an hour's raw rows into Parquet took tens of
seconds (38 s for 64 nodes at a 512 MB DuckDB limit, 77 s at 256 MB, on a loaded 2-core machine;
the merge of an hour's pieces that replaced it still takes about 10 s),
and in the evaluation's thread it held the detectors back that long and read as the hub's own lag
(``hub_overloaded``). After each upkeep the process hands the memory freed inside its malloc
arenas back to the system: glibc keeps it otherwise, and the upkeep's queries free the most.

:mod:`gpuscope.runtime` starts and stops it in its place in the hub's order; a
:class:`~gpuscope.web.server.HubServer` built alone (tests, benchmarks) runs one itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpuscope import procmem
from gpuscope.hub import Hub

log = logging.getLogger("gpuscope.evaluator")
UPKEEP_INTERVAL_S = 60.0


class Evaluator(threading.Thread):
    """Evaluates detectors every ``interval`` seconds; its upkeep thread maintains the store's
    rollups, seal and retention every ``upkeep_interval`` seconds."""

    def __init__(
        self,
        hub: Hub,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        upkeep_interval: float = UPKEEP_INTERVAL_S,
    ) -> None:
        super().__init__(name="gpuscope-evaluator", daemon=True)
        self.hub = hub
        self.interval = interval
        self.upkeep_interval = upkeep_interval
        self.clock = clock
        self.stop_event = threading.Event()
        self.upkeep = threading.Thread(target=self._upkeep, name="gpuscope-upkeep", daemon=True)

    def start(self) -> None:
        super().start()
        self.upkeep.start()

    def run(self) -> None:
        previous: float | None = None
        while not self.stop_event.wait(self.interval - (self.clock() % self.interval)):
            now = self.clock()
            # a tick due one interval after the previous one: how late it runs is the hub's lag
            lag = 0.0 if previous is None else max(0.0, now - previous - self.interval)
            previous = now
            self.hub.overload.evaluated(now, lag)
            # batches acknowledged but not yet seen by the detectors are the hub's lag too, past
            # the one interval they wait for this evaluation to observe them
            waited = self.hub.observing.backlog()[1]
            self.hub.overload.observe_lag(now, max(0.0, waited - self.interval))
            try:
                self.hub.evaluate(now)
            except Exception:  # the loop must outlive any one bad evaluation
                self.hub.counters.inc("evaluator_errors")
                log.exception("evaluation failed")

    def _upkeep(self) -> None:
        while True:
            try:
                self.hub.maintain(self.clock())
            except Exception:  # the loop must outlive any one failed upkeep
                self.hub.counters.inc("upkeep_errors")
                log.exception("store upkeep failed")
            procmem.trim()
            if self.stop_event.wait(self.upkeep_interval):
                return

    def stop(self) -> None:
        """No evaluation or upkeep starts after this returns (one under way is waited for, up to
        10 s each)."""
        self.stop_event.set()
        for thread in (self, self.upkeep):
            if thread.is_alive() and threading.current_thread() is not thread:
                thread.join(timeout=10)
