"""Turning one engine's exposition into rows of the serving schema (one row per model and version).

Histograms become p50/p95/p99 by linear interpolation inside the bucket that holds the rank, as
Prometheus' ``histogram_quantile`` does; a quantile falling in the ``+Inf`` bucket is the highest
finite bound. Counters are summed over labels that are not the model's (``finished_reason``,
``engine``, ``dp_rank``), except that vLLM's aborted requests count as failures. Gauges from several
engines or ranks of one model (vLLM's ``engine`` under data parallelism, SGLang's ``dp_rank`` and
``pp_rank``) are summed when they count requests and maxed when they are ratios (KV-cache use);
ranks that repeat one scheduler's numbers (``tp_rank``) count once. Where a model has several
engines, their queue, running requests and KV-cache use are kept per engine too (``engines``).
Samples without the model label on a page that serves one model (``http_requests_total`` of the API
server) join that model's row.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuscope.collect.promtext import Sample
from gpuscope.collect.serving_engines import MAX_GAUGES, PER_ENGINE, SHARD_LABELS, EngineSpec

RowKey = tuple[str, str]  # (model, version) as the engine names them; "" when it does not


@dataclass(slots=True)
class EngineRow:
    """What the engine reports for one model (and version), in source units already scaled."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    #: distribution -> {upper bound: cumulative count}
    histograms: dict[str, dict[float, float]] = field(default_factory=dict)
    #: distribution -> {quantile: value}
    summaries: dict[str, dict[float, float]] = field(default_factory=dict)
    #: raw counters used for ratios (Triton's batch size)
    raw: dict[str, float] = field(default_factory=dict)
    #: per engine (its labels, ours, sorted) -> the PER_ENGINE gauges; only when there are several
    engines: dict[tuple[tuple[str, str], ...], dict[str, float]] = field(default_factory=dict)


