"""``gpuscope loadgen``: play a simulated fleet into running hubs and print what they sustained."""

from __future__ import annotations

import argparse
import os
import sys

import orjson
from rich.console import Console
from rich.table import Table

from gpuscope.huburl import hub_urls, split_urls
from gpuscope.loadgen.run import LoadOptions, LoadReport, run_load
from gpuscope.loadgen.traffic import FleetShape


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hubs",
        "--hub",
        dest="hubs",
        type=hub_urls,
        required=True,
        help="hub URLs, comma-separated (any agent may send to any)",
    )
    parser.add_argument("--nodes", type=int, default=1024, help="simulated nodes, one agent each (1024)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per simulated node (8)")
    parser.add_argument("--job-nodes", type=int, default=16, help="nodes per training job (16)")
    parser.add_argument("--duration", type=float, default=600, help="seconds of load (600)")
    parser.add_argument("--workers", type=int, default=2, help="sender processes (2)")
    parser.add_argument("--connections", type=int, default=64, help="connections per hub per sender (64)")
    parser.add_argument("--token", default=None, help="bearer token for writes (or GPUSCOPE_TOKEN)")
    parser.add_argument(
        "--hub-pid", type=int, action="append", default=[], help="a hub's PID, for its CPU and RSS (repeat)"
    )
    parser.add_argument("--no-faults", action="store_true", help="a healthy fleet: inject no faults")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")


def print_report(report: LoadReport, title: str, console: Console | None = None) -> None:
    table = Table(title=title)
    for column in ("figure", "value", "budget / note"):
        table.add_column(column)
    for row in report.rows():
        table.add_row(*row)
    (console or Console()).print(table)


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    hubs = split_urls(args.hubs)  # checked by the option's type
    if min(args.nodes, args.gpus_per_node, args.job_nodes, args.workers, args.duration) < 1:
        err.print(
            "[red]--nodes, --gpus-per-node, --job-nodes, --workers and --duration must be at least 1[/red]"
        )
        return 2
    opts = LoadOptions(
        hubs=hubs,
        shape=FleetShape(nodes=args.nodes, gpus_per_node=args.gpus_per_node, job_nodes=args.job_nodes),
        duration=args.duration,
        workers=args.workers,
        connections=args.connections,
        token=args.token or os.environ.get("GPUSCOPE_TOKEN"),
        hub_pids=args.hub_pid,
        faults=[] if args.no_faults else None,
    )
    report = run_load(opts, say=lambda line: err.print(line))
    if args.json:
        sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
    else:
        print_report(report, f"load: {args.nodes} agents at 1 Hz for {args.duration:g} s")
    return 0 if report.drops == 0 else 1
