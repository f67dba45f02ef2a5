"""Long run: the demo cluster for hours of simulated time at full speed, random faults, and then
every sample and event the senders had acknowledged counted again in the store (issue 10).

The path is the demo's (:mod:`gpuscope.demo`): a real hub (HTTP server, durable DuckDB store,
quality monitor and alerting) in a thread, one real :class:`~gpuscope.agent.agent.Agent` per
simulated node reading its GPUs through the real NVML collector over the fake NVML, and the
training and serving SDK traffic posted to the same ingest endpoint. Only the clock differs: it
is virtual, so the run goes as fast as the machine allows. The hub's evaluator thread (which runs
on the wall clock) is replaced by evaluation after every tick and store maintenance (sealing each
closed hour into a Parquet chunk, rollups, compaction) every simulated minute, as a live hub's
evaluator would run them.

Faults: a seeded random schedule with one fault of every kind of
:data:`gpuscope.sim.kinds.FAULT_KINDS` on random targets (busy GPUs, nodes, jobs, ranks, the
service), in shuffled order, one after the other; the schedule is written to the work directory
as a scenario file that ``gpuscope sim-eval`` can replay.

Counted from both sides:

- senders: every request to ``/api/v1/ingest`` passes through a counting transport; a 2xx answer
  acknowledges the batch, whose samples, events and training records are taken from the batch
  the agent (or the simulated SDK) built. Refused batches, and parts of accepted batches the hub
  refused, are counted separately. The agents' own counters must agree.
- store (after it is closed): the raw DuckDB tables and the sealed Parquet chunk files read
  directly with DuckDB: non-null metric values, (entity, ts) rows, events, training records and
  batch ids, each compared exactly with the senders' totals, plus duplicate checks.

Alerts are scored against the injected faults as ``sim-eval --report`` scores them (recall,
reported, not asserted). ``tests/hardening/test_longrun.py`` runs the same code for 18 simulated
minutes.

usage: python bench/bench_longrun.py [--hours 6] [--seed 10] [--keep DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import random
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import httpx
import orjson
import yaml

from gpuscope.agent.agent import Agent
from gpuscope.agent.sender import INGEST_PATH
from gpuscope.config import HubConfig
from gpuscope.demo import sim_nvml_nodes
from gpuscope.hub import Hub
from gpuscope.ingest.frame import CONTENT_TYPE as FRAME_CONTENT_TYPE
from gpuscope.ingest.frame import decode_frame
from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Alert, Batch
from gpuscope.quality.monitor import SOURCE as QUALITY_SOURCE
from gpuscope.runtime import assemble
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.kinds import FAULT_KINDS, GPU_TARGET, JOB_TARGET, NODE_TARGET, RANK_TARGET, SERVICE_TARGET
from gpuscope.sim.scenario import Scenario, builtin_scenario, load_scenario, parse_scenario
from gpuscope.simeval.report import Report, evaluate
from gpuscope.simeval.runner import notices
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.duckdb.chunks import Chunk, ChunkView
from gpuscope.web.auth import AuthSettings

TOKEN = "longrun-bench-token"
#: simulated seconds before the first fault: detectors learn their baselines
WARM_UP = 300.0
MAINTAIN_EVERY = 60.0
#: XID codes drawn for ``xid`` faults: fatal ones (79 drops the GPU off the bus) and app ones
#: the line of the hub's own derived series (drift scores, burn rates) in the counts
DERIVED = "hub: derived (quality)"
XID_CODES = (79, 48, 94, 119, 13, 43)
#: 2024-01-01 00:00 UTC; runs start at a whole hour plus ``--start-minute``
EPOCH_HOUR = 1_704_067_200.0


# -- the fault schedule --------------------------------------------------------------------------


def _targets(base: Scenario) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """Every target a fault of each target shape may hit in the demo's cluster. GPU faults go to
    GPUs that carry work (an idle GPU has no peers doing the same work to be compared with)."""
    training = [j for j in base.jobs if j.kind == "training"]
    services = [j for j in base.jobs if j.kind == "inference"]
    gpus = [{"node": n, "gpu": g} for j in training for _, n, g in j.placement]
    gpus += [{"node": n, "gpu": g} for j in services for n in j.nodes for g in j.gpus]
    return {
        GPU_TARGET: gpus,
        NODE_TARGET: [{"node": n} for n in base.cluster.node_names],
        JOB_TARGET: [{"job": j.name} for j in base.jobs],
        RANK_TARGET: [{"job": j.name, "rank": r} for j in training for r in range(j.world_size)],
        SERVICE_TARGET: [{"service": j.name} for j in services],
    }


def random_faults(
    base: Scenario, duration: float, rng: random.Random, kinds: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """One fault per kind (every kind of FAULT_KINDS by default), shuffled, each in its own slot of
    the run after the warm-up, starting early in the slot and lasting half to three quarters of it."""
    chosen = list(kinds if kinds is not None else FAULT_KINDS)
    rng.shuffle(chosen)
    targets = _targets(base)
    job_kind = {j.name: j.kind for j in base.jobs}
    warm = min(WARM_UP, duration / 5)
    slot = (duration - warm) / len(chosen)
    faults: list[dict[str, Any]] = []
    for i, kind in enumerate(chosen):
        spec = FAULT_KINDS[kind]
        pool = [
            t
            for t in targets[spec.target]
            if spec.job_kind is None or "job" not in t or job_kind[str(t["job"])] == spec.job_kind
        ]
        fault: dict[str, Any] = {
            "at": round(warm + i * slot + rng.uniform(0.02, 0.12) * slot),
            "kind": kind,
            "target": dict(rng.choice(pool)),
            "duration": round(rng.uniform(0.5, 0.75) * slot),
        }
        if kind == "xid":
            fault["params"] = {"code": rng.choice(XID_CODES)}
        elif kind == "gpu_failure_risk":  # the wear and its fatal XID fit inside the fault's slot
            fault["params"] = {"ramp": max(60.0, round(0.9 * fault["duration"]))}
        faults.append(fault)
    return faults


def longrun_scenario(
    duration: float, seed: int, kinds: Sequence[str] | None = None, interval: float | None = None
) -> tuple[Scenario, str]:
    """The demo's cluster, jobs and service for ``duration`` seconds with a random fault schedule
    (sampled every ``interval`` seconds, default the demo's); returns the scenario and its YAML
    text (the record of the schedule)."""
    path = builtin_scenario("demo")
    base = load_scenario(path)
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    doc.update(
        name="longrun",
        description=f"the demo cluster for {duration:g} s with a random fault schedule (seed {seed})",
        seed=seed,
        duration=duration,
        faults=random_faults(base, duration, random.Random(seed), kinds),
    )
    if interval is not None:
        doc["interval"] = interval
    text = yaml.safe_dump(doc, sort_keys=False)
    return parse_scenario(text, "longrun.yaml"), text


# -- the senders' side ---------------------------------------------------------------------------


@dataclass(slots=True)
class Sent:
    """What one sender (an agent, or an SDK source) had acknowledged, and what it had refused."""

    batches: int = 0
    samples: int = 0
    events: int = 0
    training: int = 0
    refused_batches: int = 0  # answered 4xx: never stored, never retried
    refused_samples: int = 0  # inside accepted batches, named in the hub's answer
    duplicates: int = 0  # acknowledged as a repeat of an earlier batch


@dataclass(slots=True)
class Ledger:
    """Batches as their senders built them, and the hub's answers to them, by batch id."""

    built: dict[str, tuple[str, int, int, int]] = field(default_factory=dict)
    acked: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    refused_samples: dict[str, int] = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)
    #: acknowledged only as a duplicate: the hub stored the first attempt, whose answer was lost
    #: (a timeout under load), so the sender's retry was the first answer it got
    late_acks: list[str] = field(default_factory=list)
    _acked_ids: set[str] = field(default_factory=set)
    #: (samples, events, training) of every batch the hub derived itself (quality monitor)
    derived: list[tuple[int, int, int]] = field(default_factory=list)

    def build(self, batch: Batch) -> None:
        assert batch.batch_id is not None and batch.batch_id not in self.built
        self.built[batch.batch_id] = (
            batch.source,
            batch.sample_count,
            len(batch.events),
            len(batch.training),
        )

    def answer(self, batch_id: str, response: httpx.Response) -> None:
        status = response.status_code
        if 200 <= status < 300:
            doc = response.json()
            if doc["duplicate"] and batch_id in self._acked_ids:
                self.duplicates.append(batch_id)
            else:
                self.acked.append(batch_id)
                self._acked_ids.add(batch_id)
                if doc["duplicate"]:
                    self.late_acks.append(batch_id)
            if doc["refused"]["samples"]:
                self.refused_samples[batch_id] = int(doc["refused"]["samples"])
        elif status not in (408, 429) and status < 500:  # the sender's rule for a final refusal
            self.refused.append(batch_id)

    def by_source(self) -> dict[str, Sent]:
        out: dict[str, Sent] = {}
        for ids, what in ((self.acked, "acked"), (self.refused, "refused"), (self.duplicates, "dup")):
            for batch_id in ids:
                source, samples, events, training = self.built[batch_id]
                sent = out.setdefault(source, Sent())
                if what == "acked":
                    sent.batches += 1
                    sent.samples += samples
                    sent.events += events
                    sent.training += training
                    sent.refused_samples += self.refused_samples.get(batch_id, 0)
                elif what == "refused":
                    sent.refused_batches += 1
                else:
                    sent.duplicates += 1
        if self.derived:
            out[DERIVED] = Sent(
                batches=len(self.derived),
                samples=sum(d[0] for d in self.derived),
                events=sum(d[1] for d in self.derived),
                training=sum(d[2] for d in self.derived),
            )
        return out

    def observe(self, batch: Batch) -> None:
        """A hub observer: the hub stores what its quality monitor derives beside what was sent."""
        if batch.source == QUALITY_SOURCE:
            self.derived.append((batch.sample_count, len(batch.events), len(batch.training)))