def bucket_quantile(buckets: dict[float, float], q: float) -> float:
    """The ``q`` quantile of a cumulative histogram ``{upper bound: count}``; NaN when it is empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    bounds = sorted(buckets)
    if not bounds or bounds[-1] != math.inf:
        return math.nan  # without +Inf the total is unknown
    total = buckets[math.inf]
    if not total > 0:
        return math.nan
    rank = q * total
    for i, le in enumerate(bounds):
        count = buckets[le]
        if count < rank:
            continue
        if le == math.inf:
            return bounds[-2] if len(bounds) > 1 else math.nan
        lower = bounds[i - 1] if i else min(0.0, le)
        below = buckets[bounds[i - 1]] if i else 0.0
        if count <= below:
            return le
        return lower + (le - lower) * (rank - below) / (count - below)
    return math.nan  # counts not cumulative: unreachable for a valid histogram


def histogram_delta(now: dict[float, float], before: dict[float, float] | None) -> dict[float, float]:
    """Observations since ``before`` (the previous scrape); the whole histogram after a reset."""
    if before is None or set(before) != set(now) or any(now[k] < before[k] for k in now):
        return dict(now)
    return {k: now[k] - before[k] for k in now}


def _first(spec_candidates: Iterable[tuple[str, float]], present: set[str]) -> tuple[str, float] | None:
    for name, factor in spec_candidates:
        if name in present:
            return name, factor
    return None


def _per_engine(
    row: EngineRow, canon: str, slot: dict[tuple[tuple[str, str], ...], float], names: dict[str, str]
) -> None:
    by_engine: dict[tuple[tuple[str, str], ...], list[float]] = defaultdict(list)
    for replica, value in slot.items():
        engine = tuple(sorted((names[k], v) for k, v in replica if k in names))
        if engine:
            by_engine[engine].append(value)
    if len(by_engine) < 2:
        return  # one engine: the model's row is that engine's
    for engine, values in by_engine.items():
        combined = max(values) if canon in MAX_GAUGES else math.fsum(values)
        row.engines.setdefault(engine, {})[PER_ENGINE[canon]] = combined


def read_rows(samples: list[Sample], spec: EngineSpec) -> dict[RowKey, EngineRow]:
    """Group an exposition's samples by model (and version) and name them by the schema."""
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_name[s.name].append(s)
    present = set(by_name)
    bucket_names = {n[: -len("_bucket")] for n in present if n.endswith("_bucket")}
    rows: dict[RowKey, EngineRow] = defaultdict(EngineRow)

    def key(s: Sample) -> RowKey:
        model = s.labels.get(spec.model_label, "") if spec.model_label else ""
        version = s.labels.get(spec.version_label, "") if spec.version_label else ""
        return model, version

    own = {spec.model_label, spec.version_label}

    def replica(s: Sample) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, v) for k, v in s.labels.items() if k not in own and k not in SHARD_LABELS))

    for canon, candidates in spec.gauges.items():
        hit = _first(candidates, present)
        if hit is None:
            continue
        per_replica: dict[RowKey, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
        for s in by_name[hit[0]]:
            if not math.isfinite(s.value):
                continue
            slot = per_replica[key(s)]
            r = replica(s)
            slot[r] = max(slot.get(r, -math.inf), s.value * hit[1])
        for k, slot in per_replica.items():
            rows[k].gauges[canon] = max(slot.values()) if canon in MAX_GAUGES else math.fsum(slot.values())
            if canon in PER_ENGINE and spec.engine_labels:
                _per_engine(rows[k], canon, slot, spec.engine_labels)
    for canon, names in spec.counters.items():
        name = next((n for n in names if n in present), None)
        for s in by_name.get(name or "", []):
            failed = any(s.labels.get(lbl) in bad for lbl, bad in spec.failure_labels.items())
            target = "inference_errors_total" if failed else canon
            row = rows[key(s)]
            row.counters[target] = row.counters.get(target, 0.0) + s.value
    for canon, sources in spec.labelled_counters.items():
        for name, label, prefixes in sources:
            for s in by_name.get(name, []):
                if s.labels.get(label, "").startswith(prefixes):
                    row = rows[key(s)]
                    row.counters[canon] = row.counters.get(canon, 0.0) + s.value
    for name in {n for total, _, count in spec.mean_counters.values() for n in (total, count)}:
        for s in by_name.get(name, []):
            row = rows[key(s)]
            row.raw[name] = row.raw.get(name, 0.0) + s.value
    for dist, candidates in spec.histograms.items():
        hit = _first(((n, f) for n, f in candidates if n in bucket_names), bucket_names)
        if hit is None:
            continue
        for s in by_name[hit[0] + "_bucket"]:
            le = s.labels.get("le")
            if le is None:
                continue
            bound = math.inf if le == "+Inf" else float(le) * hit[1]
            hist = rows[key(s)].histograms.setdefault(dist, {})
            hist[bound] = hist.get(bound, 0.0) + s.value
    for dist, candidates in spec.summaries.items():
        hit = _first(candidates, present)
        if hit is None:
            continue
        observed = {key(s) for s in by_name.get(hit[0] + "_count", []) if s.value > 0}
        for s in by_name[hit[0]]:
            q = s.labels.get("quantile")
            if key(s) not in observed:
                continue  # a summary over no requests: its quantiles say nothing
            if q is not None and math.isfinite(s.value):
                rows[key(s)].summaries.setdefault(dist, {})[float(q)] = s.value * hit[1]
    if spec.batch_ratio is not None:
        for name in spec.batch_ratio:
            for s in by_name.get(name, []):
                row = rows[key(s)]
                row.raw[name] = row.raw.get(name, 0.0) + s.value
    page = rows.get(("", ""))
    models = [k for k in rows if k != ("", "")]
    if page is not None and len(models) == 1 and not page.gauges and not page.histograms:
        model_row = rows[models[0]]
        for name, v in page.counters.items():
            model_row.counters[name] = model_row.counters.get(name, 0.0) + v
        del rows[("", "")]
    return dict(rows)
