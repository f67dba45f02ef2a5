"""``gpuscope demo``: a real hub and one real agent per simulated node, speaking HTTP on loopback.

The simulator plays the cluster in real time; each node's telemetry goes through a real
:class:`~gpuscope.agent.agent.Agent` (collector → batch → send, spooling if the hub is away), its
GPUs read by the real NVML collector from a fake NVML that the simulator drives
(:class:`~gpuscope.collect.sim_node.SimNvmlNode`), and the training processes' records go through
the same HTTP ingest an SDK uses; the services' versions, the runs and checkpoints they came from
and their promotions go through the lineage API (:mod:`gpuscope.demo_lineage`). The terminal shows
the fleet, the jobs and the alerts as the hub raises them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpuscope.agent.agent import Agent
from gpuscope.agent.sender import TokenRefused
from gpuscope.alert.engine import AlertChange
from gpuscope.cli_alerts import dollars_per_hour
from gpuscope.collect.sim_node import SimNvmlNode
from gpuscope.config import DEFAULT_PORT, load_config
from gpuscope.demo_lineage import DemoLineage
from gpuscope.hub import Hub
from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Batch
from gpuscope.runtime import assemble
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import Scenario, ScenarioError, builtin_scenario, load_scenario
from gpuscope.simeval.render import print_report
from gpuscope.simeval.report import evaluate
from gpuscope.simeval.runner import notices
from gpuscope.store.errors import StoreError
from gpuscope.store.settings import StorageConfigError, store_label
from gpuscope.web.auth import Token, digest, new_token

SEVERITY_STYLE = {"P1": "bold red", "P2": "yellow", "P3": "cyan"}


#: terminal colours of the productivity model's states (the dashboard's, as near as a terminal gets)
STATE_STYLE = {
    "productive": "green",
    "degraded": "yellow",
    "busy_not_productive": "bold red",
    "idle_allocated": "dark_orange",
    "idle_unallocated": "dim",
    "down": "bold white on red",
    "maintenance": "magenta",
}


def _util_cell(util: float | None, alive: bool, state: str | None = None) -> Text:
    if not alive:
        return Text(" ✕ ", style="bold white on red")
    if util is None:
        return Text(" · ", style="dim")
    if state is not None:
        return Text(f"{util:3.0f}", style=STATE_STYLE.get(state, ""))
    style = "green" if util >= 60 else "yellow" if util >= 15 else "dim"
    return Text(f"{util:3.0f}", style=style)


def gpu_time_table(doc: dict[str, Any]) -> Table:
    """GPU-hours and dollars per state and cause: the figures of ``/api/v1/productivity``."""
    groups = doc.get("groups") or []
    fleet = groups[0] if groups else None
    title = "GPU time by state"
    if fleet is not None:
        waste = fleet["waste"]
        title += f": {fleet['gpu_hours']:.3f} GPU-h, wasted {waste['gpu_hours']:.3f} GPU-h"
        title += f" (${waste['dollars']:.2f})"
    table = Table(title=title, expand=False)
    for col, justify in (
        ("state", "left"),
        ("GPUs now", "right"),
        ("GPU-h", "right"),
        ("$", "right"),
        ("causes", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    now = doc.get("now", {})
    for state, row in (fleet["states"] if fleet else {}).items():
        if row["gpu_hours"] <= 0 and not now.get(state):
            continue
        causes = ", ".join(f"{c.replace('_', ' ')} {v['gpu_hours']:.3f}" for c, v in row["causes"].items())
        table.add_row(
            Text(state.replace("_", " "), style=STATE_STYLE.get(state, "")),
            str(now.get(state, 0)),
            f"{row['gpu_hours']:.3f}",
            f"{row['dollars']:.2f}",
            causes,
        )
    return table


class DemoView:
    """Renders the hub's state, read over its HTTP API as any client would."""

    def __init__(self, client: httpx.Client, scenario: Scenario, url: str, end: float) -> None:
        self.client = client
        self.scenario = scenario
        self.url = url
        self.end = end

    def render(self, t: float, injected: list[str]) -> Group:
        snapshot = self.client.get(
            "/api/v1/snapshot",
            params={"metrics": "gpu_utilization_percent,gpu_temp_celsius,gpu_power_watts,node_cpu_percent"},
        ).json()
        alerts = self.client.get("/api/v1/alerts", params={"state": "firing"}).json()["alerts"]
        hours = self.client.get("/api/v1/productivity", params={"by": "fleet", "range": "1d"}).json()
        states = {
            (g["node"], g["gpu"]): g["state"]
            for g in self.client.get("/api/v1/productivity/gpus").json()["gpus"]
        }
        gpus: dict[str, dict[str, dict[str, Any]]] = {}
        now = time.time()
        for row in snapshot["entities"]:
            labels = row["labels"]
            if "gpu" in labels:
                fresh = now - row["ts"] < 5 * self.scenario.interval
                gpus.setdefault(labels["node"], {})[labels["gpu"]] = {**row["values"], "fresh": fresh}
        fleet = Table(title="fleet: GPU utilization %, coloured by state", expand=False)
        fleet.add_column("node")
        for g in range(self.scenario.cluster.gpus_per_node):
            fleet.add_column(f"gpu{g}", justify="right")
        fleet.add_column("max temp", justify="right")
        for n in range(self.scenario.cluster.nodes):
            node = f"node-{n}"
            row_gpus = gpus.get(node, {})
            cells = [
                _util_cell(
                    row_gpus.get(str(g), {}).get("gpu_utilization_percent"),
                    row_gpus.get(str(g), {}).get("fresh", False),
                    states.get((node, str(g))),
                )
                for g in range(self.scenario.cluster.gpus_per_node)
            ]
            temps = [v.get("gpu_temp_celsius") for v in row_gpus.values() if v.get("fresh")]
            max_temp = max((x for x in temps if x is not None), default=None)
            fleet.add_row(node, *cells, "-" if max_temp is None else f"{max_temp:.0f}°C")
        table = Table(title=f"firing alerts ({len(alerts)})", expand=True)
        for col in ("sev", "rule", "entity", "for", "$/h", "summary"):
            table.add_column(col, overflow="fold")
        for a in sorted(alerts, key=lambda a: (a["severity"], a["started_at"]))[:12]:
            entity = " ".join(f"{k}={v}" for k, v in a["entity"].items())
            table.add_row(
                Text(a["severity"], style=SEVERITY_STYLE.get(a["severity"], "")),
                a["rule"],
                entity,
                f"{now - a['started_at']:.0f}s",
                dollars_per_hour(a["cost_per_hour"]),
                a["summary"],
            )
        header = Text.assemble(
            ("gpuscope demo  ", "bold"),
            (f"hub {self.url}  ", "cyan"),
            f"t={t:.0f}s / {self.end:.0f}s  ",
            f"faults injected: {', '.join(injected) or 'none yet'}",
        )
        return Group(Panel(header), fleet, gpu_time_table(hours), table)