def _batch_id(request: httpx.Request) -> str:
    """Agents send binary frames, the simulated SDKs JSON: the hub's own decoder reads frames."""
    if request.headers.get("content-type", "") == FRAME_CONTENT_TYPE:
        return str(decode_frame(request.content).batch_id)
    return str(orjson.loads(request.content)["batch_id"])


class CountingTransport(httpx.BaseTransport):
    """The real HTTP transport, noting the hub's answer to every ingest request it carries."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and request.url.path == INGEST_PATH:
            response.read()
            self.ledger.answer(_batch_id(request), response)
        return response

    def close(self) -> None:
        self.inner.close()


# -- the store's side ----------------------------------------------------------------------------


@dataclass(slots=True)
class Stored:
    """Counted in the closed store's files: the DuckDB tables and the sealed Parquet chunks."""

    samples: int
    rows: int
    distinct_rows: int  # distinct (entity, ts)
    distinct_samples: int  # distinct (entity, ts, metric)
    hot_rows: int
    chunk_rows: int
    chunk_files: int
    merged_files: int  # of chunk_files: an hour's pieces merged into one
    events: int
    distinct_events: int
    training: int
    distinct_training: int
    batch_ids: list[str]
    disk_bytes: int


def count_store(path: Path) -> Stored:
    """Count what the store at ``path`` (closed) holds, reading its files with DuckDB directly."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        con.execute("SET enable_progress_bar = false")
        cols = [int(r[0]) for r in con.execute("SELECT col FROM metric_columns ORDER BY col").fetchall()]
        chunk_rows = con.execute("SELECT file, lo, hi, rows, bytes, cols FROM chunks").fetchall()
        chunks = tuple(
            Chunk(
                str(f), int(lo), int(hi), int(n), int(b), frozenset(int(c) for c in str(cs).split(",") if c)
            )
            for f, lo, hi, n, b, cs in chunk_rows
        )
        chunk_dir = Path(str(path) + ".chunks")
        metrics = [f"m{c}" for c in cols]
        src, params = ChunkView(chunk_dir, chunks).source(["ts", "entity", *metrics], "true", [], None, None)
        # a sample is a non-null, non-NaN cell; a sample stored twice is a second value of one
        # metric for one (entity, ts), looked for only among keys with more than one row
        present = [f"({m} IS NOT NULL AND NOT isnan({m}))::BIGINT" for m in metrics] or ["0"]
        rows, distinct_rows, samples = _one(
            con,
            f"SELECT count(*), count(DISTINCT (entity, ts)), sum({' + '.join(present)}) FROM ({src})",
            params,
        )
        twice = 0
        if rows != distinct_rows:
            excess = " + ".join(f"greatest(sum({p}) - 1, 0)" for p in present)
            keys, key_params = ChunkView(chunk_dir, chunks).source(["ts", "entity"], "true", [], None, None)
            # the keys stored twice first (two columns), then only their rows with every metric: a
            # CTE of all rows with all metrics, read twice, was held whole (735 MiB for 6 minutes)
            (twice,) = _one(
                con,
                f"SELECT sum(d) FROM (SELECT {excess} AS d FROM ({src}) AS raw SEMI JOIN "
                f"(SELECT entity, ts FROM ({keys}) GROUP BY entity, ts HAVING count(*) > 1) AS k "
                "USING (entity, ts) GROUP BY entity, ts)",
                [*params, *key_params],
            )
        (hot_rows,) = _one(con, "SELECT count(*) FROM samples")
        events, distinct_events = _one(
            con, "SELECT count(*), count(DISTINCT (ts, kind, labels, data)) FROM events"
        )
        training, distinct_training = _one(
            con, "SELECT count(*), count(DISTINCT (job, rank, step, ts, labels)) FROM training"
        )
        batch_ids = [str(r[0]) for r in con.execute("SELECT id FROM batch_ids").fetchall()]
    finally:
        con.close()
    wal = Path(str(path) + ".wal")
    disk = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    disk += sum((chunk_dir / c.file).stat().st_size for c in chunks)
    return Stored(
        samples=samples,
        rows=rows,
        distinct_rows=distinct_rows,
        distinct_samples=samples - twice,
        hot_rows=hot_rows,
        chunk_rows=sum(c.rows for c in chunks),
        chunk_files=len(chunks),
        merged_files=sum(c.merged for c in chunks),
        events=events,
        distinct_events=distinct_events,
        training=training,
        distinct_training=distinct_training,
        batch_ids=batch_ids,
        disk_bytes=disk,
    )


def _one(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> tuple[int, ...]:
    row = con.execute(sql, params or []).fetchall()[0]
    return tuple(int(v or 0) for v in row)


# -- the run -------------------------------------------------------------------------------------


@dataclass(slots=True)
class LongRun:
    scenario: Scenario
    schedule: str
    t0: float
    wall_s: float
    ledger: Ledger
    sent: dict[str, Sent]
    agent_stats: dict[str, dict[str, int]]
    hub_counters: dict[str, int]
    stored: Stored
    alerts: list[Alert]
    report: Report
    maintenance_runs: int
    #: the process's peak RSS (``ru_maxrss``: hub, agents, simulated SDKs and the senders' ledger)
    #: when the run ended, and again after the store was counted, which reads every file back
    peak_rss_run_bytes: int
    peak_rss_bytes: int

    def total(self, what: str) -> int:
        return sum(int(getattr(s, what)) for s in self.sent.values())

    def mismatches(self) -> list[str]:
        """Every way the two sides disagree (empty when nothing was lost or duplicated)."""
        st, out = self.stored, []
        pairs = (
            ("samples", self.total("samples") - self.total("refused_samples"), st.samples),
            ("events", self.total("events"), st.events),
            ("training records", self.total("training"), st.training),
            ("batches", len(self.ledger.acked), len(st.batch_ids)),
            ("distinct (entity, ts, metric)", st.samples, st.distinct_samples),
            ("distinct events", st.events, st.distinct_events),
            ("distinct training records", st.training, st.distinct_training),
            ("hot + sealed rows", st.hot_rows + st.chunk_rows, st.rows),
        )
        out = [f"{what}: senders {a}, store {b}" for what, a, b in pairs if a != b]
        if sorted(self.ledger.acked) != sorted(st.batch_ids):
            out.append("the store's batch ids are not the acknowledged ones")
        for name, stats in self.agent_stats.items():
            sent = self.sent.get(name, Sent())
            if (stats["batches_sent"], stats["samples_sent"]) != (sent.batches, sent.samples):
                out.append(
                    f"{name}: agent counted {stats['batches_sent']} batches / {stats['samples_sent']} "
                    f"samples sent, the transport saw {sent.batches} / {sent.samples} acknowledged"
                )
            if stats["spool_pending_batches"]:
                out.append(f"{name}: {stats['spool_pending_batches']} batches left in the spool")
        return out


def run_longrun(
    workdir: Path,
    *,
    duration: float,
    seed: int,
    t0: float,
    kinds: Sequence[str] | None = None,
    interval: float | None = None,
    progress: Callable[[float, float], None] | None = None,
    probe: Callable[[float, Hub, Ledger], None] | None = None,
    probe_every: float = 600.0,
    until: Callable[[], bool] | None = None,
) -> LongRun:
    """Play ``duration`` simulated seconds of the demo cluster with random faults from ``t0``
    (epoch seconds) through agents, HTTP and a real hub, then count both sides.

    ``probe`` is called every ``probe_every`` simulated seconds with the hub and the senders'
    ledger (memory soaks); ``until`` ends the run early once it returns True (a wall-time budget)."""
    scenario, schedule = longrun_scenario(duration, seed, kinds, interval)
    (workdir / "longrun.yaml").write_text(schedule, encoding="utf-8")
    db = workdir / "longrun.duckdb"
    store = DuckDBStore(str(db))
    cfg = HubConfig(
        tokens=[TOKEN], storage_path=str(db), price_per_gpu_hour=scenario.cluster.price_per_gpu_hour
    )
    cfg.auth = AuthSettings.from_plain([TOKEN])
    cfg.port = 0
    cfg.raw_retention_s = math.inf  # virtual time starts in the past: ingest must not refuse it as old
    # no clock thread: it would run on the wall clock, and this run evaluates on the virtual one
    runtime = assemble(cfg, store=store, evaluate_interval=None)
    hub, server = runtime.hub, runtime.server
    assert server is not None
    ledger = Ledger()
    hub.add_observer(ledger.observe)
    runtime.start(now=t0)
    now = [t0]
    sim = Simulator(scenario, t0=t0)
    nodes = sim_nvml_nodes(sim, workdir / "proc")
    agents = {
        name: Agent(
            server.url,
            name,
            node.collectors,
            interval=scenario.interval,
            token=TOKEN,
            spool_dir=workdir / "spool" / name,
            transport=CountingTransport(ledger),
            clock=lambda: now[0],
        )
        for name, node in nodes.items()
    }
    sdk = httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        transport=CountingTransport(ledger),
        timeout=30,
    )
    started = time.perf_counter()
    maintained, last_maintenance = 0, t0
    # Senders deliver concurrently, as separate nodes do (the store group-commits what arrives
    # together); store upkeep runs beside ingest on its own thread, as in a live hub.
    pool = ThreadPoolExecutor(max_workers=len(agents) + 1, thread_name_prefix="longrun-sender")
    upkeep = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longrun-upkeep")
    upkeep_run: Future[None] | None = None

    def deliver(name: str, batch: Batch) -> None:
        nodes[name].feed(batch)
        ledger.build(agents[name].step(now=now[0]))

    def post_sdk(batches: list[Batch]) -> None:
        for batch in batches:
            ledger.build(batch)
            sdk.post(INGEST_PATH, content=encode_batch(batch))

    try:
        for tick in sim.ticks():
            now[0] = t0 + tick.t
            sends = [pool.submit(deliver, name, b) for name, b in tick.node_batches.items()]
            sends.append(pool.submit(post_sdk, tick.sdk_batches))
            for send in sends:
                send.result()
            hub.evaluate(now[0])
            if now[0] - last_maintenance >= MAINTAIN_EVERY:
                if upkeep_run is not None:
                    upkeep_run.result()  # one upkeep at a time, as the hub's evaluator runs them
                upkeep_run = upkeep.submit(hub.maintain, now[0])
                maintained, last_maintenance = maintained + 1, now[0]
            if progress is not None and int(tick.t) % 600 == 0:
                progress(tick.t, scenario.duration)
            if probe is not None and tick.t % probe_every < scenario.interval:
                probe(tick.t, hub, ledger)
            if until is not None and until():
                break
        if upkeep_run is not None:
            upkeep_run.result()
        for agent in agents.values():
            agent.sender.flush()  # anything spooled goes now (nothing is, unless the hub refused)
    finally:
        pool.shutdown()
        upkeep.shutdown()
        agent_stats = {name: agent.stats() for name, agent in agents.items()}
        for agent in agents.values():
            agent.close()
        sdk.close()
        runtime.stop()  # closes the store: everything committed, the WAL checkpointed
    wall = time.perf_counter() - started
    peak_run = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sent = ledger.by_source()
    # the senders' side, kept on disk: a failure while counting the store must not lose it
    (workdir / "sent.json").write_bytes(
        orjson.dumps({"sent": {k: dataclasses.asdict(v) for k, v in sent.items()}, "agents": agent_stats})
    )

    def shift(alerts: list[Alert]) -> list[Alert]:
        return [
            dataclasses.replace(
                a,
                started_at=a.started_at - t0,
                resolved_at=None if a.resolved_at is None else a.resolved_at - t0,
            )
            for a in alerts
        ]

    shifted = shift(hub.alerts.all())
    return LongRun(
        scenario=scenario,
        schedule=schedule,
        t0=t0,
        wall_s=wall,
        ledger=ledger,
        sent=sent,
        agent_stats=agent_stats,
        hub_counters=hub.counters.snapshot(),
        stored=count_store(db),
        alerts=shifted,
        report=evaluate(scenario, shift(notices(hub.alerts.all()))),
        maintenance_runs=maintained,
        peak_rss_run_bytes=peak_run,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    )


# -- the benchmark -------------------------------------------------------------------------------


def _print(run: LongRun) -> None:
    from common import print_table  # bench/ is on the path only when run as a script

    st, rep = run.stored, run.report
    rows = [
        [name, f"{s.batches:,}", f"{s.samples:,}", f"{s.events:,}", f"{s.training:,}", f"{s.refused_batches}"]
        for name, s in sorted(run.sent.items())
    ]
    rows.append(
        [
            "all (senders + derived)",
            f"{run.total('batches'):,}",
            f"{run.total('samples'):,}",
            f"{run.total('events'):,}",
            f"{run.total('training'):,}",
            f"{run.total('refused_batches')}",
        ]
    )
    rows.append(
        ["store", f"{len(st.batch_ids):,}", f"{st.samples:,}", f"{st.events:,}", f"{st.training:,}", "-"]
    )
    print_table(
        "acknowledged by the hub (senders' side) vs counted in the store",
        ["sender", "batches", "samples", "events", "training records", "refused batches"],
        rows,
    )
    detected = sum(o.alert_id is not None for o in rep.outcomes)
    missed = sorted(o.fault.kind for o in rep.outcomes if o.alert_id is None)
    sim_h = run.scenario.duration / 3600
    samples = max(st.samples, 1)
    print_table(
        f"long run: demo cluster, {sim_h:g} simulated hours, random faults (seed {run.scenario.seed})",
        ["figure", "value"],
        [
            ["simulated hours", f"{sim_h:g}"],
            ["wall time", f"{run.wall_s:,.0f} s ({run.scenario.duration / run.wall_s:,.1f}x real time)"],
            ["samples sent / stored", f"{run.total('samples'):,} / {st.samples:,}"],
            ["events sent / stored", f"{run.total('events'):,} / {st.events:,}"],
            ["training records sent / stored", f"{run.total('training'):,} / {st.training:,}"],
            ["batches acknowledged / batch ids stored", f"{len(run.ledger.acked):,} / {len(st.batch_ids):,}"],
            ["of which acknowledged on a retry (first answer lost)", f"{len(run.ledger.late_acks):,}"],
            [
                "refused batches / refused samples",
                f"{run.total('refused_batches')} / {run.total('refused_samples')}",
            ],
            [
                "raw rows: hot table + sealed chunks",
                f"{st.hot_rows:,} + {st.chunk_rows:,} in {st.chunk_files} files",
            ],
            [
                "duplicate samples / events / rows",
                f"{st.samples - st.distinct_samples} / "
                f"{st.events - st.distinct_events} / {st.rows - st.distinct_rows}",
            ],
            ["maintenance runs (seal, rollup, compact)", f"{run.maintenance_runs}"],
            [
                "faults injected (kinds)",
                f"{len(run.scenario.faults)} ({len({f.kind for f in run.scenario.faults})})",
            ],
            ["alerts fired", f"{len(run.alerts)}"],
            ["recall (faults detected)", f"{rep.recall:.0%} ({detected}/{len(rep.outcomes)})"],
            ["precision", f"{rep.precision:.0%}"],
            ["missed", ", ".join(missed) or "-"],
            ["store size on disk", f"{st.disk_bytes / 2**20:,.1f} MiB"],
            ["bytes per stored sample (all files)", f"{st.disk_bytes / samples:.3f}"],
            [
                "peak RSS, one process: hub + senders, during the run",
                f"{run.peak_rss_run_bytes / 2**20:,.0f} MiB",
            ],
            ["peak RSS, also counting the store afterwards", f"{run.peak_rss_bytes / 2**20:,.0f} MiB"],
        ],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=6.0, help="simulated hours (default 6)")
    parser.add_argument("--seed", type=int, default=10, help="seed of the fault schedule and the cluster")
    parser.add_argument("--start-minute", type=int, default=50, help="minute of the hour the run starts at")
    parser.add_argument("--interval", type=float, help="sampling interval, seconds (default: the demo's, 1)")
    parser.add_argument("--keep", type=Path, help="keep the store and the schedule in this directory")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="bench-longrun-"))
    workdir.mkdir(parents=True, exist_ok=True)

    def progress(t: float, end: float) -> None:
        print(f"  {t / 3600:5.2f} / {end / 3600:g} simulated hours", file=sys.stderr, flush=True)

    try:
        run = run_longrun(
            workdir,
            duration=args.hours * 3600,
            seed=args.seed,
            t0=EPOCH_HOUR + 60 * args.start_minute,
            interval=args.interval,
            progress=progress,
        )
        _print(run)
        problems = run.mismatches()
        for problem in problems:
            print(f"MISMATCH {problem}", file=sys.stderr)
        print("counts agree exactly" if not problems else f"{len(problems)} mismatches", file=sys.stderr)
        return 1 if problems else 0
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
