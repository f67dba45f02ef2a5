"""Remote-write path of the prometheus storage backend (DESIGN §6; issue 9): samples/s.

A fleet of N nodes x 8 GPUs x the full metric set (``bench/common.py``), in two batch shapes: one
node's tick per batch (what agents send) and the whole fleet's tick per batch. Measured in one run:

1. encode + snappy per core: :class:`PromStore` turning prepared batches into compressed
   WriteRequests (CPU seconds of this process, one thread), beside the same requests built with
   the protobuf library one message per series (how it was done before cached series heads);
2. ``PromStore.append`` into a real VictoriaMetrics started here (wall clock; per-node batches from
   several appender threads, as a hub's request threads call it), and samples per CPU second of
   this process and of VictoriaMetrics: what one core of each carries (this machine's cores are
   shared by both, so the wall-clock rate is bounded by their sum);
3. anchor: VictoriaMetrics' own ingest of the same samples as Prometheus text through
   ``/api/v1/import/prometheus`` from as many client threads, measured the same way;
4. round trips per request (issue 13): agents' batches (one node's tick each, a batch id each)
   appended by ``--appenders`` threads, as a cluster hub's request threads do, into
   ``PromStore`` + ``PostgresMeta`` (a real PostgreSQL started here), with concurrent appends
   grouped into one remote write, one id lookup and one transaction, and without; the anchor is
   VictoriaMetrics' direct remote write of the same samples, one request per batch. Remote writes
   are counted by VictoriaMetrics (``vm_http_requests_total``), transactions by PostgreSQL
   (``pg_stat_database.xact_commit``), both per appended batch.

Target: >= 500,000 samples/s per core for encode + snappy; a 1,024-node fleet at 1 Hz is 245,760
samples/s.

usage: python bench/bench_remote.py [--nodes 1024] [--ticks 5] [--seconds 10] [--appenders 8]
       python bench/bench_remote.py --only round-trips --nodes 256 --seconds 10 --appenders 32
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator

import cramjam
import httpx
import psutil
import psycopg

from bench_ingest import blast, vm_bodies
from common import ROOT, TELEMETRY, Fleet, console, print_table, telemetry_ticks, victoria_metrics
from gpuscope.model import Batch, Frame
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.prepare import Prepared
from gpuscope.store.remote import wire
from gpuscope.store.remote.meta import PostgresMeta
from gpuscope.store.remote.prom_store import PromStore

sys.path.insert(0, str(ROOT / "tests"))
from pgserver import PostgresServer, postgres_bin_dir


def batches(fleet: Fleet, ticks: int, per_node: bool) -> list[Batch]:
    entities = fleet.entities
    g = fleet.gpus_per_node
    out = []
    for ts, names, values in telemetry_ticks(fleet, ticks):
        if not per_node:
            out.append(Batch("fleet", frames=[Frame(ts, names, entities, values)]))
            continue
        for n in range(fleet.nodes):
            rows = slice(n * g, (n + 1) * g)
            out.append(Batch(f"node-{n}", frames=[Frame(ts, names, entities[rows], values[rows])]))
    return out


def cpu_rate(work: Callable[[], int], min_s: float = 2.0) -> float:
    """Samples per CPU second of ``work`` (repeated for at least ``min_s`` CPU seconds)."""
    done, t0 = 0, time.process_time()
    while (spent := time.process_time() - t0) < min_s or done == 0:
        done += work()
    return done / spent


def write_requests(store: PromStore, prepared: Prepared) -> Iterator[tuple[bytes, int]]:
    """The compressed WriteRequests ``store`` sends for a prepared batch, and the samples of each."""
    step = store.max_request_samples
    for heads, fields in store._lanes(prepared, prepared.result):
        for a in range(0, len(heads), step):
            yield wire.write_request(heads[a : a + step], fields[a : a + step]), len(heads[a : a + step])


def encode_rates(store: PromStore, shape: list[Batch]) -> tuple[float, float]:
    """(ours, protobuf library) samples per CPU second, prepare excluded (the embedded store does it
    too), for the same prepared batches."""
    prepared = [store._preparer.prepare(b) for b in shape]
    step = store.max_request_samples

    def ours() -> int:
        return sum(n for p in prepared for _, n in write_requests(store, p))

    # the series of the first batch with their labels: the library builds every message anew
    series = []
    for p in prepared:
        per = []
        for cols, block in p.blocks.items():
            for ts, ent, attr, values in zip(block.ts, block.entity, block.attr, block.values, strict=True):
                for i, (e, a) in enumerate(zip(ent.tolist(), attr.tolist(), strict=True)):
                    for j, col in enumerate(cols):
                        labels = store._labels_of(col, e, a)
                        assert not isinstance(labels, str), labels
                        per.append((sorted(labels), int(ts[i]), float(values[i, j])))
        series.append(per)

    def library() -> int:
        n = 0
        for per in series:
            for a in range(0, len(per), step):
                req = wire.WriteRequest()
                for labels, t, v in per[a : a + step]:
                    ts = req.timeseries.add()
                    for name, value in labels:
                        ts.labels.add(name=name, value=value)
                    ts.samples.add(timestamp=t, value=v)
                cramjam.snappy.compress_raw(req.SerializeToString())
            n += len(per)
        return n

    return cpu_rate(ours), cpu_rate(library)


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def measured(run: Callable[[], tuple[int, int]], tsdb: psutil.Process) -> list[str]:
    """``run()`` -> (samples stored, errors) as table cells: samples/s (wall), and samples per CPU
    second of this process and of the TSDB (what a core of each carries)."""
    me = psutil.Process()
    wall, mine, theirs = time.perf_counter(), cpu_seconds(me), cpu_seconds(tsdb)
    samples, errors = run()
    wall, mine, theirs = time.perf_counter() - wall, cpu_seconds(me) - mine, cpu_seconds(tsdb) - theirs
    return [f"{samples / wall:,.0f}", f"{samples / mine:,.0f}", f"{samples / theirs:,.0f}", str(errors)]


def drive(
    threads: int, seconds: float, work: Callable[[int, int], int], items: int | None = None
) -> tuple[int, int, int]:
    """Items 0, 1, 2... dealt out to ``threads`` threads, thread ``i`` calling ``work(i, item)`` (the
    samples it stored; raising is an error), until ``seconds`` pass or, given ``items``, each item
    was dealt once: (samples stored, errors, items stored)."""
    lock = threading.Lock()
    cursor = iter(range(10**12 if items is None else items))
    stored, errors, done = [0] * threads, [0] * threads, [0] * threads
    deadline = time.perf_counter() + seconds

    def worker(i: int) -> None:
        while time.perf_counter() < deadline:
            with lock:
                k = next(cursor, None)
            if k is None:
                return
            try:
                stored[i] += work(i, k)
                done[i] += 1
            except Exception:
                errors[i] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(stored), sum(errors), sum(done)


def appends(store: PromStore, shape: list[Batch], threads: int, seconds: float) -> tuple[int, int]:
    """``threads`` appenders cycling through ``shape`` for ``seconds``: samples stored, errors."""
    samples, errors, _ = drive(threads, seconds, lambda i, k: store.append(shape[k % len(shape)]).samples)
    return samples, errors


def vm_writes(url: str) -> int:
    """Remote-write requests VictoriaMetrics has served (its own counter)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.findall(r'^vm_http_requests_total\{path="/api/v1/write"[^}]*\} (\d+)', text, re.MULTILINE)
    return sum(int(n) for n in found)


