"""Where a job or a service runs, read from the store's latest telemetry (the entity graph).

A job-level or service-level alert names no node; to link it with hardware alerts on the nodes
it runs on (a latency regression next to network errors on the same nodes), the incident tracker
asks here. It is consulted only when such an alert fires, never on the ingest path.
"""

from __future__ import annotations

from gpuscope.model import Labels
from gpuscope.store.base import Store

_PROBE = {"job": ["gpu_utilization_percent"], "service": ["inference_requests_per_second"]}


def placements(store: Store, entity: Labels, max_age: float = 300.0) -> list[Labels]:
    """The nodes (and GPUs, for a job) an entity without a node runs on; ``[]`` when unknown."""
    if "node" in entity:
        return []
    for kind in ("job", "service"):
        name = entity.get(kind)
        if name is None:
            continue
        rows = store.snapshot(_PROBE[kind], max_age)
        out: list[Labels] = []
        for row in rows:
            labels = row["labels"]
            if labels.get(kind) == name and "node" in labels:
                place = {"node": labels["node"]}
                if kind == "job" and "gpu" in labels:
                    place["gpu"] = labels["gpu"]
                out.append(place)
        return sorted(out, key=lambda p: (p["node"], p.get("gpu", "")))
    return []
