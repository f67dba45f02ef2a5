"""The serving rules on real serving time series: Alibaba's GenAI serving trace, in virtual time.

Reads ``alibaba_v2026_genai`` of ../shared/data (eval/datapath.py; skipped when absent): a
production Stable-Diffusion serving system over ~23 hours, per container one sample every 57 or
114 s (values scaled for anonymisation; the source says the data hold normal and abnormal
periods, without labels). Each series becomes what an inference service reports, under the names
the hub reads (:mod:`gpuscope.detect.services`):

* a *container* service (``c-<hash>``), the containers with the most end-to-end samples: its
  end-to-end latency as ``inference_latency_mean_seconds`` (a per-minute latency, not a p95),
  its gateway queueing time as ``inference_ttft_p95_seconds`` (the wait before the request starts
  being served, what time to first token measures on an LLM engine), its QPS as
  ``inference_requests_per_second``;
* a *predict* service (``p-<hash>``): pure model inference latency, as
  ``inference_latency_mean_seconds``;
* the *gateway* service: the gateway's API-request QPS and its queue backlog
  (``inference_queue_depth``).

A collector scrapes every 10 s, and a series' latest sample is its value until the next one (a
gauge held between updates; a series silent for more than 5 minutes stops reporting, as a
container that went away). The rows travel as the inference SDK's frames through the wire format
into a hub (ingest, detection, alerting: what ``sim-eval`` runs), evaluated every 10 s.

Runs: the background alone, then with faults injected onto it, ten minutes each at 20, 40, 60 and
80 % of each service's span (four times of day): latency (container and predict services) times
1.3, 1.5 and 2; gateway queueing time (TTFT) times 2; a queue buildup at the gateway (4 tasks a
minute on top of its backlog); error bursts (20 % of the requests failing) at the gateway and the
containers. A fault is detected when an alert of its rule on its service starts inside it or up to
2 minutes after it; time to detect from its start. Background alerts are counted per hour by rule
and tier, with flapping (a rule/service that resolves and fires again more than twice in an hour).

usage: python eval/eval_serving_traces.py [--data DIR] [--containers N] [--predict N] [--runs NAME ...]
       [--verbose]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import math
import statistics
import sys
import time
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datapath import data_dir
from eval_families import flapping

from gpuscope.hub import Hub
from gpuscope.ingest.payload import batch_to_json, parse_batch
from gpuscope.model import Alert, Batch, Frame
from gpuscope.store.duckdb import DuckDBStore

FOLDER = "alibaba_v2026_genai"
SCRAPE = 10.0  # seconds between the collector's scrapes and the hub's evaluations
STALE = 300.0  # a series silent this long has stopped reporting
FAULT = 600.0  # seconds each injected fault lasts
GRACE = 120.0
AT = (0.2, 0.4, 0.6, 0.8)  # where in each service's span the faults are injected
LATENCY, TTFT, REQUESTS, ERRORS, QUEUE = (
    "inference_latency_mean_seconds",
    "inference_ttft_p95_seconds",
    "inference_requests_per_second",
    "inference_errors_per_second",
    "inference_queue_depth",
)
Series = tuple[list[float], list[float]]  # sample times, values


@dataclass(slots=True)
class Service:
    name: str
    kind: str  # container, predict or gateway
    series: dict[str, Series] = field(default_factory=dict)  # metric -> its samples

    @property
    def span(self) -> tuple[float, float]:
        starts = [ts[0] for ts, _ in self.series.values()]
        ends = [ts[-1] for ts, _ in self.series.values()]
        return min(starts), max(ends)

    def value(self, metric: str, t: float) -> float:
        """The series' latest sample at ``t`` (NaN: none yet, or silent for ``STALE``)."""
        got = self.series.get(metric)
        if got is None:
            return math.nan
        ts, vs = got
        i = bisect_right(ts, t) - 1
        return vs[i] if i >= 0 and t - ts[i] <= STALE else math.nan