def run_demo(
    *,
    scenario_path: Path | None = None,
    duration: float | None = None,
    port: int | None = None,
    config_path: str | None = None,
    linger: threading.Event | None = None,
) -> int:
    """Play the scenario live; then, with ``linger``, keep the hub and dashboard up until it is
    set or Ctrl-C (the agents tell the hub they left, so nothing pages meanwhile). Without a
    ``port`` the hub takes :data:`DEFAULT_PORT`, or any free port when that one is taken; a
    ``port`` that is taken is an error."""
    console = Console(log_path=False)
    interactive = console.is_terminal
    if not interactive:
        # logs, CI, pipes: one whole line per message (never wrapped), tables kept readable
        console = Console(log_path=False, width=140, soft_wrap=True)
    say = _say(console, interactive)
    errors = Console(stderr=True, soft_wrap=True)
    cfg = load_config(config_path)
    try:
        scenario = load_scenario(scenario_path or builtin_scenario("demo"))
    except ScenarioError as exc:
        errors.print(Text(str(exc), style="red"))
        return 2
    end = min(duration, scenario.duration) if duration is not None else scenario.duration
    workdir = Path(tempfile.mkdtemp(prefix="gpuscope-demo-"))
    # the config's storage backend (a remote TSDB too); local files stay in the demo's own directory
    cfg.storage_path = str(workdir / "demo.duckdb")
    cfg.price_per_gpu_hour = scenario.cluster.price_per_gpu_hour
    cfg.host, cfg.port = "127.0.0.1", DEFAULT_PORT if port is None else port
    token = cfg.tokens[0] if cfg.tokens else None
    if token is None and cfg.auth.tokens:  # only hashed tokens configured: mint one for our agents
        token = new_token()
        cfg.auth.tokens.append(Token("demo-agents", frozenset({"ingest", "read"}), digest(token)))
    try:
        runtime = assemble(cfg, any_port=port is None)  # the usual port taken: any free one
    except (StorageConfigError, StoreError) as exc:
        errors.print(Text(f"storage: {exc}", style="red"))
        shutil.rmtree(workdir, ignore_errors=True)
        return 2
    except OSError as exc:  # only a --port given: the default one falls back to a free port
        errors.print(Text(listen_error(cfg.port, exc), style="red"))
        shutil.rmtree(workdir, ignore_errors=True)
        return 2
    except ValueError as exc:  # the listener's TLS files
        errors.print(Text(f"config: {exc}", style="red"))
        shutil.rmtree(workdir, ignore_errors=True)
        return 2
    hub = runtime.hub

    def on_change(change: AlertChange) -> None:
        a = change.alert
        style = SEVERITY_STYLE.get(a.severity, "")
        verb = {"fired": "FIRING  ", "escalated": "ESCALATE"}.get(change.kind, "resolved")
        say(
            Text.assemble(
                (f"{verb} {a.severity} {a.rule} ", style),
                " ".join(f"{k}={v}" for k, v in a.entity.items()),
                f"  {a.summary}",
            )
        )

    hub.add_listener(on_change)
    runtime.start()
    server = runtime.server
    assert server is not None
    if server.port != cfg.port:
        console.print(
            f"port {cfg.port} is in use (another hub or demo?), so this demo serves on port {server.port}; "
            "choose a port with --port N"
        )
    console.print(f"[bold]dashboard[/bold]: {server.url}/ui/")
    console.print(
        f"[bold]gpuscope demo[/bold]: hub API at {server.url} (health: {server.url}/api/v1/health), "
        f"store {store_label(cfg.storage_settings())}; scenario {scenario.name}, {end:g} s, "
        f"{faults_played(scenario, end)}"
    )
    t0 = time.time()
    sim = Simulator(scenario, t0=t0)
    nodes = sim_nvml_nodes(sim, workdir / "proc")
    agents = {
        name: Agent(
            server.url,
            name,
            node.collectors,
            interval=scenario.interval,
            token=token,
            spool_dir=workdir / "spool" / name,
        )
        for name, node in nodes.items()
    }
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    sdk = httpx.Client(base_url=server.url, headers=headers, timeout=10)
    reader = httpx.Client(base_url=server.url, headers=headers, timeout=10)
    view = DemoView(reader, scenario, server.url, end)
    lineage = DemoLineage(sdk, scenario, lambda why: say(Text(why, style="yellow")))
    lineage.start(t0)
    injected: list[str] = []
    interrupted = refused = False
    played = 0.0  # scenario seconds played

    def post(batch: Batch) -> None:
        """An SDK's batch; the promotions in it go through the lineage API, as a user's would."""
        sent, promotions = lineage.split(batch)
        sdk.post("/api/v1/ingest", content=encode_batch(sent), headers={"Content-Type": "application/json"})
        lineage.promote(promotions)

    try:
        with (
            LiveFrames(console=console, auto_refresh=False) if interactive else _NoLive() as live,
            _ctrl_c_between_ticks() as stop,
        ):
            for tick in sim.ticks():
                if tick.t > end:
                    break
                played = tick.t
                delay = t0 + tick.t - time.time()
                if (delay > 0 and stop.wait(delay)) or stop.is_set():
                    raise KeyboardInterrupt
                for fault in tick.faults_started:
                    injected.append(f"{fault.kind}@{fault.at:.0f}s")
                    say(Text(f"injecting {fault.label()}", style="magenta"))
                for fault in tick.faults_ended:
                    say(Text(f"fault over: {fault.label()}", style="magenta"))
                for name, agent in agents.items():
                    batch = tick.node_batches.get(name)
                    if batch is not None:  # a node that is down sends nothing
                        nodes[name].feed(batch)
                        agent.step(now=t0 + tick.t)  # stamped like the simulated frames
                for batch in tick.sdk_batches:
                    post(batch)
                if interactive and int(tick.t) % 2 == 0:
                    live.update(view.render(tick.t, injected), refresh=True)
    except KeyboardInterrupt:
        interrupted = True
        console.print("interrupted")
    except TokenRefused as exc:  # a configured token without the ingest scope
        interrupted = refused = True
        errors.print(Text(f"the demo's agents cannot report: {exc}", style="red"))
    finally:
        # the jobs end with the demo and say so, as the agents do: neither a lingering hub nor
        # one reopened on this store takes their silence for lost ranks or nodes
        with contextlib.suppress(httpx.HTTPError):
            for batch in sim.stop(played):
                post(batch)
        for agent in agents.values():
            agent.leave("the demo is over")
            agent.close()
        sdk.close()
        reader.close()
        time.sleep(1.5)  # one more evaluation for the last data
    try:
        _report(console, hub, scenario, end, t0)
        console.print(f"data kept in {workdir}")
        if linger is not None and not interrupted:
            console.print(
                f"[bold]the run is over; the dashboard stays up at {server.url}/ui/ until Ctrl-C[/bold]"
            )
            with contextlib.suppress(KeyboardInterrupt):
                linger.wait()
    finally:
        runtime.stop()
    return 2 if refused else 0