def pg_commits(dsn: str) -> int:
    """Transactions PostgreSQL has committed in the bench's database (its statistics, flushed)."""
    time.sleep(1.5)  # exited backends' counts reach the statistics soon after
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute("SELECT pg_stat_clear_snapshot()")
        row = con.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def with_ids(shape: list[Batch], run: str) -> list[Batch]:
    return [Batch(b.source, frames=b.frames, batch_id=f"{b.source}:{run}:{i}") for i, b in enumerate(shape)]


def round_trips(url: str, shape: list[Batch], threads: int, seconds: float) -> list[list[str]]:
    """Rows: per mode, appended batches, samples/s, remote writes and PostgreSQL transactions per
    batch, samples per CPU second of this process."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        console.print("[yellow]PostgreSQL not installed: round trips skipped[/yellow]")
        return []
    rows = []
    pg = PostgresServer(bin_dir).start()
    try:
        dsn = pg.create_database("bench_remote")
        for grouped in (False, True):
            mode = "grouped" if grouped else "one per request"
            meta = PostgresMeta(dsn, group_writes=grouped)
            with PromStore(f"{url}/api/v1/write", url, meta, group_writes=grouped) as store:
                batches_ = with_ids(shape, mode.replace(" ", "-"))
                writes, commits, cpu = vm_writes(url), pg_commits(dsn), time.process_time()
                wall = time.perf_counter()
                samples, errors, appended = appends_counted(store, batches_, threads, seconds)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            # after close: a backend that exits reports its transactions to the statistics at once
            writes, commits = vm_writes(url) - writes, pg_commits(dsn) - commits
            rows.append(
                [
                    f"PromStore + PostgresMeta, {mode}",
                    f"{appended:,}",
                    f"{samples / wall:,.0f}",
                    f"{writes / max(1, appended):.3f}",
                    f"{commits / max(1, appended):.3f}",
                    f"{samples / cpu:,.0f}",
                    str(errors),
                ]
            )
    finally:
        pg.stop()
    # anchor: the same samples written straight to VictoriaMetrics, one request per batch
    with PromStore(f"{url}/api/v1/write", url, DuckDBStore(":memory:")) as encoder:
        bodies = [body for b in shape for body in write_requests(encoder, encoder._preparer.prepare(b))]
    writes, cpu, wall = vm_writes(url), time.process_time(), time.perf_counter()
    samples, errors, sent = post_all(f"{url}/api/v1/write", bodies, threads, seconds)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    writes = vm_writes(url) - writes
    rows.append(
        [
            "VictoriaMetrics remote write, direct (anchor)",
            f"{sent:,}",
            f"{samples / wall:,.0f}",
            f"{writes / max(1, sent):.3f}",
            "-",
            f"{samples / cpu:,.0f}",
            str(errors),
        ]
    )
    return rows


def appends_counted(
    store: PromStore, shape: list[Batch], threads: int, seconds: float
) -> tuple[int, int, int]:
    """Like :func:`appends`, each batch once at most: (samples stored, errors, batches appended)."""
    return drive(threads, seconds, lambda i, k: store.append(shape[k]).samples, items=len(shape))


def post_all(url: str, bodies: list[tuple[bytes, int]], threads: int, seconds: float) -> tuple[int, int, int]:
    """POST each body once (``threads`` at a time) until done or ``seconds``: (samples, errors, requests)."""
    clients = [httpx.Client(timeout=10) for _ in range(threads)]

    def post(i: int, k: int) -> int:
        body, n = bodies[k]
        r = clients[i].post(url, content=body, headers=wire.HEADERS)
        if r.status_code // 100 != 2:
            raise RuntimeError(f"HTTP {r.status_code}")
        return n

    try:
        return drive(threads, seconds, post, items=len(bodies))
    finally:
        for client in clients:
            client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=5, help="seconds of telemetry generated (then re-sent)")
    ap.add_argument("--seconds", type=float, default=10, help="seconds per end-to-end measurement")
    ap.add_argument("--appenders", type=int, default=8, help="threads calling append (per-node batches)")
    ap.add_argument("--only", choices=["all", "round-trips"], default="all")
    a = ap.parse_args()
    fleet = Fleet(a.nodes, a.gpus_per_node)
    console.print(f"generating {a.ticks} s of telemetry for {fleet.nodes * fleet.gpus_per_node} GPUs")
    per_node = batches(fleet, a.ticks, True)
    with victoria_metrics() as vm:
        if vm is None:
            return
        if a.only == "all":
            throughput(a, fleet, vm[0], per_node)
        console.print(f"round trips per request ({a.appenders} appender threads)")
        trip_rows = round_trips(vm[0], per_node, a.appenders, a.seconds)
    print_table(
        f"round trips per appended batch (1 node / batch, {a.appenders} threads, {a.seconds:g} s each)",
        ["path", "batches", "samples/s", "VM writes/batch", "PG xacts/batch", "/CPU-s sender", "errors"],
        trip_rows,
    )


def throughput(a: argparse.Namespace, fleet: Fleet, url: str, per_node: list[Batch]) -> None:
    """Sections 1 to 3 of the module's docstring."""
    gpus = fleet.nodes * fleet.gpus_per_node
    shapes = {"1 node / batch": per_node, "fleet / batch": batches(fleet, a.ticks, False)}
    encode_rows, e2e_rows = [], []
    [tsdb] = [p for p in psutil.Process().children() if "victoria" in p.name()]
    with PromStore(f"{url}/api/v1/write", url, DuckDBStore(":memory:")) as store:
        for b in shapes["1 node / batch"][: fleet.nodes]:
            store.append(b)  # registries and series heads warm, as in a running hub
        for name, shape in shapes.items():
            console.print(f"encoding ({name})")
            ours, library = encode_rates(store, shape)
            encode_rows.append([name, f"{ours:,.0f}", f"{library:,.0f}", f"{ours / library:.1f}x"])
        for name, shape in shapes.items():
            threads = a.appenders if name.startswith("1 node") else 1
            console.print(f"PromStore.append ({name}, {threads} thread(s))")
            cells = measured(lambda: appends(store, shape, threads, a.seconds), tsdb)  # noqa: B023
            e2e_rows.append([f"PromStore.append x{threads}", name, *cells])
    console.print("anchor: VictoriaMetrics import of the same samples (Prometheus text)")
    bodies = vm_bodies(fleet, a.ticks, True)

    def anchor() -> tuple[int, int]:
        rate, _, errors = blast(f"{url}/api/v1/import/prometheus", bodies, a.appenders, a.seconds, {})
        return round(rate * a.seconds), errors  # blast reports a rate over about a.seconds

    cells = measured(anchor, tsdb)
    e2e_rows.append([f"VM import x{a.appenders} (anchor)", "1 node / request", *cells])
    print_table(
        "encode + snappy, samples per CPU second, one thread (target >= 500,000)",
        ["batch shape", "gpuscope", "protobuf library", "speed-up"],
        encode_rows,
    )
    print_table(
        f"remote write into VictoriaMetrics, {gpus} GPUs x {len(TELEMETRY)} metrics "
        f"(1 Hz = {gpus * len(TELEMETRY):,} samples/s)",
        ["sender x threads", "batch shape", "samples/s", "/CPU-s sender", "/CPU-s VM", "errors"],
        e2e_rows,
    )


if __name__ == "__main__":
    main()
