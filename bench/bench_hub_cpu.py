"""Hub CPU per node batch: a real ``gpuscope hub`` process fed agent-shaped batches over HTTP.

The load generator's node batches (8 GPUs × the full metric set, about 375 samples, one POST per
node per second) are sent at the pace of agents: each tick at its wall time (its timestamps are
now, so no node looks silent), its batches spread over the second as unsynchronised agents send
them, by ``--agents`` concurrent connections; the figure is the hub
process's CPU seconds (psutil, all threads: HTTP, decode, durable store, detection, the evaluation
loop each second) per acknowledged batch and samples per hub CPU-second. Issue 9's target:
≥ 300,000 samples per CPU-second.

Anchors, same run:
- VictoriaMetrics (the ``victoria-metrics`` Debian package) fed the same samples the same way: one
  request per node batch (its Prometheus text, ``/api/v1/import/prometheus``) by as many
  connections; the figure is its process's CPU per acknowledged sample. Issue 13's target is a
  ratio (hub samples per CPU-second ÷ VictoriaMetrics') of at least 1.0. VictoriaMetrics answers
  once the samples are buffered in memory; the hub answers once they are durable (synced in its
  ingest log), and moves them into DuckDB at its next commit (every 5 s by default).
- the same batches through the same hub code in process, without HTTP (decode, validate, store
  durably; the detectors and observers see each tick at once before it is evaluated): the
  difference is what the HTTP layer costs.

``--shape`` is when each agent's batch leaves after its tick: ``agents`` (default) as ``gpuscope
agent`` sends, at a stable per-node offset within the first half second (its default send
spread), so a tick's batches come twice as dense as an even spread; ``even`` over the whole
second (the shape of the rounds before the agents' send offset, and friendlier); ``aligned`` all
at the tick. The anchor gets the same shape.

Batches go as binary frames (``application/vnd.gpuscope.frame``), as agents send them; ``--json``
sends the JSON batches of earlier rounds instead.

The measured window is steady state: it starts at tick ``WARM_TICKS`` and lasts a whole number of
the hub's commit intervals (``storage.flush_interval_s``), and the agents keep sending for
``TAIL_TICKS`` more ticks after it, so no sender falls silent while it is measured. (A window that
ran on after the last tick counted the hub raising ``node_unreachable`` for the whole fleet,
about 6 ms of CPU an alert, a cost of the bench stopping the agents, not of ingest.)

``--py-spy FILE`` samples the served hub process (all its threads, idle ones left out) with py-spy
(the ``bench`` extra) over the run and writes its collapsed stacks to FILE, for a flame graph or a
count by function, and each ingest worker's to ``FILE.worker<N>``; it costs the hub nothing it
counts (py-spy reads the process from outside, without pausing it). With ``--ingest-workers`` the
workers' CPU is also given by thread, split into user and system (kernel) time.

usage: python bench/bench_hub_cpu.py [--nodes 64] [--ticks 30] [--agents 32] [--json]
       [--ingest-workers N] [--py-spy FILE] [--shape agents|even|aligned]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import psutil

from common import console, gpuscope_hub, hub_flush_interval_s, print_table, victoria_metrics_binary
from gpuscope.agent.agent import send_offset
from gpuscope.hub import Hub
from gpuscope.ingest.frame import CONTENT_TYPE, JSON_CONTENT_TYPE, decode_body, encode_frame
from gpuscope.ingest.payload import Limits, check_time_window, encode_batch
from gpuscope.loadgen.traffic import FleetShape, Outgoing, build_scenario, describe
from gpuscope.sim.cluster import Simulator
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.remote.local import start_victoria_metrics

WARM_TICKS = 3
#: ticks sent after the measured window, so that every agent still reports while it is measured
TAIL_TICKS = 2
#: the hub commits every ``storage.flush_interval_s`` (VictoriaMetrics flushes each second): a
#: window of whole intervals holds as many commits as its seconds of traffic need
COMMIT_S = hub_flush_interval_s()
#: time to encode the ticks before the first one is due
ENCODE_S = 5.0
#: a hub process starting on a busy shared machine (imports, DuckDB) may take longer than 30 s
HUB_START_S = 180.0

Ticks = list[tuple[float, list[Outgoing]]]

#: the body's media type: set once from ``--json`` before any run
content_type = CONTENT_TYPE
#: the agent's default send spread at its default 1-s interval (half the interval)
AGENT_SPREAD_S = 0.5
#: each tick's batch ``i`` leaves ``OFFSETS[i]`` seconds after the tick: set once from ``--shape``
OFFSETS: list[float] = []


def node_ticks(nodes: int, ticks: int) -> Ticks:
    """Per tick, its wall time and the agents' batches (SDK batches left out: this is the per-node
    figure) encoded as :data:`content_type`, the first tick due a few seconds from now."""
    scenario = build_scenario(FleetShape(nodes=nodes), ticks + 5, faults=[])
    encode = encode_batch if content_type == JSON_CONTENT_TYPE else encode_frame
    t0 = time.time() + ENCODE_S
    out = []
    for tick in Simulator(scenario, t0=t0).ticks():
        out.append((t0 + tick.t, [describe(b, encode(b)) for b in tick.node_batches.values()]))
        if len(out) == ticks:
            break
    return out


T = TypeVar("T")
Item = TypeVar("Item")


def paced(ticks: list[tuple[float, T]]) -> Iterator[tuple[int, T]]:
    """Each tick at its wall time, as agents send them (at once when running late)."""
    for k, (t, tick) in enumerate(ticks):
        time.sleep(max(0.0, t - time.time()))
        yield k, tick


def spread(pool: ThreadPoolExecutor, send: Callable[[Item], int], items: list[Item]) -> list[Future[int]]:
    """Submit the items of one tick at their offsets after it (:data:`OFFSETS`: the ``--shape``)."""
    start = time.time()
    futures = []
    for offset, i in sorted((OFFSETS[i], i) for i in range(len(items))):
        time.sleep(max(0.0, start + offset - time.time()))
        futures.append(pool.submit(send, items[i]))
    return futures


def shape_offsets(shape: str, senders: list[str]) -> list[float]:
    """Each sender's send time after its tick, in seconds: ``agents`` as ``gpuscope agent`` sends
    (at the tick plus a stable hash of its node name in ``[0, interval / 2)``, the default spread),
    ``even`` spread evenly over the second (the friendlier shape of earlier rounds), ``aligned``
    all on the tick (agents before they had a send offset)."""
    if shape == "even":
        return [i / len(senders) for i in range(len(senders))]
    if shape == "aligned":
        return [0.0] * len(senders)
    return [send_offset(node, AGENT_SPREAD_S) for node in senders]


def measured_ticks(n_ticks: int) -> int:
    """Ticks in the measured window: whole commit intervals between the warm-up and the tail."""
    whole = int((n_ticks - WARM_TICKS - TAIL_TICKS) // COMMIT_S * COMMIT_S)
    if whole <= 0:
        raise SystemExit(f"--ticks must be at least {WARM_TICKS + TAIL_TICKS + COMMIT_S:.0f}")
    return whole


def steady(
    pool: ThreadPoolExecutor,
    ticks: list[tuple[float, list[Item]]],
    send: Callable[[Item], int],
    cpu: Callable[[], float],
    after_tick: Callable[[], object] = lambda: None,
) -> tuple[float, int, int]:
    """Send every tick at its pace; CPU seconds (``cpu``), batches and samples of the measured
    window, from the start of tick ``WARM_TICKS`` to the start of the first tail tick."""
    end = WARM_TICKS + measured_ticks(len(ticks))
    cpu0 = cpu1 = 0.0
    batches, measured = 0, list[Future[int]]()
    for k, tick in paced(ticks):
        if k == WARM_TICKS:
            cpu0 = cpu()
        if k == end:
            cpu1 = cpu()
        sent = spread(pool, send, tick)
        after_tick()
        if WARM_TICKS <= k < end:
            batches += len(tick)
            measured += sent
    return cpu1 - cpu0, batches, sum(f.result() for f in measured)


def process_cpu(proc: psutil.Process) -> Callable[[], float]:
    def cpu() -> float:
        t = proc.cpu_times()
        return float(t.user + t.system)

    return cpu


class SplitCpu:
    """The CPU seconds of a hub and its ingest workers together (what :func:`steady` reads),
    keeping each reading's part of the hub process alone, so that the measured window's split
    between the hub and its workers is known too."""

    def __init__(self, hub: psutil.Process, workers: list[psutil.Process]) -> None:
        self.proc = hub
        self.hub = process_cpu(hub)
        self.worker_procs = workers
        self.workers = [process_cpu(w) for w in workers]
        self.readings: list[tuple[float, float]] = []  # (hub process, workers)
        self.threads: list[dict[int, float]] = []  # the hub process's CPU seconds by thread id
        #: the workers' (user, system) CPU seconds by (process id, thread id)
        self.worker_threads: list[dict[tuple[int, int], tuple[float, float]]] = []

    def __call__(self) -> float:
        self.threads.append({t.id: t.user_time + t.system_time for t in self.proc.threads()})
        self.worker_threads.append(
            {(w.pid, t.id): (t.user_time, t.system_time) for w in self.worker_procs for t in w.threads()}
        )
        reading = (self.hub(), sum(w() for w in self.workers))
        self.readings.append(reading)
        return reading[0] + reading[1]

    def by_worker_thread(self, names: dict[int, str]) -> dict[str, tuple[float, float]]:
        """The workers' (user, system) CPU seconds between the first and last reading by thread,
        the same thread of each worker added up: its name from ``names`` (py-spy's), the main
        thread (the event loop) by its id, any other by its id."""
        out: dict[str, tuple[float, float]] = {}
        first, last = self.worker_threads[0], self.worker_threads[-1]
        for (pid, tid), (user, system) in last.items():
            user0, system0 = first.get((pid, tid), (0.0, 0.0))
            name = "MainThread (event loop)" if tid == pid else names.get(tid, f"thread {tid}")
            had = out.get(name, (0.0, 0.0))
            out[name] = (had[0] + user - user0, had[1] + system - system0)
        return out

    def by_thread(self) -> dict[int, float]:
        """CPU seconds of each of the hub process's threads between the first and last reading
        (a thread that ended meanwhile is left out)."""
        first, last = self.threads[0], self.threads[-1]
        return {tid: s - first.get(tid, 0.0) for tid, s in last.items()}

    def split(self) -> tuple[float, float]:
        """CPU seconds of the hub process and of the workers between the first and last reading."""
        (h0, w0), (h1, w1) = self.readings[0], self.readings[-1]
        return h1 - h0, w1 - w0


def post_node_ticks(url: str, ticks: Ticks, agents: int, cpu: Callable[[], float]) -> tuple[float, int, int]:
    """:func:`node_ticks` posted to a hub at ``url`` at their pace over ``agents`` kept-alive
    connections; :func:`steady`'s CPU seconds (read with ``cpu``), batches and samples."""
    clients = [httpx.Client(base_url=url, timeout=60) for _ in range(agents)]
    headers = {"Content-Type": content_type}

    def send(item: tuple[int, Outgoing]) -> int:
        reply = clients[item[0] % agents].post("/api/v1/ingest", content=item[1].body, headers=headers)
        reply.raise_for_status()
        return item[1].samples

    try:
        with ThreadPoolExecutor(agents) as pool:
            return steady(pool, [(t, list(enumerate(tick))) for t, tick in ticks], send, cpu)
    finally:
        for c in clients:
            c.close()


#: ``--ingest-workers``: the hub's hub.ingest_workers, and the split it measured (CPU s: hub, workers)
INGEST_WORKERS = 0
SPLIT: list[tuple[float, float]] = []
#: the hub process's CPU seconds by thread (its name where py-spy saw it, else its id)
THREADS: list[dict[str, float]] = []
#: the ingest workers' (user, system) CPU seconds by thread, the workers added up
WORKER_THREADS: list[dict[str, tuple[float, float]]] = []
#: ``--py-spy``: where py-spy writes the hub process's collapsed stacks (None: not sampled)
PY_SPY: Path | None = None


def thread_names(stacks: Path) -> dict[int, str]:
    """Thread ids to names, from py-spy's collapsed stacks (``thread (tid): name;frame;... n``);
    threads Python did not start (DuckDB's) are not in them."""
    names: dict[int, str] = {}
    if not stacks.exists():
        return names
    for line in stacks.read_text().splitlines():
        head = line.split(";", 1)[0]
        if head.startswith("thread (") and "): " in head:
            tid, _, name = head[len("thread (") :].partition("): ")
            if tid.isdigit():
                names[int(tid)] = name
    return names


def worker_stacks(index: int) -> Path:
    """Where py-spy writes ingest worker ``index``'s collapsed stacks (beside :data:`PY_SPY`'s)."""
    assert PY_SPY is not None
    return PY_SPY.with_name(f"{PY_SPY.name}.worker{index}")


def py_spy(pid: int, seconds: float, output: Path | None) -> subprocess.Popen[bytes] | None:
    """py-spy sampling process ``pid`` for ``seconds`` into ``output``, if asked for."""
    if output is None:
        return None
    binary = shutil.which("py-spy")
    if binary is None:
        raise SystemExit("--py-spy: py-spy is not installed (pip install -e '.[bench]')")
    argv = [binary, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--format", "raw"]
    argv += ["--nonblocking", "--threads", "--rate", "200", "--output", str(output)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL)


def over_http(nodes: int, n_ticks: int, agents: int) -> tuple[float, int, int]:
    """Hub CPU seconds (its ingest workers' included), batches and samples acknowledged after
    the warm-up ticks."""
    extra = ["--ingest-workers", str(INGEST_WORKERS)] if INGEST_WORKERS else []
    with (
        tempfile.TemporaryDirectory() as tmp,
        gpuscope_hub(Path(tmp) / "hub.duckdb", extra, ready_s=HUB_START_S) as (
            url,
            proc,
        ),
    ):
        ticks = node_ticks(nodes, n_ticks)
        hub = psutil.Process(proc.pid)
        workers = hub.children()  # the workers answered before the hub did
        cpu = SplitCpu(hub, workers)
        seconds = ticks[-1][0] - time.time() + 1
        samplers = [py_spy(proc.pid, seconds, PY_SPY)]
        if PY_SPY is not None:
            samplers += [py_spy(w.pid, seconds, worker_stacks(i)) for i, w in enumerate(workers)]
        result = post_node_ticks(url, ticks, agents, cpu)
        for sampler in samplers:
            if sampler is not None:
                sampler.wait()
        names = thread_names(PY_SPY) if PY_SPY is not None else {}
        THREADS.append({names.get(tid, f"thread {tid}"): s for tid, s in cpu.by_thread().items()})
        if PY_SPY is not None:
            for i in range(len(workers)):
                names.update(thread_names(worker_stacks(i)))
        WORKER_THREADS.append(cpu.by_worker_thread(names))
        SPLIT.append(cpu.split())
        health = httpx.get(f"{url}/api/v1/health", timeout=60).json()
        sent = sum(len(tick) for _, tick in ticks)
        # the ingest log's group commit: how many requests share a sync (the workers' logs are
        # counted in the hub's counters, from their reports)
        for who, counters in (("hub", health["store"]["counters"]), ("workers", health["counters"])):
            syncs = counters.get("store.log_syncs")
            if syncs is not None:
                console.print(
                    f"{who}: {syncs:,} ingest-log syncs for {sent:,} batches ({syncs / sent:.2f} a batch)"
                )
        return result


def prometheus_text(o: Outgoing) -> bytes:
    """One node batch as Prometheus text without timestamps (VictoriaMetrics stamps them)."""
    batch = decode_body(content_type, o.body, Limits())
    lines = []
    for frame in batch.frames:
        for labels, row in zip(frame.entities, frame.values.tolist(), strict=True):
            sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines += [f"{m}{{{sel}}} {v:.6g}" for m, v in zip(frame.metrics, row, strict=True) if v == v]
    return ("\n".join(lines) + "\n").encode()


def victoria(nodes: int, n_ticks: int, agents: int) -> tuple[float, int, int] | None:
    """VictoriaMetrics' CPU seconds, requests and samples acknowledged after the warm-up ticks."""
    binary = victoria_metrics_binary()
    if binary is None:
        console.print("[yellow]victoria-metrics not installed: its anchor is skipped[/yellow]")
        return None
    db = start_victoria_metrics(binary)
    try:
        ticks = node_ticks(nodes, n_ticks)
        bodies = [(t, [(prometheus_text(o), o.samples) for o in tick]) for t, tick in ticks]
        vm = psutil.Process(db.proc.pid)
        clients = [httpx.Client(base_url=db.url, timeout=60) for _ in range(agents)]

        def send(item: tuple[int, tuple[bytes, int]]) -> int:
            reply = clients[item[0] % agents].post("/api/v1/import/prometheus", content=item[1][0])
            reply.raise_for_status()
            return item[1][1]

        with ThreadPoolExecutor(agents) as pool:
            result = steady(pool, [(t, list(enumerate(tick))) for t, tick in bodies], send, process_cpu(vm))
        for c in clients:
            c.close()
        return result
    finally:
        db.stop()


def in_process(nodes: int, n_ticks: int, agents: int) -> tuple[float, int, int]:
    """The same batches without HTTP: decode, validate, store (durable log, a commit every
    ``storage.flush_interval_s``), detect, evaluate."""
    limits = Limits()
    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(DuckDBStore(str(Path(tmp) / "hub.duckdb")))
        ticks = node_ticks(nodes, n_ticks)

        def ingest(o: Outgoing) -> int:
            batch = decode_body(content_type, o.body, limits)
            check_time_window(batch, time.time(), limits)
            hub.ingest(batch)
            return o.samples

        with ThreadPoolExecutor(agents) as pool:
            result = steady(pool, ticks, ingest, time.process_time, lambda: hub.evaluate(time.time()))
        hub.store.close()
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--agents", type=int, default=32, help="concurrent connections")
    ap.add_argument("--json", action="store_true", help="send JSON batches instead of binary frames")
    ap.add_argument(
        "--ingest-workers", type=int, default=0, help="the hub's hub.ingest_workers (0: in its process)"
    )
    ap.add_argument("--py-spy", type=Path, help="write py-spy's collapsed stacks of the hub process here")
    ap.add_argument(
        "--shape",
        choices=("agents", "even", "aligned"),
        default="agents",
        help="when each batch leaves after its tick: as agents send (default), evenly, or all at the tick",
    )
    a = ap.parse_args()
    global content_type, INGEST_WORKERS, PY_SPY, OFFSETS
    content_type = JSON_CONTENT_TYPE if a.json else CONTENT_TYPE
    INGEST_WORKERS = a.ingest_workers
    PY_SPY = a.py_spy
    OFFSETS = shape_offsets(a.shape, [o.sender for o in node_ticks(a.nodes, 1)[0][1]])
    console.print(
        f"{a.ticks} ticks of {a.nodes} agents' batches, one tick a second ({a.shape} shape), per system; "
        f"{measured_ticks(a.ticks)} measured after {WARM_TICKS} warm-up ticks"
    )
    rows = []
    figures: dict[str, float] = {}
    for name, run in (
        ("gpuscope hub over HTTP", over_http),
        ("anchor: VictoriaMetrics, same samples, one request per node batch", victoria),
        ("anchor: same hub work in process, no HTTP", in_process),
    ):
        measured = run(a.nodes, a.ticks, a.agents)
        if measured is None:
            rows.append([name, "skipped", "", "", ""])
            continue
        cpu, batches, samples = measured
        figures[name] = samples / cpu
        rows.append([name, f"{batches:,}", f"{cpu * 1e3 / batches:.2f}", f"{samples / cpu:,.0f}", ""])
        if run is over_http:
            if INGEST_WORKERS:
                hub_s, workers_s = SPLIT[-1]
                parts = (("hub process alone", hub_s), (f"its {INGEST_WORKERS} ingest workers", workers_s))
                for part, seconds in parts:
                    rows.append([f"  of which {part}", "", f"{seconds * 1e3 / batches:.2f}", "", ""])
                by_thread = sorted(WORKER_THREADS[-1].items(), key=lambda kv: -sum(kv[1]))
                for thread, (user, system) in by_thread:
                    if (user + system) * 1e3 / batches >= 0.005:
                        ms = f"{(user + system) * 1e3 / batches:.3f} (sys {system * 1e3 / batches:.3f})"
                        rows.append([f"    workers' thread {thread}", "", ms, "", ""])
            threads = sorted(THREADS[-1].items(), key=lambda kv: -kv[1])
            for thread, seconds in threads:
                if seconds * 1e3 / batches >= 0.005:
                    rows.append([f"    hub thread {thread}", "", f"{seconds * 1e3 / batches:.3f}", "", ""])
    hub_rate = figures["gpuscope hub over HTTP"]
    vm_rate = figures.get("anchor: VictoriaMetrics, same samples, one request per node batch")
    rows[0][4] = "≥ 300,000 (issue 9)"
    if vm_rate:
        rows[0][4] += f"; ratio to VictoriaMetrics {hub_rate / vm_rate:.2f} (≥ 1.0, issue 13)"
    load = os.getloadavg()
    print_table(
        f"hub CPU per node batch ({a.nodes} agents, {a.shape} shape, {samples // batches} samples per batch, "
        f"{content_type}; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})",
        ["path", "batches", "CPU ms/batch", "samples per CPU-s", "target"],
        rows,
    )


if __name__ == "__main__":
    main()
