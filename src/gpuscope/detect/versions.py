"""A regression that starts with a model version: ``version_regression``.

At a ``model_version_promoted`` event the service's latency and error ratio *before* it (medians
of the last ten minutes, so an earlier incident that has ended does not skew them) are frozen as
the reference. For ``window`` seconds after, if the service's p95 latency
(short EWMA) stays ``ratio`` times the reference, or its error ratio rises by ``error_rise``
above it, for ``sustain`` seconds, the new version is named as the cause. A rollback is a new
promotion whose reference is the bad version, so recovering does not fire. A version the service's
reports never name after its promotion (promoted by hand, never deployed) served no request and is
not blamed; reports that carry no version label at all leave the promotion as the only clue.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpuscope.detect.base import ServiceDetector, register
from gpuscope.detect.services import Snapshot
from gpuscope.model import Event, Finding
from gpuscope.rules import VERSION_REGRESSION as RULE


@dataclass(slots=True)
class _Svc:
    last: float = math.nan
    latency: float = math.nan  # short EWMA
    latency_base: float = math.nan  # long EWMA
    errors: float = math.nan  # error ratio, short
    errors_base: float = math.nan
    promoted: tuple[float, str, str, float, float] | None = None  # ts, model, version, latency ref, error ref
    since: float | None = None
    text: str = ""
    #: since the promotion: were the service's reports labelled with a version, and with this one?
    labelled: bool = False
    served: bool = False
    samples: deque[tuple[float, float, float]] = field(default_factory=deque)  # (ts, p95, error ratio)
    #: which latency the snapshots carry: "p95", or "mean" from an engine that reports only that
    latency_stat: str = "p95"


def _ewma(mean: float, value: float, dt: float, tau: float) -> float:
    if not math.isfinite(value):
        return mean
    if not math.isfinite(mean):
        return value
    return mean + (1.0 - math.exp(-dt / tau)) * (value - mean)


@register
class VersionDetector(ServiceDetector):
    rules = (RULE,)

    def __init__(
        self, window: float = 1800.0, ratio: float = 1.25, error_rise: float = 0.01, sustain: float = 30.0
    ) -> None:
        self.window, self.ratio, self.error_rise, self.sustain = window, ratio, error_rise, sustain
        super().__init__()
        self._svcs: dict[str, _Svc] = {}

    def on_event(self, event: Event) -> None:
        if event.kind != "model_version_promoted":
            return
        name = event.labels.get("service") or str(event.data.get("service", ""))
        if not name:
            return
        svc = self._svcs.setdefault(name, _Svc())
        model = event.labels.get("model") or str(event.data.get("model", ""))
        version = event.labels.get("version") or str(event.data.get("version", ""))
        svc.promoted = (event.ts, model, version, svc.latency_base, svc.errors_base)
        svc.since = None
        svc.labelled = svc.served = False

    def judge(self, now: float, snapshots: dict[str, Snapshot]) -> list[Finding]:
        """Fold in the services' new snapshots; the findings that hold at ``now``."""
        for name, s in snapshots.items():
            svc = self._svcs.setdefault(name, _Svc())
            dt = min(max(s.ts - svc.last, 0.0), 10.0) if math.isfinite(svc.last) else 1.0
            svc.last = s.ts
            ratio = s.errors / max(s.requests, s.errors, 1e-9)
            svc.latency = _ewma(svc.latency, s.p95, dt, 20.0)
            svc.latency_stat = s.latency_stat
            svc.errors = _ewma(svc.errors, ratio, dt, 120.0)
            if svc.promoted is None or s.ts - svc.promoted[0] > self.window:
                self._reference(svc, s.ts, s.p95, ratio)
            elif s.version and s.ts >= svc.promoted[0]:
                svc.labelled = True
                svc.served = svc.served or s.version == svc.promoted[2]
            self._judge(svc, s.ts)
        out: list[Finding] = []
        for name, svc in self._svcs.items():
            if svc.promoted is None or svc.since is None or svc.last - svc.since < self.sustain:
                continue
            if svc.labelled and not svc.served:  # reports name the versions serving: not this one
                continue
            ts, model, version, _, _ = svc.promoted
            if now - ts > self.window + 600.0:
                continue
            entity = {"service": name, "version": version} | ({"model": model} if model else {})
            out.append(
                Finding(
                    RULE,
                    entity,
                    f"Service {name}: since version {version} was promoted {svc.last - ts:.0f} s ago, "
                    + svc.text,
                    details={"promoted_at": ts, "model": model, "version": version},
                )
            )
        return out

    @staticmethod
    def _reference(svc: _Svc, ts: float, p95: float, ratio: float) -> None:
        """The medians of the last ten minutes (sampled every 10 s): what the service did before."""
        if svc.samples and ts - svc.samples[-1][0] < 10.0:
            return
        svc.samples.append((ts, p95, ratio))
        while ts - svc.samples[0][0] > 600.0:
            svc.samples.popleft()
        lat = np.array([x[1] for x in svc.samples])
        err = np.array([x[2] for x in svc.samples])
        svc.latency_base = float(np.nanmedian(lat)) if np.isfinite(lat).any() else math.nan
        svc.errors_base = float(np.nanmedian(err)) if np.isfinite(err).any() else math.nan

    def _judge(self, svc: _Svc, ts: float) -> None:
        if svc.promoted is None or ts - svc.promoted[0] > self.window:
            svc.since = None
            return
        _, _, _, lat_ref, err_ref = svc.promoted
        parts = []
        if math.isfinite(lat_ref) and lat_ref > 0 and svc.latency >= self.ratio * lat_ref:
            parts.append(
                f"{svc.latency_stat} latency {svc.latency:.3g} s vs {lat_ref:.3g} s before "
                f"({svc.latency / lat_ref:.1f}x)"
            )
        if math.isfinite(err_ref) and svc.errors >= err_ref + self.error_rise and svc.errors >= 2 * err_ref:
            parts.append(f"error ratio {svc.errors:.2%} vs {err_ref:.2%} before")
        if parts:
            svc.since = svc.since if svc.since is not None else ts
            svc.text = "; ".join(parts)
        else:
            svc.since = None
