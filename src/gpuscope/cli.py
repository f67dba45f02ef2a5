"""gpuscope: watch GPU clusters and the training and inference running on them."""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from gpuscope import __version__
from gpuscope.argtypes import port_number, positive_seconds
from gpuscope.cli_client import add_verbose_option
from gpuscope.completion import SHELLS, walk
from gpuscope.completion import script as completion_script
from gpuscope.config import DEFAULT_PORT, ConfigError, load_config, parse_ingest_workers
from gpuscope.config_check import check_config
from gpuscope.config_reference import render as render_reference

Command = Callable[[argparse.Namespace], int]

err = Console(stderr=True)
if not err.is_terminal:
    err = Console(stderr=True, width=140)  # logs and CI: keep report tables readable


def _cmd_hub(args: argparse.Namespace) -> int:
    from gpuscope.redact import install_redaction, secret_strings
    from gpuscope.runtime import AssemblyError, assemble
    from gpuscope.store.errors import StoreError
    from gpuscope.store.settings import StorageConfigError, store_label
    from gpuscope.web.auth import default_audit_path

    cfg = load_config(args.config, listen=args.listen)
    redaction = install_redaction(secret_strings(cfg.tokens, cfg.raw))
    if args.db:
        cfg.storage_path = args.db
    if args.ingest_workers is not None:
        cfg.ingest_workers = parse_ingest_workers(args.ingest_workers)
    cfg.auth.audit_log = cfg.auth.audit_log or default_audit_path(cfg.storage_path)
    try:
        runtime = assemble(cfg)
    except StorageConfigError as exc:  # a credentials file it cannot read
        raise ConfigError(str(exc)) from None
    except StoreError as exc:  # refused, not reset: the files are left as they were
        err.print(
            f"[red]gpuscope hub: {escape(str(exc))}\nThe store was not modified. Restore it (and its .chunks "
            "directory) from a backup, or start with a new file (--db or storage.path).[/red]",
            soft_wrap=True,
        )
        return 2
    except AssemblyError as exc:
        err.print(f"[red]gpuscope hub: {escape(redaction.redact(str(exc)))}[/red]")
        return 2
    except OSError as exc:  # the listener: port taken, or not ours to take
        err.print(Text(f"gpuscope hub: {listen_error(cfg.host, cfg.port, exc)}", style="red"), soft_wrap=True)
        return 2
    except ValueError as exc:  # the listener: no token off loopback, TLS files
        err.print(f"[red]gpuscope hub: {exc}[/red]")
        return 2
    assert runtime.server is not None
    err.print(
        f"gpuscope hub {__version__} listening on {runtime.server.url} "
        f"(store: {store_label(cfg.storage_settings())}, "
        f"auth: {len(cfg.auth.tokens)} token(s), audit log {runtime.server.api.audit.path or 'in memory'})",
        soft_wrap=True,  # one line in a log, however long the store's path
    )
    err.print(f"dashboard: {runtime.server.url}/ui/", soft_wrap=True)
    runtime.run()
    return 0


