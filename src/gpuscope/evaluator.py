"""The hub's clock: detectors are evaluated every second, store upkeep runs every minute.

After each upkeep the process hands the memory freed inside its malloc arenas back to the system:
glibc keeps it otherwise, and the upkeep's queries (rollups, the hourly seal) free the most.

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


class Evaluator(threading.Thread):
    """Evaluates detectors every ``interval`` seconds and maintains store rollups each minute."""

    def __init__(self, hub: Hub, interval: float = 1.0, clock: Callable[[], float] = time.time) -> None:
        super().__init__(name="gpuscope-evaluator", daemon=True)
        self.hub = hub
        self.interval = interval
        self.clock = clock
        self.stop_event = threading.Event()

    def run(self) -> None:
        last_maintenance = 0.0
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
                if now - last_maintenance >= 60:
                    last_maintenance = now
                    self.hub.maintain(now)
                    procmem.trim()
            except Exception:  # the loop must outlive any one bad evaluation
                self.hub.counters.inc("evaluator_errors")
                log.exception("evaluation failed")

    def stop(self) -> None:
        """No evaluation starts after this returns (one under way is waited for, up to 10 s)."""
        self.stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)
