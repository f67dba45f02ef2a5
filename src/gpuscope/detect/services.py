"""An inference service as one entity: its per-node rows merged into one snapshot per evaluation.

Serving engines report per node (``service``, ``model``, ``version``, ``node`` labels); the rules
are about the service. Rates and queues add up over nodes, latencies are request-weighted means
(p95; an engine that reports only a mean since its last scrape, Triton by default, gives that),
the KV cache is the fullest node's, preemption counters become a rate. Rows older than
``stale`` seconds (a node that stopped reporting) are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuscope.model import Frame

REQUESTS = "inference_requests_per_second"
ERRORS = "inference_errors_per_second"
P95 = "inference_latency_p95_seconds"
P99 = "inference_latency_p99_seconds"
MEAN = "inference_latency_mean_seconds"
TTFT = "inference_ttft_p95_seconds"
QUEUE = "inference_queue_depth"
KV = "inference_kv_cache_usage_ratio"
PREEMPT = "inference_preemptions_total"
METRICS = (REQUESTS, ERRORS, P95, P99, MEAN, TTFT, QUEUE, KV, PREEMPT)


@dataclass(slots=True)
class Snapshot:
    ts: float
    requests: float
    errors: float
    p95: float
    p99: float
    ttft: float
    queue: float
    kv: float
    preempted: float  # preemptions since the previous snapshot
    model: str
    version: str
    nodes: list[str]
    #: the latency the regression rule follows: "p95", or "mean" where no row has a p95
    latency_stat: str = "p95"


@dataclass(slots=True)
class _Service:
    rows: dict[str, tuple[float, dict[str, float]]] = field(default_factory=dict)  # node -> (ts, values)
    model: str = ""
    version: str = ""
    preempt_prev: dict[str, float] = field(default_factory=dict)
    last_ts: float = -math.inf


def _wmean(values: list[float], weights: list[float]) -> float:
    num = den = 0.0
    finite = [v for v in values if math.isfinite(v)]
    for v, w in zip(values, weights, strict=True):
        if math.isfinite(v) and math.isfinite(w) and w > 0:
            num += v * w
            den += w
    if den > 0:
        return num / den
    return sum(finite) / len(finite) if finite else math.nan


def _sum(values: list[float]) -> float:
    return math.fsum(v for v in values if math.isfinite(v))


class ServiceAggregator:
    def __init__(self, stale: float = 10.0) -> None:
        self.stale = stale
        self.services: dict[str, _Service] = {}

    def on_frame(self, frame: Frame) -> None:
        if REQUESTS not in frame.metrics and P95 not in frame.metrics and MEAN not in frame.metrics:
            return
        cols = [(m, frame.metrics.index(m)) for m in METRICS if m in frame.metrics]
        for i, labels in enumerate(frame.entities):
            name = labels.get("service")
            if name is None:
                continue
            svc = self.services.get(name)
            if svc is None:
                svc = self.services[name] = _Service()
            svc.model = labels.get("model", svc.model)
            svc.version = labels.get("version", svc.version)
            row = frame.values[i]
            svc.rows[labels.get("node", "")] = (frame.ts, {m: float(row[j]) for m, j in cols})

    def snapshots(self) -> dict[str, Snapshot]:
        """One snapshot per service that has new rows since the last call."""
        out: dict[str, Snapshot] = {}
        for name, svc in self.services.items():
            if not svc.rows:
                continue
            newest = max(ts for ts, _ in svc.rows.values())
            if newest <= svc.last_ts:
                continue
            svc.last_ts = newest
            live = {n: vals for n, (ts, vals) in svc.rows.items() if ts >= newest - self.stale}
            rows = list(live.values())
            req = [r.get(REQUESTS, math.nan) for r in rows]
            preempted = 0.0
            for node, r in live.items():
                total = r.get(PREEMPT, math.nan)
                prev = svc.preempt_prev.get(node)
                if math.isfinite(total):
                    if prev is not None and total >= prev:
                        preempted += total - prev
                    svc.preempt_prev[node] = total
            p95 = _wmean([r.get(P95, math.nan) for r in rows], req)
            stat = "p95"
            if not math.isfinite(p95):
                p95 = _wmean([r.get(MEAN, math.nan) for r in rows], req)
                stat = "mean" if math.isfinite(p95) else stat
            out[name] = Snapshot(
                ts=newest,
                requests=_sum(req),
                errors=_sum([r.get(ERRORS, math.nan) for r in rows]),
                p95=p95,
                p99=_wmean([r.get(P99, math.nan) for r in rows], req),
                ttft=_wmean([r.get(TTFT, math.nan) for r in rows], req),
                queue=_sum([r.get(QUEUE, math.nan) for r in rows]),
                kv=max((x for r in rows if math.isfinite(x := r.get(KV, math.nan))), default=math.nan),
                preempted=preempted,
                model=svc.model,
                version=svc.version,
                nodes=sorted(live),
                latency_stat=stat,
            )
        return out
