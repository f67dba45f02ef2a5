"""The hub side of model quality: sketches in, drift scores, business baselines and burn rates out.

The inference SDK sends ``quality_sketch`` events (a sketch of predictions, confidences or one
input feature over a window) and ``serving_window`` events (request and failure counts with a
latency sketch). Per service, signal and feature the first ``reference_count`` observations form
the reference, frozen from then on; the last ``current_windows`` sketches form the current
distribution. Each new sketch publishes ``model_<signal>_drift_score`` (labels service, model,
version, feature; the method is in :mod:`~gpuscope.quality.drift`) and ``model_<signal>_drifted``.

Drift tools take as reference a window known to be good (Evidently and NannyML a chosen period or
the training data); the hub has only the first windows, and a drift that starts while they are
learned would be learned as normal (a third of the reference, on a service whose SDK samples 400
requests per 30 s window and drifts at 60 s). So once the reference holds a quarter of its
observations, two sketches in a row far from it (the small-sample test rejects at ``refuse_p``
*and* the distance is at least ``refuse_distance``) end the learning: the reference keeps what it
had and those two are the first current ones. One far sketch followed by a near one is noise, and
both are learned.

Business metrics get an EWMA baseline (``model_business_metric_baseline`` and ``_ratio``), and
``serving_window`` counts feed the SLO burn rates (``slo_burn_rate``, ``slo_burn_alert``).
State is bounded by the number of series, never by the number of predictions.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpuscope.counters import Counters
from gpuscope.model import Batch, Event, Frame, Labels
from gpuscope.quality.drift import drift, method_for
from gpuscope.quality.sketch import NumericSketch, Sketch, SketchError, sketch_from_json
from gpuscope.quality.slo import PAIRS, BurnRates, Slo

if TYPE_CHECKING:
    from gpuscope.hub import Hub

SIGNALS = ("prediction", "confidence", "input")
SOURCE = "quality"


@dataclass(slots=True)
class _Drift:
    reference: Sketch | None = None
    method: str | None = None  # chosen when the reference is complete
    suspect: Sketch | None = None  # a sketch far from the reference while it learns, held aside
    current: deque[Sketch] = field(default_factory=deque)


class QualityMonitor:
    def __init__(
        self,
        slos: Sequence[Slo] = (),
        *,
        reference_count: int = 1000,
        current_windows: int = 6,
        business_tau: float = 1800.0,
        refuse_p: float = 0.001,
        refuse_distance: float = 0.2,
        counters: Counters | None = None,
    ) -> None:
        self.reference_count = reference_count
        self.current_windows = current_windows
        self.refuse_p, self.refuse_distance = refuse_p, refuse_distance
        self.business_tau = business_tau
        self.counters = counters if counters is not None else Counters()
        self._drift: dict[tuple[str, str, str], _Drift] = {}
        self._business: dict[tuple[str, str], tuple[float, float]] = {}  # (ts, baseline)
        self._slos: dict[str, list[BurnRates]] = {}
        for slo in slos:
            self._slos.setdefault(slo.service, []).append(BurnRates(slo))

    def attach(self, hub: Hub) -> None:
        """Watch every batch the hub ingests and ingest what it derives (needs ``Hub.add_observer``)."""

        def observer(batch: Batch) -> None:
            if batch.source == SOURCE:
                return
            derived = self.observe(batch)
            if derived is not None:
                hub.ingest(derived)

        hub.add_observer(observer)

    def observe(self, batch: Batch) -> Batch | None:
        rows: list[tuple[float, Labels, dict[str, float]]] = []
        for event in batch.events:
            if event.kind == "quality_sketch":
                rows.extend(self._sketch(event))
            elif event.kind == "serving_window":
                rows.extend(self._window(event))
        for f in batch.frames:
            col = f.column("model_business_metric")
            if col is not None:
                rows.extend(self._business_rows(f.ts, f.entities, col))
        if not rows:
            return None
        return Batch(SOURCE, frames=[_frame(ts, labels, values) for ts, labels, values in rows])

    # -- drift -----------------------------------------------------------------------------------

    def _sketch(self, event: Event) -> list[tuple[float, Labels, dict[str, float]]]:
        lb = event.labels
        signal, service = lb.get("signal", ""), lb.get("service", "")
        if signal not in SIGNALS or not service:
            self.counters.inc("quality_refused_sketches")
            return []
        try:
            sk = sketch_from_json(event.data.get("sketch"))
        except SketchError:
            self.counters.inc("quality_refused_sketches")
            return []
        feature = lb.get("feature", signal)
        state = self._drift.setdefault((service, signal, feature), _Drift())
        if state.method is None and not self._learn(state, sk):
            return []
        if state.reference is None or type(state.reference) is not type(sk):
            self.counters.inc("quality_refused_sketches")
            return []
        state.current.append(sk)
        while len(state.current) > self.current_windows:
            state.current.popleft()
        current = sketch_from_json(state.current[0].to_json())
        for extra in list(state.current)[1:]:
            current.merge(extra)  # type: ignore[arg-type]
        result = drift(state.reference, current, state.method)
        labels = {k: lb[k] for k in ("service", "model", "version", "node") if k in lb} | {"feature": feature}
        values = {
            f"model_{signal}_drift_score": result.score,
            f"model_{signal}_drifted": float(result.drifted),
        }
        self.counters.inc("quality_drift_evaluations")
        return [(event.ts, labels, values)]

    def _learn(self, state: _Drift, sk: Sketch) -> bool:
        """Learn ``sk`` into the reference; True when it ended the learning and is to be judged."""
        ref = state.reference
        if ref is None:
            state.reference = sk
            return False
        if type(ref) is not type(sk):
            return False
        if ref.count >= self.reference_count // 4 and self._far(ref, sk):
            if state.suspect is None:
                state.suspect = sk
                return False
            state.current.append(state.suspect)
            state.suspect = None
            # a test on a reference cut short would flag the daily movement of a current window
            # larger than it: judge it by distance, as a full one
            state.method = method_for(isinstance(ref, NumericSketch), math.inf)
            self.counters.inc("quality_references_cut_short")
            return True
        for learnt in (state.suspect, sk):
            if learnt is not None:
                ref.merge(learnt)  # type: ignore[arg-type]
        state.suspect = None
        if ref.count >= self.reference_count:
            state.method = method_for(isinstance(ref, NumericSketch), ref.count)
        return False

    def _far(self, ref: Sketch, sk: Sketch) -> bool:
        if not sk.count:
            return False
        numeric = isinstance(ref, NumericSketch)
        test = drift(ref, sk, method_for(numeric, 0.0))
        if test.p_value is None or test.p_value >= self.refuse_p:
            return False
        return drift(ref, sk, method_for(numeric, math.inf)).score >= self.refuse_distance

    # -- business --------------------------------------------------------------------------------

    def _business_rows(
        self, ts: float, entities: list[Labels], col: np.ndarray
    ) -> list[tuple[float, Labels, dict[str, float]]]:
        out = []
        for labels, value in zip(entities, col.tolist(), strict=True):
            if not math.isfinite(value):
                continue
            key = (labels.get("service", ""), labels.get("metric", ""))
            last = self._business.get(key)
            if last is None:
                baseline = value
            else:
                weight = 1.0 - math.exp(-max(ts - last[0], 0.0) / self.business_tau)
                baseline = last[1] + weight * (value - last[1])
            self._business[key] = (ts, baseline)
            ref = last[1] if last is not None else value  # compare with the baseline before this value
            ratio = value / ref if ref else math.nan
            out.append(
                (
                    ts,
                    dict(labels),
                    {"model_business_metric_baseline": ref, "model_business_metric_ratio": ratio},
                )
            )
        return out

    # -- error budgets ---------------------------------------------------------------------------

    def _window(self, event: Event) -> list[tuple[float, Labels, dict[str, float]]]:
        service = event.labels.get("service", "")
        trackers = self._slos.get(service)
        if not trackers:
            return []
        try:
            total = float(event.data["requests"])
            errors = float(event.data["errors"])
            latency = sketch_from_json(event.data["latency"])
        except (KeyError, TypeError, ValueError, SketchError):
            self.counters.inc("quality_refused_windows")
            return []
        out = []
        for tracker in trackers:
            slo = tracker.slo
            bad = errors
            if slo.kind == "latency" and isinstance(latency, NumericSketch) and slo.threshold_seconds:
                v, c = latency.points()
                bad += float(c[v > slo.threshold_seconds].sum())
            try:
                tracker.add(event.ts, total, min(bad, total))
            except ValueError:
                self.counters.inc("quality_refused_windows")
                continue
            result = tracker.evaluate(event.ts)
            base = {"service": service, "slo": slo.kind}
            for window, rate in result["windows"].items():
                out.append((event.ts, base | {"window": window}, {"slo_burn_rate": rate}))
            for pair, _, _, _ in PAIRS:
                out.append(
                    (event.ts, base | {"pair": pair}, {"slo_burn_alert": float(result["alerts"][pair])})
                )
        return out


def _frame(ts: float, labels: Labels, values: dict[str, float]) -> Frame:
    names = sorted(values)
    return Frame(ts, names, [labels], np.array([[values[n] for n in names]], dtype=np.float64))
