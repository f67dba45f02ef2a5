"""``business_metric_drop``: a service's downstream metric (conversion, acceptance) fell below its baseline.

The quality monitor publishes, per service and metric, ``model_business_metric_baseline`` (an EWMA
of the earlier reports) and ``model_business_metric_ratio`` (this report over that baseline). The
baseline keeps learning, so a lasting drop would soon look normal: this detector keeps its own
reference, the monitor's baseline, frozen while a drop is pending or firing. The recent level is
the mean of the last ``reports`` values; it must sit below the reference by ``min_drop`` and by
four standard errors of the metric's own report-to-report noise (learned while healthy, each
report's share capped), for ``sustain`` seconds. The rule does not fire in the first ``warmup``
seconds of a series, but a drop there already pends and freezes the reference: the monitor's
baseline would learn a drop that began in the warm-up before the rule may judge.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from gpuscope.counters import Counters
from gpuscope.detect.base import Detector, register
from gpuscope.detect.frames import FrameView
from gpuscope.model import Finding, Frame, Labels
from gpuscope.rules import BUSINESS_METRIC_DROP as RULE

BASELINE, RATIO = "model_business_metric_baseline", "model_business_metric_ratio"


@dataclass(slots=True)
class _Series:
    first: float
    last: float
    labels: Labels
    reference: float = math.nan
    noise: float = math.nan  # EWMA of the squared relative deviation of one report
    recent: deque[float] = field(default_factory=deque)
    since: float | None = None
    firing: bool = False
    level: float = math.nan
    limit: float = math.nan


@register
class BusinessDetector(Detector):
    rules = (RULE,)

    def __init__(
        self,
        min_drop: float = 0.15,
        reports: int = 3,
        sustain: float = 90.0,
        warmup: float = 600.0,
        noise_tau: float = 3600.0,
        stale: float = 600.0,
    ) -> None:
        if not 0.0 < min_drop < 1.0 or reports < 1 or noise_tau <= 0 or stale <= 0:
            raise ValueError("min_drop in (0, 1), reports >= 1, noise_tau and stale positive")
        self.min_drop, self.reports, self.sustain = min_drop, reports, sustain
        self.warmup, self.noise_tau, self.stale = warmup, noise_tau, stale
        self.counters = Counters()
        self._series: dict[tuple[str, str], _Series] = {}

    def reads(self, frame: FrameView) -> bool:
        return RATIO in frame.frame.metrics

    def on_frame(self, frame: Frame) -> None:
        if RATIO not in frame.metrics:  # most frames: GPU and node telemetry
            return
        ratios = frame.column(RATIO)
        baselines = frame.column(BASELINE)
        if ratios is None or baselines is None:
            return
        for i, labels in enumerate(frame.entities):
            service = labels.get("service")
            ratio, baseline = float(ratios[i]), float(baselines[i])
            if not service or not (math.isfinite(ratio) and math.isfinite(baseline)) or baseline <= 0:
                self.counters.inc("business_rows_refused")
                continue
            self._update(frame.ts, (service, labels.get("metric", "")), labels, ratio * baseline, baseline)

    def _update(self, ts: float, key: tuple[str, str], labels: Labels, value: float, baseline: float) -> None:
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = _Series(ts, ts, dict(labels))
        dt = max(ts - s.last, 0.0)
        s.last, s.labels = ts, dict(labels)
        s.recent.append(value)
        while len(s.recent) > self.reports:
            s.recent.popleft()
        held = s.since is not None
        if not held or not math.isfinite(s.reference):
            s.reference = baseline
            dev = min((value / baseline - 1.0) ** 2, self.min_drop**2)  # a drop must not teach noise
            w = 1.0 - math.exp(-dt / self.noise_tau) if math.isfinite(s.noise) else 1.0
            s.noise = dev if not math.isfinite(s.noise) else s.noise + w * (dev - s.noise)
        s.level = sum(s.recent) / len(s.recent)
        drop = max(self.min_drop, 4.0 * math.sqrt(s.noise / len(s.recent)))
        s.limit = s.reference * (1.0 - drop)
        warm = ts - s.first >= self.warmup
        if len(s.recent) == self.reports and s.level <= s.limit:
            s.since = s.since if s.since is not None else ts
        elif s.level >= s.reference * (1.0 - 0.5 * drop) or not s.firing:
            s.since = None
        s.firing = warm and s.since is not None and ts - s.since >= self.sustain

    def learns_first(self) -> dict[str, float]:
        return {RULE: self.warmup}

    def evaluate(self, now: float) -> list[Finding]:
        worst: dict[str, tuple[str, _Series]] = {}
        for (service, metric), s in self._series.items():
            if not s.firing or now - s.last > self.stale:
                continue
            seen = worst.get(service)
            if seen is None or s.level / s.reference < seen[1].level / seen[1].reference:
                worst[service] = (metric, s)
        return [self._finding(service, metric, s) for service, (metric, s) in worst.items()]

    def _finding(self, service: str, metric: str, s: _Series) -> Finding:
        lb = s.labels
        entity = {"service": service} | {k: lb[k] for k in ("model", "version") if k in lb}
        ratio = s.level / s.reference
        return Finding(
            RULE,
            entity,
            f"Service {service} ({lb.get('model', '?')} {lb.get('version', '?')}): "
            f"{metric or 'business metric'} at {s.level:.3g}, "
            f"{1.0 - ratio:.0%} below its baseline of {s.reference:.3g}",
            value=ratio,
            details={"metric": metric, "level": s.level, "baseline": s.reference, "limit": s.limit},
        )
