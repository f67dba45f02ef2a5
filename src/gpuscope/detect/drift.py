"""Model-quality drift: ``prediction_drift``, ``confidence_shift`` and ``input_drift`` per service.

The hub's quality monitor (:mod:`gpuscope.quality.monitor`) compares each window's sketches with a
frozen reference and publishes ``model_<signal>_drift_score`` and ``model_<signal>_drifted`` per
service and feature; this detector judges those series. A feature drifts when the monitor's test
says so *and* the score is material (``min_score``: a distance of 0.2 is twice the monitor's own
threshold, so sampling noise and slow daily movement stay quiet) and held long enough: a score at
``min_score`` for ``sustain`` seconds, a stronger one for less in proportion (twice the score, half
the time; never under ``min_hold``). The monitor's score already averages its last windows, so it
lags a drift's onset and falls once the drift ends: a drift of five minutes is material for less
than five, and a strong score held for less time is as much evidence as a mild one held for
``sustain``. It clears when the score falls under half of ``min_score`` or the test no longer
rejects, and goes quiet when a service stops sending sketches for ``stale`` seconds. One finding
per service and rule names the features that drift, worst first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuscope.counters import Counters
from gpuscope.detect.base import Detector, register
from gpuscope.detect.frames import FrameView
from gpuscope.model import Finding, Frame, Labels

RULES = {"prediction": "prediction_drift", "confidence": "confidence_shift", "input": "input_drift"}
WHAT = {"prediction": "prediction", "confidence": "confidence", "input": "input feature"}
_COLUMNS = {signal: (f"model_{signal}_drift_score", f"model_{signal}_drifted") for signal in RULES}
_SCORES = frozenset(score for score, _ in _COLUMNS.values())


@dataclass(slots=True)
class _Feature:
    last: float
    labels: Labels
    score: float = math.nan
    since: float | None = None
    held: float = 0.0  # seconds of pending, each weighted by its score over min_score
    firing: bool = False


@dataclass(slots=True)
class _Service:
    features: dict[tuple[str, str], _Feature] = field(default_factory=dict)  # (signal, feature)


@register
class DriftDetector(Detector):
    rules = tuple(RULES.values())

    def __init__(
        self, min_score: float = 0.2, sustain: float = 300.0, stale: float = 600.0, min_hold: float = 120.0
    ) -> None:
        if min_score <= 0 or sustain < 0 or stale <= 0 or min_hold < 0:
            raise ValueError("min_score and stale must be positive, sustain and min_hold not negative")
        self.min_score, self.sustain, self.stale = min_score, sustain, stale
        self.min_hold = min(min_hold, sustain)
        self.counters = Counters()
        self._services: dict[str, _Service] = {}

    def reads(self, frame: FrameView) -> bool:
        return not _SCORES.isdisjoint(frame.frame.metrics)

    def on_frame(self, frame: Frame) -> None:
        if _SCORES.isdisjoint(frame.metrics):  # most frames: GPU and node telemetry
            return
        for signal, (score_name, flag_name) in _COLUMNS.items():
            scores = frame.column(score_name)
            if scores is None:
                continue
            flags = frame.column(flag_name)
            for i, labels in enumerate(frame.entities):
                service = labels.get("service")
                score = float(scores[i])
                flag = float(flags[i]) if flags is not None else math.nan
                if not service or not math.isfinite(score) or not math.isfinite(flag):
                    self.counters.inc("drift_rows_refused")
                    continue
                self._update(frame.ts, service, signal, labels, score, flag >= 0.5)

    def _update(self, ts: float, service: str, signal: str, labels: Labels, score: float, flag: bool) -> None:
        svc = self._services.setdefault(service, _Service())
        key = (signal, labels.get("feature", signal))
        f = svc.features.get(key)
        if f is None:
            f = svc.features[key] = _Feature(ts, dict(labels))
        previous, gap = f.score, max(ts - f.last, 0.0)
        f.last, f.labels, f.score = ts, dict(labels), score
        if flag and score >= self.min_score:
            if f.since is None:
                f.since, f.held = ts, 0.0
            else:  # the weaker end of the interval: one strong window alone proves nothing
                f.held += gap * min(previous, score) / self.min_score
        elif not flag or score < 0.5 * self.min_score or not f.firing:
            f.since = None
        f.firing = f.since is not None and (
            f.firing or (ts - f.since >= self.min_hold and f.held >= self.sustain)
        )

    def evaluate(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for service, svc in self._services.items():
            for signal, rule in RULES.items():
                live = [
                    (name, f)
                    for (sig, name), f in svc.features.items()
                    if sig == signal and f.firing and now - f.last <= self.stale
                ]
                if live:
                    out.append(self._finding(rule, signal, service, live))
        return out

    def _finding(self, rule: str, signal: str, service: str, live: list[tuple[str, _Feature]]) -> Finding:
        live.sort(key=lambda nf: -nf[1].score)
        worst = live[0][1]
        labels = worst.labels
        entity = {"service": service} | {k: labels[k] for k in ("model", "version") if k in labels}
        drifting = ", ".join(f"{n} ({f.score:.2f})" for n, f in live)
        what = WHAT[signal] if signal != "input" else f"input feature{'s' if len(live) > 1 else ''}"
        return Finding(
            rule,
            entity,
            f"Service {service} ({labels.get('model', '?')} {labels.get('version', '?')}): {what} "
            f"drifted from the reference: {drifting}",
            value=worst.score,
            details={"features": {n: f.score for n, f in live}, "min_score": self.min_score},
        )
