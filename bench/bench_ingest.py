"""Ingest end to end (HTTP → durable store) in samples/s: gpuscope hub vs VictoriaMetrics.

Both receive the same generated GPU telemetry over HTTP on loopback from the same client threads
in the same run: the hub through ``POST /api/v1/ingest`` (answered once committed to DuckDB's
fsynced WAL), VictoriaMetrics through ``/api/v1/import/prometheus`` (answered once buffered in
memory; it flushes to disk about every second). Budget (DESIGN §6): ≥ 2 M samples/s into one hub.

usage: python bench/bench_ingest.py [--nodes 128] [--seconds 15] [--clients 4]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from common import Fleet, console, gpuscope_hub, print_table, telemetry_ticks, victoria_metrics

PLACEHOLDER = "@" * 16  # patched with a unique batch id per request: bodies are re-sent in a cycle


def hub_bodies(fleet: Fleet, ticks: int, per_node: bool) -> list[tuple[bytes, int]]:
    entities = fleet.entities
    g = fleet.gpus_per_node
    bodies = []
    for k, (ts, names, values) in enumerate(telemetry_ticks(fleet, ticks)):
        groups = range(fleet.nodes) if per_node else [None]
        for n in groups:
            rows = slice(n * g, (n + 1) * g) if n is not None else slice(None)
            ents = entities[rows]
            body = {
                "source": f"node-{n}" if n is not None else "fleet",
                "batch_id": f"b{k}-{n}",
                "frames": [{"ts": ts, "metrics": names, "entities": ents, "values": values[rows].tolist()}],
            }
            bodies.append((orjson.dumps(body), len(ents) * len(names)))
    return bodies


def vm_bodies(fleet: Fleet, ticks: int, per_node: bool) -> list[tuple[bytes, int]]:
    entities = fleet.entities
    g = fleet.gpus_per_node
    bodies = []
    for ts, names, values in telemetry_ticks(fleet, ticks):
        ms = int(ts * 1000)
        lines = [
            f'{m}{{node="{e["node"]}",gpu="{e["gpu"]}",job="{e["job"]}"}} {values[i, j]:.6g} {ms}'
            for i, e in enumerate(entities)
            for j, m in enumerate(names)
        ]
        per = g * len(names) if per_node else len(lines)
        for start in range(0, len(lines), per):
            chunk = lines[start : start + per]
            bodies.append(("\n".join(chunk).encode() + b"\n", len(chunk)))
    return bodies


def blast(
    url: str,
    bodies: list[tuple[bytes, int]],
    clients: int,
    seconds: float,
    headers: dict[str, str],
    unique_ids: bool = False,
) -> tuple[float, list[float], int]:
    """Post bodies (cycling) from ``clients`` threads for ``seconds``; samples/s, latencies, errors."""
    sent = [0] * clients
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    deadline = time.perf_counter() + seconds
    cursor = iter(range(10**12))
    lock = threading.Lock()

    def worker(i: int) -> None:
        with httpx.Client(timeout=60, headers=headers) as client:
            while time.perf_counter() < deadline:
                with lock:
                    k = next(cursor)
                body, samples = bodies[k % len(bodies)]
                if unique_ids:
                    body = body.replace(PLACEHOLDER.encode(), f"{k:016d}".encode(), 1)
                t = time.perf_counter()
                r = client.post(url, content=body)
                latencies[i].append(time.perf_counter() - t)
                if r.status_code >= 300:
                    errors[i] += 1
                else:
                    sent[i] += samples

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    return sum(sent) / elapsed, [x for lat in latencies for x in lat], sum(errors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=30, help="seconds of telemetry generated (then re-sent)")
    ap.add_argument("--seconds", type=float, default=15, help="max seconds per measurement")
    ap.add_argument("--clients", type=int, default=4, help="senders of whole-fleet batches")
    ap.add_argument("--agents", type=int, default=32, help="senders of one node's batch each")
    a = ap.parse_args()
    fleet = Fleet(a.nodes, a.gpus_per_node)
    rows = []
    for per_node in (False, True):
        # many agents each send one node's round: many requests in flight, as in a real fleet
        clients = a.agents if per_node else a.clients
        shape = (
            f"1 node / request, {clients} senders"
            if per_node
            else f"{fleet.nodes} nodes / request, {clients} senders"
        )
        console.print(
            f"generating {a.ticks} s of telemetry for {fleet.nodes * fleet.gpus_per_node} GPUs ({shape})"
        )
        hb, vb = hub_bodies(fleet, a.ticks, per_node), vm_bodies(fleet, a.ticks, per_node)
        with tempfile.TemporaryDirectory() as tmp, gpuscope_hub(Path(tmp) / "bench.duckdb") as (url, _):
            rate, lat, errs = blast(
                f"{url}/api/v1/ingest", hb, a.clients, a.seconds, {"Content-Type": "application/json"}
            )
            rows.append(
                [
                    "gpuscope hub (durable)",
                    shape,
                    f"{rate:,.0f}",
                    f"{np.percentile(lat, 95) * 1000:.1f}",
                    str(errs),
                ]
            )
        with victoria_metrics() as vm:
            if vm is not None:
                rate, lat, errs = blast(f"{vm[0]}/api/v1/import/prometheus", vb, clients, a.seconds, {})
                rows.append(
                    [
                        "VictoriaMetrics (anchor)",
                        shape,
                        f"{rate:,.0f}",
                        f"{np.percentile(lat, 95) * 1000:.1f}",
                        str(errs),
                    ]
                )
    print_table(
        "ingest end to end over HTTP, same data, same client threads (budget ≥ 2,000,000 samples/s)",
        ["system", "batch shape", "samples/s", "p95 request ms", "errors"],
        rows,
    )


if __name__ == "__main__":
    main()
