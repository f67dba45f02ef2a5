"""The shape real agents send: a fleet of real agents, every one posting on the same instant.

Agents align their rounds to multiples of the interval on their clocks, and nodes are synchronised
by NTP, so a fleet's agents all collect on the same instant. Sending right after collecting (as
agents did before each got a send offset), 1,024 of them post within a few tens of milliseconds
every second, while the hub admits ``overload.max_in_flight`` (256) requests at a time and sheds
the rest with 503 + Retry-After. The other benches post a tick's batches evenly over the second
(``bench_hub_cpu.py``) or through a few connections (the load generator): a friendlier shape than
the one agents produce.

This runs a real hub process (``gpuscope hub``, default settings) and N real
:class:`~gpuscope.agent.agent.Agent` objects, each ``run()`` in its own thread, split over
``--procs`` client processes so the client is not one interpreter's bottleneck. Each agent's
collector replays pre-built simulator node batches (8 GPUs, the full metric set, about 375
samples a round), stamped with the round's tick; the spools are in a temporary directory, not
synced. Per mode and fleet size, over the ``--seconds`` after ``--warm`` seconds:

- acknowledged / collected: batches the hub stored (the agents' ``batches_sent``, spooled ones
  replayed included) against rounds collected, in the window, and the rounds the agents missed
  (a client process starved of CPU: its agents' loops ran late);
- 503s: requests the hub shed (its ``shed_requests``, between its first and last answer in the
  window), and the agents' failed attempts (503s, timeouts, refused connections);
- backlog: batches left in the agents' spools once they stopped;
- behind: the hub's overload episodes in the window and the seconds its /api/v1/health said
  ``behind`` (read every 0.5 s), i.e. how long ``hub_overloaded`` had cause, and the reads it did
  not answer within 2 s (a hub that answers nothing is not seen behind: read both);
- the hub's CPU seconds in the window (psutil, the process and its children, all threads), and
  the clients' (to show whether the client side kept up).

Modes: ``aligned`` (``send_spread=0``: every agent posts at its tick) and ``offset`` (the default:
each agent posts at its tick plus a stable offset of its own in [0, interval/2)). Runs alternate
modes, and each row carries the machine's load average.

No VictoriaMetrics anchor: this compares two shapes of the same load on the same hub, not the hub
with another store (``bench_hub_cpu.py`` has that anchor).

``--max-in-flight N`` gives the hub a smaller ``overload.max_in_flight`` than its 256 (the hub
process patched at start: no config key sets it): a fleet four times larger than it (1,024 nodes
against 256) at a size a small machine can run.

usage: python bench/bench_aligned.py [--nodes 256,512] [--modes aligned,offset] [--repeats 1]
       [--seconds 40] [--warm 8] [--procs 4] [--max-in-flight N]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import tempfile
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

import httpx
import psutil

from common import gpuscope_hub, print_table
from gpuscope.agent.agent import Agent
from gpuscope.collect.base import Collected, Collector
from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.model import Frame
from gpuscope.sim.cluster import Simulator

#: pre-built rounds each agent replays in turn
REPLAY_TICKS = 4
MODES = {"aligned": 0.0, "offset": None}  # send_spread: None is the agent's default
#: the counters summed over a client process's agents
SUMMED = ("rounds", "rounds_missed", "batches_sent", "send_failures", "spool_pending_batches")


class Replay(Collector):
    """A node's pre-built simulator frames, round after round, stamped with the round's tick."""

    name: ClassVar[str] = "replay"

    def __init__(self, node: str, rounds: list[list[Frame]]) -> None:
        super().__init__(node)
        self.rounds, self.k = rounds, 0

    def collect(self, now: float) -> Collected:
        frames = self.rounds[self.k % len(self.rounds)]
        self.k += 1
        return Collected(frames=[replace(f, ts=now) for f in frames])


def node_rounds(nodes: int) -> dict[str, list[list[Frame]]]:
    """Per node, ``REPLAY_TICKS`` rounds of the simulator's frames (events and training left out)."""
    scenario = build_scenario(FleetShape(nodes=nodes), REPLAY_TICKS + 2, faults=[])
    out: dict[str, list[list[Frame]]] = {}
    for k, tick in enumerate(Simulator(scenario, t0=time.time()).ticks()):
        if k == REPLAY_TICKS:
            break
        for node, batch in tick.node_batches.items():
            out.setdefault(node, []).append(batch.frames)
    return out


