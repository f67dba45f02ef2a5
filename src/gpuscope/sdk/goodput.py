"""Goodput: how much of a rank's wall time went into productive steps, and where the rest went.

Badput is split by cause so the fix is obvious: initialisation (until the first step), checkpoint
saves and restores, waiting for input data, and progress lost to a restart (a step number seen
again: the steps between it and the highest step reached are paid for twice). The highest step
survives the process in a small state file, so a restarted rank notices the progress it lost.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpuscope.sdk.goodput")

BADPUT_KINDS = ("init", "checkpoint", "restore", "data_wait", "restart")


@dataclass(frozen=True, slots=True)
class GoodputReport:
    elapsed_seconds: float
    productive_seconds: float
    badput_seconds: dict[str, float]

    @property
    def ratio(self) -> float:
        return self.productive_seconds / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    def metrics(self) -> dict[str, float]:
        """The report as training-record metrics (cumulative seconds, and the ratio)."""
        out = {"goodput_productive_seconds_total": self.productive_seconds, "goodput_ratio": self.ratio}
        for kind, seconds in self.badput_seconds.items():
            out[f"badput_{kind}_seconds_total"] = seconds
        return out


class Goodput:
    """Accumulates productive and lost time for one rank; safe to feed from several threads."""

    def __init__(self, started_at: float, state_file: Path | None = None) -> None:
        self.started_at = started_at
        self.state_file = state_file
        self._lock = threading.Lock()
        self._badput = dict.fromkeys(BADPUT_KINDS, 0.0)
        self._productive = 0.0
        self._first_step_at: float | None = None
        self._max_step = -1
        self._last_step = -1
        self._steps_timed = 0
        self._step_seconds_sum = 0.0
        self._prior = self._load()
        self.restarts = 0

    def _load(self) -> tuple[int, float] | None:
        """(highest step, mean step seconds) a previous process of this rank reached, if any."""
        if self.state_file is None:
            return None
        try:
            obj = json.loads(self.state_file.read_text())
            step, mean = int(obj["max_step"]), float(obj["mean_step_seconds"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "gpuscope: goodput state %s unreadable (%s); restart loss not measured", self.state_file, exc
            )
            return None
        return (step, mean) if step >= 0 and math.isfinite(mean) and mean >= 0 else None

    def save(self) -> None:
        """Persist the highest step and mean step time, for a restarted process of this rank."""
        if self.state_file is None:
            return
        with self._lock:
            state = {"max_step": self._max_step, "mean_step_seconds": self._mean()}
        if state["max_step"] < 0:
            return
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.state_file)
        except OSError as exc:
            log.warning("gpuscope: cannot save goodput state %s (%s)", self.state_file, exc)

    def _mean(self) -> float:
        return self._step_seconds_sum / self._steps_timed if self._steps_timed else 0.0

    def first_step(self, at: float) -> None:
        """The first step began: everything before it was initialisation."""
        with self._lock:
            if self._first_step_at is None:
                self._first_step_at = at
                self._badput["init"] = max(0.0, at - self.started_at)

    def add(self, kind: str, seconds: float) -> None:
        if kind not in self._badput:
            raise ValueError(f"unknown badput kind {kind!r}; one of {', '.join(BADPUT_KINDS)}")
        if math.isfinite(seconds) and seconds > 0:
            with self._lock:
                self._badput[kind] += seconds

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """Account one step's record (its metrics merged from every report of that step)."""
        seconds = metrics.get("step_seconds", math.nan)
        wait = metrics.get("data_wait_seconds", math.nan)
        with self._lock:
            if step != self._last_step:
                self._seen(step)
            self._last_step = step
            wait = wait if math.isfinite(wait) and wait > 0 else 0.0
            self._badput["data_wait"] += wait
            if math.isfinite(seconds) and seconds > 0:
                self._productive += max(0.0, seconds - wait)
                self._steps_timed += 1
                self._step_seconds_sum += seconds

    def _seen(self, step: int) -> None:
        prior_max, mean = self._max_step, self._mean()
        if self._prior is not None and self._max_step < 0:
            prior_max, mean = self._prior
        if 0 <= step <= prior_max:
            self._badput["restart"] += (prior_max - step + 1) * mean
            self.restarts += 1
            self._max_step = step
            self._prior = None
            return
        self._max_step = max(self._max_step, step)

    def report(self, now: float) -> GoodputReport:
        with self._lock:
            return GoodputReport(
                elapsed_seconds=max(0.0, now - self.started_at),
                productive_seconds=self._productive,
                badput_seconds=dict(self._badput),
            )