def _read(path: Path, scale: float = 1.0, kind: str | None = None) -> dict[str, Series]:
    """Container -> (times, values) of one file; rows of another ``request_type`` are left out."""
    rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with gzip.open(path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            if kind is not None and row.get("request_type") != kind:
                continue
            ip = row["container_ip"] or ""
            ip = "" if ip in ("None", "NULL") else ip
            try:
                ts, value = float(row["timestamp_anon"]), float(row["value"])
            except ValueError:
                continue
            if math.isfinite(ts) and math.isfinite(value):
                rows[ip].append((ts, value * scale))
    out = {}
    for ip, samples in rows.items():
        samples.sort()
        out[ip] = ([t for t, _ in samples], [v for _, v in samples])
    return out


def load(folder: Path, containers: int, predict: int) -> list[Service]:
    e2e = _read(folder / "pipeline_inference_data_anon.csv.gz", 1e-3)
    queue_rt = _read(folder / "queue_rt_raw_anon.csv.gz", 1e-3)
    qps = _read(folder / "qps.csv.gz", kind="Generative Requests")
    api = _read(folder / "qps.csv.gz", kind="API Requests")
    backlog = _read(folder / "queue_size_raw_anon.csv.gz")
    model = _read(folder / "model_predict_data_anon.csv.gz", 1e-3)
    out = []
    for ip in sorted((k for k in e2e if k), key=lambda k: (-len(e2e[k][0]), k))[:containers]:
        svc = Service(f"c-{ip[:8]}", "container", {LATENCY: e2e[ip]})
        if ip in queue_rt:
            svc.series[TTFT] = queue_rt[ip]
        if ip in qps:
            svc.series[REQUESTS] = qps[ip]
        out.append(svc)
    for ip in sorted((k for k in model if k), key=lambda k: (-len(model[k][0]), k))[:predict]:
        out.append(Service(f"p-{ip[:8]}", "predict", {LATENCY: model[ip]}))
    if "" in api and "" in backlog:
        out.append(Service("gateway", "gateway", {REQUESTS: api[""], QUEUE: backlog[""]}))
    return out


@dataclass(frozen=True, slots=True)
class Fault:
    service: str
    rule: str
    start: float
    apply: Callable[[str, float, float], float]  # (metric, seconds into the fault, value) -> value
    slot: int  # which of ``AT``


Plan = Callable[[Service], list[Fault]]


def _times(svc: Service, metric: str = LATENCY) -> list[tuple[int, float]]:
    """Where the faults go: at 20, 40, 60 and 80 % of the series' samples (its span has long
    silent stretches late in the day), each where the next 10 minutes hold at least 4 samples."""
    ts = svc.series[metric][0] if metric in svc.series else next(iter(svc.series.values()))[0]
    out = []
    for slot, f in enumerate(AT):
        i = int(f * (len(ts) - 1))
        while i < len(ts) and bisect_right(ts, ts[i] + FAULT) - i < 4:
            i += 1
        if i < len(ts):
            out.append((slot, ts[i]))
    return out


def latency_faults(factor: float) -> Plan:
    def plan(svc: Service) -> list[Fault]:
        if svc.kind == "gateway":
            return []

        def scale(metric: str, _: float, value: float) -> float:
            return value * factor if metric == LATENCY else value

        return [Fault(svc.name, "inference_latency_regression", t, scale, slot) for slot, t in _times(svc)]

    return plan


def queue_time_faults(factor: float) -> Plan:
    def plan(svc: Service) -> list[Fault]:
        if TTFT not in svc.series:
            return []

        def scale(metric: str, _: float, value: float) -> float:
            return value * factor if metric == TTFT else value

        return [Fault(svc.name, "inference_ttft_regression", t, scale, slot) for slot, t in _times(svc, TTFT)]

    return plan


def queue_faults(per_minute: float) -> Plan:
    def plan(svc: Service) -> list[Fault]:
        if QUEUE not in svc.series:
            return []

        def grow(metric: str, seconds: float, value: float) -> float:
            return value + per_minute * seconds / 60.0 if metric == QUEUE else value

        return [Fault(svc.name, "inference_queue_buildup", t, grow, slot) for slot, t in _times(svc, QUEUE)]

    return plan


def error_faults(ratio: float) -> Plan:
    def plan(svc: Service) -> list[Fault]:
        if REQUESTS not in svc.series:
            return []

        def fail(metric: str, _: float, value: float) -> float:
            return value * (1.0 - ratio) if metric == REQUESTS else value

        return [Fault(svc.name, "inference_error_rate", t, fail, slot) for slot, t in _times(svc, REQUESTS)]

    return plan


RUNS: dict[str, Plan | None] = {
    "background": None,
    "latency x1.3": latency_faults(1.3),
    "latency x1.5": latency_faults(1.5),
    "latency x2": latency_faults(2.0),
    "queue time x2": queue_time_faults(2.0),
    "queue buildup": queue_faults(4.0),
    "errors 20%": error_faults(0.2),
}


def _rows(services: list[Service], faults: list[Fault], t: float) -> list[Frame]:
    frames = []
    for svc in services:
        values = {m: svc.value(m, t) for m in svc.series}
        values = {m: v for m, v in values.items() if math.isfinite(v)}
        if not values:
            continue
        for fault in faults:
            if fault.service == svc.name and fault.start <= t < fault.start + FAULT:
                if fault.rule == "inference_error_rate" and REQUESTS in values:
                    rate = values[REQUESTS]
                    values[ERRORS] = rate - fault.apply(REQUESTS, t - fault.start, rate)
                values = {m: fault.apply(m, t - fault.start, v) for m, v in values.items()}
        if REQUESTS in values:
            values.setdefault(ERRORS, 0.0)
        names = sorted(values)
        labels = {"service": svc.name, "model": svc.kind, "version": "trace", "node": f"{svc.name}-0"}
        frames.append(Frame(t, names, [labels], np.array([[values[n] for n in names]], dtype=np.float64)))
    return frames


def replay(services: list[Service], faults: list[Fault]) -> list[Alert]:
    """Every alert a hub raises on the services' rows, scraped and evaluated every ``SCRAPE`` s."""
    store = DuckDBStore(":memory:", durable=False)
    hub = Hub(store)
    try:
        first = min(s.span[0] for s in services)
        last = max(s.span[1] for s in services)
        t = math.ceil(first / SCRAPE) * SCRAPE
        while t <= last + SCRAPE:
            frames = _rows(services, faults, t)
            if frames:
                hub.ingest(parse_batch(batch_to_json(Batch("trace", frames=frames))))
            hub.evaluate(t)
            t += SCRAPE
        return sorted(hub.alerts.all(), key=lambda a: (a.started_at, a.id))
    finally:
        store.close()


def _hours(services: list[Service]) -> float:
    return sum(s.span[1] - s.span[0] for s in services) / 3600.0


def _counts(alerts: list[Alert], hours: float) -> str:
    by: dict[tuple[str, str], int] = defaultdict(int)
    for a in alerts:
        by[(a.rule, a.severity)] += 1
    return ", ".join(f"{rule} {sev} {n} ({n / hours:.2f}/h)" for (rule, sev), n in sorted(by.items()))


def background(services: list[Service], alerts: list[Alert], t0: float, verbose: bool) -> None:
    """Alerts per hour by rule and tier, P1/P2 and flapping: per kind of service, then per service."""
    print("background (no fault injected):")
    for kind in sorted({s.kind for s in services}):
        group = [s for s in services if s.kind == kind]
        names = {s.name for s in group}
        mine = [a for a in alerts if a.entity.get("service") in names]
        hours = _hours(group)
        p12 = sum(1 for a in mine if a.severity in ("P1", "P2"))
        flaps = flapping(mine)
        print(
            f"  {kind}: {len(group)} series, {hours:.1f} service-hours, {len(mine)} alerts "
            f"({len(mine) / hours:.2f}/h), P1/P2 {p12}, flapping {len(flaps)}"
        )
        if mine:
            print(f"    by rule and tier: {_counts(mine, hours)}")
        for svc in group:
            own = [a for a in mine if a.entity.get("service") == svc.name]
            h = (svc.span[1] - svc.span[0]) / 3600.0
            flap = flapping(own)
            print(
                f"    {svc.name}: {h:.1f} h, {len(own)} alerts{': ' + _counts(own, h) if own else ''}"
                f"{'; FLAPPING ' + '; '.join(flap) if flap else ''}"
            )
    if verbose:
        for a in alerts:
            end = "open" if a.resolved_at is None else f"{a.resolved_at - a.started_at:.0f} s"
            print(f"    {a.severity} {a.rule} at +{(a.started_at - t0) / 3600:.2f} h for {end}: {a.summary}")


def scored(
    name: str, services: list[Service], faults: list[Fault], alerts: list[Alert], base: list[Alert]
) -> None:
    """Recall and time to detect of the faults; alerts neither a fault nor the background explains."""
    by_kind: dict[str, list[float | None]] = defaultdict(list)
    slots: dict[int, list[float | None]] = defaultdict(list)
    kind = {s.name: s.kind for s in services}
    chance = 0
    for f in faults:
        starts = [
            a.started_at
            for a in alerts
            if a.rule == f.rule
            and a.entity.get("service") == f.service
            and f.start <= a.started_at <= f.start + FAULT + GRACE
        ]
        ttd = min(starts) - f.start if starts else None
        # the same rule's background alerts starting in the window: a detection by chance
        chance += int(
            any(
                a.rule == f.rule
                and a.entity.get("service") == f.service
                and f.start <= a.started_at <= f.start + FAULT + GRACE
                for a in base
            )
        )
        by_kind[kind[f.service]].append(ttd)
        slots[f.slot].append(ttd)
    for k, got in sorted(by_kind.items()):
        hit = [x for x in got if x is not None]
        ttd = f"TTD p50 {statistics.median(hit):.0f} s, max {max(hit):.0f} s" if hit else "no TTD"
        print(f"  {name} on {k} services: recall {len(hit) / len(got):.2f} ({len(hit)}/{len(got)}), {ttd}")
    per_slot = ", ".join(
        f"{int(AT[i] * 100)} %: {sum(x is not None for x in v)}/{len(v)}" for i, v in sorted(slots.items())
    )
    print(f"    by place in the span: {per_slot}; windows where the background run alone fired: {chance}")
    windows = [(f.service, f.start, f.start + FAULT + GRACE) for f in faults]
    quiet = {(a.rule, a.entity.get("service"), a.started_at) for a in base}
    extra = [
        a
        for a in alerts
        if (a.rule, a.entity.get("service"), a.started_at) not in quiet
        and not any(s == a.entity.get("service") and b <= a.started_at <= e for s, b, e in windows)
    ]
    if extra:
        print(f"    alerts outside the faults and not in the background run: {len(extra)}")


def joined(services: list[Service], half: int, at: float = 0.25) -> tuple[list[Service], dict[str, float]]:
    """The services with every other container and predict series (``half`` of each kind, in
    order) joining late: its samples before ``at`` of them are withheld, so it is a new service
    while the others (and the gateway) are established; and when each joined."""
    out, joins = [], {}
    for kind in ("container", "predict", "gateway"):
        for i, svc in enumerate(s for s in services if s.kind == kind):
            if kind == "gateway" or i % 2 != half:
                out.append(svc)
                continue
            ts = svc.series[LATENCY][0]
            join = ts[int(at * (len(ts) - 1))]
            cut = {
                m: (t[bisect_right(t, join - 1e-6) :], v[bisect_right(t, join - 1e-6) :])
                for m, (t, v) in svc.series.items()
            }
            out.append(Service(svc.name, svc.kind, {m: sv for m, sv in cut.items() if sv[0]}))
            joins[svc.name] = join
    return out, joins


def young(services: list[Service], factor: float) -> None:
    """New services among established ones: each container and predict series joins late once (two
    replays, each with half of them joining) with its latency ``factor`` times its own for its
    first ``FAULT`` seconds (1: a healthy join). Reports the faults found (a latency alert on it
    inside the fault or ``GRACE`` after) and the alerts on the joined services beyond that, over
    their first two hours."""
    found: dict[str, list[float | None]] = defaultdict(list)
    extra: dict[str, list[Alert]] = defaultdict(list)
    began = time.monotonic()
    for half in (0, 1):
        moved, joins = joined(services, half)
        kind = {s.name: s.kind for s in moved}

        def scale(metric: str, _: float, value: float) -> float:
            return value * factor if metric == LATENCY else value

        faults = [Fault(n, "inference_latency_regression", t, scale, 0) for n, t in joins.items()]
        alerts = replay(moved, faults if factor != 1.0 else [])
        for name, join in joins.items():
            mine = [a for a in alerts if a.entity.get("service") == name]
            hits = [
                a.started_at - join
                for a in mine
                if a.rule == "inference_latency_regression" and join <= a.started_at <= join + FAULT + GRACE
            ]
            found[kind[name]].append(min(hits) if hits and factor != 1.0 else None)
            late = join + (FAULT + GRACE if factor != 1.0 else 0.0)
            extra[kind[name]] += [a for a in mine if late < a.started_at <= join + 7200.0]
    print(f"[young x{factor:g}: {time.monotonic() - began:.0f} s wall]")
    for k in sorted(found):
        hit = [x for x in found[k] if x is not None]
        ttd = f", TTD p50 {statistics.median(hit):.0f} s, max {max(hit):.0f} s" if hit else ""
        what = f"found {len(hit)}/{len(found[k])}{ttd}; " if factor != 1.0 else ""
        rules = ", ".join(sorted(f"{a.rule} on {a.entity.get('service')}" for a in extra[k]))
        print(
            f"  young x{factor:g} on {k} services: {what}"
            f"other alerts in their first 2 h: {len(extra[k])} {rules}"
        )


def _ratio(ts: np.ndarray, vs: np.ndarray, i: int) -> float:
    """The median of the ``FAULT`` seconds from sample ``i`` over the median of the hour before."""
    now = vs[i : bisect_right(ts, ts[i] + FAULT - 1e-6, i)]
    before = vs[bisect_right(ts, ts[i] - 3600.0) : i]
    if len(now) < 4 or len(before) < 4:
        return math.nan
    return float(np.median(now) / np.median(before))


def oracle(services: list[Service], factors: tuple[float, ...] = (1.3, 1.5, 2.0)) -> None:
    """An upper bound for the injected latency faults: per series, the median of the ten minutes
    from each sample against the median of the hour before it; a fault is separable when its
    window's ratio times its factor exceeds the highest ratio the series reaches anywhere in the
    trace (a threshold set per series with hindsight, so that the trace itself raises nothing; and,
    looser, its 99th percentile)."""
    found: dict[tuple[str, float], list[tuple[bool, ...]]] = defaultdict(list)
    for svc in services:
        if svc.kind == "gateway":
            continue
        ts, vs = (np.asarray(x, dtype=np.float64) for x in svc.series[LATENCY])

        ratios = {i: _ratio(ts, vs, i) for i in range(len(ts))}
        seen = [r for r in ratios.values() if math.isfinite(r)]
        # and a looser bound: the threshold at the 99th percentile (1 % of the windows fire)
        tops = (max(seen), float(np.quantile(seen, 0.99))) if seen else (math.inf, math.inf)
        for _, t in _times(svc):
            r = ratios[int(np.searchsorted(ts, t))]
            for k in factors:
                found[(svc.kind, k)].append(tuple(math.isfinite(r) and k * r > top for top in tops))
    for (kind, k), got in sorted(found.items()):
        strict, loose = (sum(g[j] for g in got) for j in (0, 1))
        print(
            f"  oracle, latency x{k:g} on {kind} services: separable {strict / len(got):.2f} "
            f"({strict}/{len(got)}); above the 99th percentile {loose / len(got):.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=data_dir(), help="see eval/datapath.py")
    parser.add_argument("--containers", type=int, default=12, help="container services (most samples first)")
    parser.add_argument("--predict", type=int, default=6, help="model-predict services")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), help=f"of {list(RUNS)}")
    parser.add_argument("--verbose", action="store_true", help="list every background alert")
    parser.add_argument("--oracle", action="store_true", help="the hindsight bound on the latency faults")
    parser.add_argument(
        "--young",
        type=float,
        nargs="*",
        default=[],
        help="latency factors of late-joining services (1: healthy)",
    )
    args = parser.parse_args()
    folder = args.data / FOLDER
    if not folder.is_dir():
        print(f"SKIP: no {FOLDER} under {args.data}")
        return 0
    services = load(folder, args.containers, args.predict)
    t0 = min(s.span[0] for s in services)
    print(
        f"{len(services)} services ({', '.join(sorted({s.kind for s in services}))}), "
        f"{_hours(services):.1f} service-hours over {(max(s.span[1] for s in services) - t0) / 3600:.1f} h"
    )
    if args.oracle:
        oracle(services)
    for factor in args.young:
        young(services, factor)
    base: list[Alert] = []
    for name in ["background", *(r for r in args.runs if r != "background")] if args.runs else []:
        plan = RUNS[name]
        faults = [f for s in services for f in plan(s)] if plan is not None else []
        began = time.monotonic()
        alerts = replay(services, faults)
        print(f"[{name}: {time.monotonic() - began:.0f} s wall]", flush=True)
        if plan is None:
            base = alerts
            if name in args.runs:
                background(services, alerts, t0, args.verbose)
        else:
            scored(name, services, faults, alerts, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