def totals(agents: list[Agent]) -> dict[str, int]:
    out = dict.fromkeys(SUMMED, 0)
    for agent in agents:
        stats = agent.stats()
        for key in SUMMED:
            out[key] += stats.get(key, 0)
    return out


def client(
    url: str, rounds: dict[str, list[list[Frame]]], spread: float | None, spool: str, conn: Connection
) -> None:
    """One client process: builds its agents (each an HTTP client with its TLS context: seconds for
    a hundred on a busy machine), says so, and is told when to start them and when the window is;
    its counters at the window's ends and its spools' backlog once stopped go back."""
    logging.getLogger("gpuscope").setLevel(logging.ERROR)  # a shed agent's warnings, a thousand times
    agents = [
        Agent(url, node, [Replay(node, r)], spool_dir=Path(spool) / node, fsync=False, send_spread=spread)
        for node, r in rounds.items()
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=a.run, args=(stop,), daemon=True) for a in agents]
    conn.send("ready")
    start, window = conn.recv()
    time.sleep(max(0.0, start - time.time()))
    for t in threads:
        t.start()
    me = psutil.Process()
    marks = []
    for at in window:
        time.sleep(max(0.0, at - time.time()))
        marks.append((totals(agents), sum(me.cpu_times()[:2])))
    stop.set()
    for t in threads:
        t.join(10)
    conn.send((marks, totals(agents)["spool_pending_batches"]))
    for a in agents:
        a.close()


def hub_cpu(proc: psutil.Process) -> float:
    procs = [proc, *proc.children(recursive=True)]
    return sum(sum(p.cpu_times()[:2]) for p in procs)


class HealthWatch(threading.Thread):
    """Reads the hub's overload status every 0.5 s through ``window``: the seconds it said it was
    behind, the reads it did not answer within 2 s, and its shed requests and overload episodes
    between its first and its last answer in the window (its first answer may come late: a hub
    starved of CPU answers nothing for seconds)."""

    def __init__(self, url: str, window: tuple[float, float]) -> None:
        super().__init__(daemon=True)
        self.url, self.window = url, window
        self.behind_s, self.unanswered, self.shed, self.episodes = 0.0, 0, 0, 0

    def run(self) -> None:
        answers: list[dict[str, Any]] = []
        with httpx.Client(timeout=2) as reader:
            time.sleep(max(0.0, self.window[0] - time.time()))
            while time.time() < self.window[1]:
                started = time.time()
                try:
                    answers.append(reader.get(f"{self.url}/api/v1/health").json()["overload"])
                    self.behind_s += 0.5 * bool(answers[-1]["behind"])
                except httpx.HTTPError:
                    self.unanswered += 1
                time.sleep(max(0.0, started + 0.5 - time.time()))
        if answers:
            self.shed = answers[-1]["shed_requests"] - answers[0]["shed_requests"]
            self.episodes = answers[-1]["episodes"] - answers[0]["episodes"]


def run(nodes: int, mode: str, seconds: float, warm: float, procs: int, max_in_flight: int) -> list[str]:
    rounds = node_rounds(nodes)
    names = sorted(rounds)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        return measure(
            Path(tmp), nodes, mode, seconds, warm, procs, hub_entry(max_in_flight), rounds, names, load
        )


