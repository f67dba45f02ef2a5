"""An inference service as one entity: its per-node rows merged into one snapshot per evaluation.

Serving engines report per node (``service``, ``model``, ``version``, ``node`` labels); the rules
are about the service. Rates and queues add up over nodes, latencies are request-weighted means
(p95; an engine that reports only a mean since its last scrape, Triton by default, gives that),
the KV cache is the fullest node's, preemption counters become a rate. Rows older than
``stale`` seconds (a node that stopped reporting) are left out.

What the error budget counts (requests and errors served) is counted from every row, once, for
the node's own reporting interval: a snapshot is made once per evaluation from each node's latest
row, and an overloaded hub takes a sender's seconds late, several at once, out of order, some
twice, or never. Weighted by the time since the service's previous snapshot instead, the one row
after a hole stood for the whole hole (up to 10 s: a replayed second with one error counted ten),
and the rows that arrived with it were never counted. Each snapshot carries the requests and
errors of the rows newly counted (``served``, ``failed``, over ``covered`` seconds): rows that
came late are counted when they come, a row seen again (a retry) is not counted twice, and a row
older than the node's last ``KEEP`` counted ones is too late to tell and is counted in
``late_rows``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from dataclasses import dataclass, field

from gpuscope.model import Frame, positions

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
#: per node, the times of its last rows counted: a retry of one of them is not counted again
KEEP = 256
#: a node's reporting interval is taken as at most this (a row stands for no longer)
LONGEST_INTERVAL = 60.0


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
    #: requests served and failed in the rows newly counted for this snapshot (each row once, for
    #: its node's reporting interval); NaN: not counted (a snapshot made by hand), and the rates
    #: stand for the time since the previous snapshot
    served: float = math.nan
    failed: float = math.nan
    #: the seconds those rows stand for
    covered: float = math.nan


@dataclass(slots=True)
class _Service:
    rows: dict[str, tuple[float, dict[str, float]]] = field(default_factory=dict)  # node -> (ts, values)
    model: str = ""
    version: str = ""
    preempt_prev: dict[str, float] = field(default_factory=dict)
    last_ts: float = -math.inf
    #: per node, the sorted times of its last ``KEEP`` rows counted
    counted: dict[str, list[float]] = field(default_factory=dict)
    #: requests and errors of the rows counted since the last snapshot, and the seconds they cover
    served: float = 0.0
    failed: float = 0.0
    covered: float = 0.0

    def count(self, node: str, ts: float, requests: float, errors: float) -> bool:
        """Count a row's requests and errors for its node's reporting interval, once; False
        when it came too late to tell whether it was counted before (and is not counted)."""
        times = self.counted.setdefault(node, [])
        i = bisect.bisect_left(times, ts)
        if i < len(times) and times[i] == ts:
            return True  # seen before: a retry, or the same row again
        if i == 0 and len(times) >= KEEP:
            return False
        times.insert(i, ts)
        if len(times) > KEEP:
            del times[0]
        # the node's interval: the median gap between its recent rows (a hole is one wide gap)
        gaps = [b - a for a, b in itertools.pairwise(times[-17:])]
        interval = min(max(statistics.median(gaps) if gaps else 1.0, 1e-3), LONGEST_INTERVAL)
        self.covered += interval
        if math.isfinite(requests):
            self.served += requests * interval
        if math.isfinite(errors):
            self.failed += errors * interval
        return True


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
        #: rows older than a node's last ``KEEP`` counted ones: too late for the error budget
        self.late_rows = 0

    def on_frame(self, frame: Frame) -> None:
        at = positions(frame)  # every frame comes here: a look-up per layout, not a scan per name
        if REQUESTS not in at and P95 not in at and MEAN not in at:
            return
        cols = [(m, j) for m in METRICS if (j := at.get(m)) is not None]
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
            node = labels.get("node", "")
            values = {m: float(row[j]) for m, j in cols}
            if not svc.count(node, frame.ts, values.get(REQUESTS, math.nan), values.get(ERRORS, math.nan)):
                self.late_rows += 1
            held = svc.rows.get(node)
            # a late row does not stand for the node's present: its latest row does
            if held is None or frame.ts >= held[0]:
                svc.rows[node] = (frame.ts, values)

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
                served=svc.served,
                failed=svc.failed,
                covered=svc.covered,
            )
            svc.served = svc.failed = svc.covered = 0.0
        return out