def listen_error(port: int, exc: OSError) -> str:
    """What stops the demo's hub from listening on a ``--port``, and what to do instead."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"--port {port}: port {port} on 127.0.0.1 is in use (another hub or demo?); pick another "
            "with --port N, or leave --port out to take any free port"
        )
    return f"--port {port}: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}"


def _say(console: Console, interactive: bool) -> Callable[[Text], None]:
    """How the demo prints one event: above the live view on a terminal; elsewhere (a pipe, a log
    file) as one whole line stamped with its time, flushed as it is written."""
    if interactive:
        return console.log

    def line(text: Text) -> None:
        console.print(Text.assemble(time.strftime("[%H:%M:%S] "), text), soft_wrap=True)

    return line


def faults_played(scenario: Scenario, end: float) -> str:
    """The faults a run to ``end`` plays, for its first line (a shortened run plays fewer)."""
    played, total = sum(1 for f in scenario.faults if f.at < end), len(scenario.faults)
    faults = "fault" if total == 1 else "faults"
    return f"{total} {faults}" if played == total else f"{played} of its {total} {faults}"


def _report(console: Console, hub: Hub, scenario: Scenario, end: float, t0: float) -> None:
    """How the live run scored against the faults it played."""
    # told first, then shifted: an escalation's start is shifted with the alert's
    shifted = [
        dataclasses.replace(
            a, started_at=a.started_at - t0, resolved_at=None if a.resolved_at is None else a.resolved_at - t0
        )
        for a in notices(hub.alerts.all())
    ]
    played = dataclasses.replace(
        scenario, duration=end, faults=tuple(f for f in scenario.faults if f.at < end)
    )
    if not played.faults and scenario.faults:
        first = min(f.at for f in scenario.faults)
        console.print(
            f"no fault starts within this {end:g} s run (the first is at {first:.0f} s), so recall and "
            "precision below judge nothing; run longer with --duration, or leave it out"
        )
    report = evaluate(played, shifted, hub.detection.learns_first())
    print_report(report, console)


def sim_nvml_nodes(sim: Simulator, proc_root: Path) -> dict[str, SimNvmlNode]:
    """One :class:`SimNvmlNode` per simulated node, with the simulator's GPU UUIDs; each keeps
    the procfs of its stand-in processes under ``proc_root/<node>``."""
    world = sim.world
    per = world.per_node
    return {
        name: SimNvmlNode(name, per, proc_root / name, uuids=world.fleet.uuids[k * per : (k + 1) * per])
        for k, name in enumerate(world.node_names)
    }


@contextlib.contextmanager
def _ctrl_c_between_ticks() -> Iterator[threading.Event]:
    """Ctrl-C ends the demo between two ticks: the first SIGINT sets the event the tick loop
    waits on, instead of raising inside an agent's send or an HTTP request, whose locks and
    connections the shutdown then needs (a piped demo stopped so once hung there); a second
    SIGINT raises at once. Off the main thread, where no handler can be set, SIGINT raises."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


class LiveFrames(Live):
    """The demo's live view: each frame drawn over the last, and the last left on the terminal once.

    rich's ``Live.stop()`` draws the frame on screen a second time, so that one cut to fit the
    screen is seen whole at the end. Where the terminal cannot move the cursor back over all of
    the first copy (its height unknown to rich, as under ``script``, or smaller than rich
    assumes; a log of the session) the last frame stood there twice. Here ``stop()`` draws again
    only a frame that was cut to fit: one drawn whole already stays as it is.
    """

    drawn: RenderableType | None = None  # the frame last drawn

    def refresh(self) -> None:
        frame = self.get_renderable()
        whole = self._live_render.last_render_height < self.console.height
        if not self.is_started and frame is self.drawn and whole:
            return
        self.drawn = frame
        super().refresh()


class _NoLive:
    """Stands in for rich.live.Live when stdout is not a terminal (CI, pipes): alerts still print."""

    def __enter__(self) -> _NoLive:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, *args: object, **kwargs: object) -> None:
        return None