def hub_entry(max_in_flight: int) -> list[str] | None:
    """The hub's command line with ``overload.max_in_flight`` set (no config key sets it: the hub
    builds its overload monitor with the defaults), or None for the hub as it is."""
    if not max_in_flight:
        return None
    code = (
        "import sys, gpuscope.hub as h; from gpuscope.cli import main; "
        "from gpuscope.ingest.overload import OverloadMonitor as M, OverloadSettings as S; "
        f"h.OverloadMonitor = lambda: M(S(max_in_flight={max_in_flight})); sys.exit(main())"
    )
    return ["-c", code]


def measure(
    tmp: Path,
    nodes: int,
    mode: str,
    seconds: float,
    warm: float,
    procs: int,
    entry: list[str] | None,
    rounds: dict[str, list[list[Frame]]],
    names: list[str],
    load: float,
) -> list[str]:
    with gpuscope_hub(tmp / "hub.duckdb", ready_s=180, entry=entry) as (url, p):
        hub = psutil.Process(p.pid)
        ctx = mp.get_context("fork")
        pipes, children = [], []
        for k in range(procs):
            mine = {n: rounds[n] for n in names[k::procs]}
            ours, theirs = ctx.Pipe()
            child = ctx.Process(target=client, args=(url, mine, MODES[mode], str(tmp / f"spool{k}"), theirs))
            child.start()
            pipes.append(ours)
            children.append(child)
        for pipe in pipes:
            pipe.recv()  # its agents are built
        start = time.time() + 1.0
        window = (start + warm, start + warm + seconds)
        for pipe in pipes:
            pipe.send((start, window))
        watch = HealthWatch(url, window)
        watch.start()
        time.sleep(max(0.0, window[0] - time.time()))
        cpu0 = hub_cpu(hub)
        time.sleep(max(0.0, window[1] - time.time()))
        cpu1 = hub_cpu(hub)
        watch.join()
        reports = [pipe.recv() for pipe in pipes]
        for child in children:
            child.join(30)
    marks = [r[0] for r in reports]
    got = {key: sum(m[1][0][key] - m[0][0][key] for m in marks) for key in SUMMED}
    backlog = sum(r[1] for r in reports)  # once every agent stopped: no send in flight
    client_cpu = sum(m[1][1] - m[0][1] for m in marks)
    return [
        str(nodes),
        mode,
        f"{got['batches_sent']:,} / {got['rounds']:,}",
        f"{got['batches_sent'] / max(1, got['rounds']):.1%}",
        f"{got['rounds_missed']:,}",
        f"{watch.shed:,}",
        f"{got['send_failures']:,}",
        f"{backlog:,}",
        str(watch.episodes),
        f"{watch.behind_s:.1f} / {seconds:.0f}",
        str(watch.unanswered),
        f"{(cpu1 - cpu0) / seconds:.2f}",
        f"{client_cpu / seconds:.2f}",
        f"{load:.2f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="256,512", help="fleet sizes, comma-separated")
    parser.add_argument("--modes", default="aligned,offset")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode, alternated")
    parser.add_argument("--seconds", type=float, default=40.0, help="the measured window")
    parser.add_argument("--warm", type=float, default=8.0, help="seconds of sending before the window")
    parser.add_argument("--procs", type=int, default=4, help="client processes the agents are split over")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=0,
        help="the hub's overload.max_in_flight (default: the hub's, 256); a fleet of N against N/4 is "
        "1,024 nodes against the default at a size this machine carries",
    )
    args = parser.parse_args()
    modes = args.modes.split(",")
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        for _ in range(args.repeats):
            for mode in modes:
                rows.append(run(n, mode, args.seconds, args.warm, args.procs, args.max_in_flight))
                print(" | ".join(rows[-1]), flush=True)
    print_table(
        f"Real agents against a real hub (max_in_flight {args.max_in_flight or 'default'}): aligned posts "
        "vs a send offset per node",
        [
            "nodes",
            "mode",
            "acked / collected",
            "acked",
            "rounds missed",
            "503s (hub)",
            "failed sends",
            "spool backlog at end",
            "episodes",
            "behind s",
            "health unanswered",
            "hub CPU s/s",
            "clients CPU s/s",
            "load 1m",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