def listen_error(host: str, port: int, exc: OSError) -> str:
    """Why the hub cannot listen on ``host:port``, and what to do instead."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{host}:{port} is in use (another hub?); stop it, or listen elsewhere with --listen "
            "HOST:PORT or listen: in the config"
        )
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def _cmd_replay(args: argparse.Namespace) -> int:
    from gpuscope.simeval.replay import ReplayError, replay_document

    try:
        doc = replay_document(Path(args.file))
    except ReplayError as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        return 2
    for line in doc["refused"][:20]:
        err.print(f"[yellow]refused {escape(line)}[/yellow]")
    if len(doc["refused"]) > 20:
        err.print(f"[yellow]... {len(doc['refused']) - 20} more rows refused[/yellow]")
    err.print(
        f"{args.file}: {doc['records']} records, {len(doc['refused'])} refused, {len(doc['alerts'])} alerts"
    )
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        for a in doc["alerts"]:
            sys.stdout.write(
                f"{a['started_at']:>12.1f} {a['severity']} {a['rule']} {a['entity']} {a['summary']}\n"
            )
    return 0


class ProgressLines:
    """A progress callback for output that is not a terminal: one line per tenth of the work done."""

    def __init__(self, what: str, say: Callable[[str], None]) -> None:
        self.what = what
        self.say = say
        self.tenths = 0

    def __call__(self, done: float, total: float) -> None:
        tenths = int(10 * done / total) if total > 0 else 10
        if tenths > self.tenths:
            self.tenths = tenths
            self.say(f"{self.what}: {10 * tenths}% ({done:.0f} of {total:.0f} s)")


def _cmd_sim_eval(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from gpuscope.sim.scenario import ScenarioError, load_scenario
    from gpuscope.simeval.gpu_hours import compare
    from gpuscope.simeval.render import print_gpu_hours, print_report
    from gpuscope.simeval.report import evaluate
    from gpuscope.simeval.runner import alerts_json, run_scenario

    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        err.print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True)
        return 2
    if err.is_terminal:
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        ) as progress:
            task = progress.add_task(f"simulating {scenario.name}", total=scenario.duration)
            result = run_scenario(scenario, progress=lambda t, total: progress.update(task, completed=t))
    else:  # a pipe or a log: a whole line at each tenth instead of a bar redrawn in place
        lines = ProgressLines(f"simulating {scenario.name}", err.print)
        result = run_scenario(scenario, progress=lines)
        lines(scenario.duration, scenario.duration)  # the runner tells every 60 ticks: the end too
    err.print(
        f"{scenario.name}: {scenario.duration:.0f} simulated s in {result.wall_seconds:.1f} s "
        f"({result.speedup:.0f}x real time), {len(result.alerts)} alerts"
    )
    output = alerts_json(result)
    if args.report:
        report = evaluate(scenario, result.told, result.learns_first)
        print_report(report, err)
        output["report"] = report.to_dict()
        hours = compare(result.measured_gpu_hours, result.true_gpu_hours)
        print_gpu_hours(hours, err)
        output["gpu_hours"] = hours
    if args.json or not args.report:
        sys.stdout.write(orjson.dumps(output, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from gpuscope.demo import run_demo

    return run_demo(
        scenario_path=args.scenario,
        duration=args.duration,
        port=args.port,
        config_path=args.config,
        linger=None if args.exit else threading.Event(),  # set by nothing: Ctrl-C ends it
    )


def _cmd_config(args: argparse.Namespace) -> int:
    if args.config_command == "reference":
        sys.stdout.write(render_reference())
        return 0
    for line in check_config(args.file):  # a ConfigError is printed by main, naming the key
        print(line)
    print(f"{args.file}: ok")
    return 0


def _cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(build_parser(), args.shell))
    return 0


@dataclass(frozen=True)
class Delegated:
    """A subcommand whose arguments and action live with the stage it drives, named by module."""

    help: str
    module: str
    add_arguments: str = "add_arguments"
    run: str = "run"


#: Each module is imported only when its subcommand is the one run (or the whole tree is wanted:
#: completion, ``build_parser()``). They pull in their stages (the load generator and its
#: simulator, the agent's collectors, the lineage registry, the SDK), and importing all of them to
#: build the parser made every ``gpuscope hub`` load about 150 modules more before it started,
#: seconds on a loaded machine (bench/bench_cli_start.py).
DELEGATED: dict[str, Delegated] = {
    "agent": Delegated(
        "run a node agent that collects and sends to a hub",
        "gpuscope.agent.cli",
        "add_agent_arguments",
        "run_agent",
    ),
    "token": Delegated(
        "create a scoped hub token (printed once) and its hashed config line",
        "gpuscope.web.auth",
        "add_token_arguments",
        "run_token",
    ),
    "alerts": Delegated(
        "list, acknowledge and silence a hub's alerts",
        "gpuscope.cli_alerts",
        "add_alerts_arguments",
        "run_alerts",
    ),
    "incidents": Delegated(
        "a hub's incidents, root cause first, costliest first",
        "gpuscope.cli_alerts",
        "add_incidents_arguments",
        "run_incidents",
    ),
    "node": Delegated(
        "drain a node for maintenance (its GPU time is maintenance, its alerts muted)",
        "gpuscope.cli_alerts",
        "add_node_arguments",
        "run_node",
    ),
    "lineage": Delegated("training run -> checkpoint -> model version -> deployment", "gpuscope.lineage.cli"),
    "loadgen": Delegated(
        "play a simulated fleet's agents and SDKs into hubs and measure them", "gpuscope.loadgen.cli"
    ),
    "verify-checkpoint": Delegated(
        "re-check a checkpoint against its content manifest", "gpuscope.sdk.verify"
    ),
}


def _delegate(parser: argparse.ArgumentParser, spec: Delegated) -> None:
    module = importlib.import_module(spec.module)
    add_arguments: Callable[[argparse.ArgumentParser], None] = getattr(module, spec.add_arguments)
    run: Command = getattr(module, spec.run)
    add_arguments(parser)
    parser.set_defaults(func=run)


def command_word(argv: Sequence[str]) -> str:
    """The subcommand ``argv`` runs: its first word that is not an option (no top-level option
    takes a value); ``""`` for none (``gpuscope --help``)."""
    return next((word for word in argv if not word.startswith("-")), "")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command tree; with ``only``, the arguments of that delegated subcommand alone (the
    others are listed with their help, their modules not imported)."""
    parser = argparse.ArgumentParser(prog="gpuscope", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpuscope {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more to stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="hub + agents over a simulated cluster with injected faults")
    demo.add_argument(
        "--duration", type=positive_seconds, default=None, help="stop after S seconds (default: scenario)"
    )
    demo.add_argument(
        "--scenario", type=Path, default=None, help="scenario YAML or a built-in's name (default: demo)"
    )
    demo.add_argument(
        "--port",
        type=port_number,
        default=None,
        help=f"hub port (default {DEFAULT_PORT}, or any free one when that is taken)",
    )
    demo.add_argument("--config", default=None, help="config YAML (or GPUSCOPE_CONFIG)")
    demo.add_argument(
        "--exit", action="store_true", help="stop the hub when the run ends (default: serve until Ctrl-C)"
    )
    demo.set_defaults(func=_cmd_demo)

    hub = sub.add_parser("hub", help="run a hub: ingest, store, detect, alert, query API")
    hub.add_argument("--listen", default=None, help=f"HOST:PORT (default 127.0.0.1:{DEFAULT_PORT})")
    hub.add_argument("--config", default=None, help="config YAML (or GPUSCOPE_CONFIG)")
    hub.add_argument("--db", default=None, help="DuckDB store file (default from config: gpuscope.duckdb)")
    hub.add_argument(
        "--ingest-workers",
        type=int,
        default=None,
        help="processes serving the ingest route beside the hub's (default: config hub.ingest_workers, 0)",
    )
    hub.set_defaults(func=_cmd_hub)

    for name, spec in DELEGATED.items():
        delegated = sub.add_parser(name, help=spec.help)
        if only is None or only == name:
            _delegate(delegated, spec)

    sim = sub.add_parser("sim-eval", help="run a scenario in virtual time and print its alerts")
    sim.add_argument(
        "scenario", help="scenario YAML (format: docs/scenarios.md), or a built-in's name (demo, xid, ...)"
    )
    sim.add_argument("--json", action="store_true", help="print the alerts as JSON on stdout")
    sim.add_argument("--report", action="store_true", help="score detections against the scenario's faults")
    sim.set_defaults(func=_cmd_sim_eval)

    rep = sub.add_parser("replay", help="replay recorded training records through the detectors")
    rep.add_argument(
        "file", help="CSV (ts,job,rank,step[,node,gpu],metric...) or JSON Lines of training records"
    )
    rep.add_argument(
        "--json",
        action="store_true",
        help="print the alerts JSON on stdout (the shape of sim-eval --json; docs/replay.md)",
    )
    rep.set_defaults(func=_cmd_replay)

    config = sub.add_parser("config", help="check a config file, or print the reference of every key")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="parse every section as the hub would; nothing is opened")
    check.add_argument("file", help="config YAML")
    config_sub.add_parser("reference", help="print docs/configuration.md: every section and key")
    config.set_defaults(func=_cmd_config)

    completion = sub.add_parser("completion", help="print a shell completion script (bash or zsh)")
    completion.add_argument("shell", choices=SHELLS, help='e.g. eval "$(gpuscope completion bash)"')
    completion.set_defaults(func=_cmd_completion)

    for command in walk(parser):
        if command is not parser:
            add_verbose_option(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(command_word(argv)).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns everything else
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        err.print(f"[red]config: {exc}[/red]")
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
