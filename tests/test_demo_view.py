"""The demo's terminal view shows the productivity model's figures, the same the API serves."""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path

import numpy as np
from rich.console import Console, Group
from rich.text import Text

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from gpuscope.demo import DemoView, LiveFrames, faults_played
from gpuscope.hub import Hub
from gpuscope.model import Batch, Event, Frame, TrainingRecord
from gpuscope.sim.scenario import builtin_scenario, load_scenario
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi


def test_terminal_view_shows_gpu_hours_by_state_as_the_api_does() -> None:
    now = [1_700_000_000.0]
    hub = Hub(DuckDBStore(":memory:"), price_per_gpu_hour=2.5)
    client = TestClient(HubApi(hub, clock=lambda: now[0]).app)
    try:
        hub.ingest(Batch("sdk", events=[Event(now[0], "job_started", {"job": "train"})]))
        for k in range(1, 61):
            now[0] += 1
            entities = [{"node": "node-0", "gpu": str(g), "job": "train"} for g in range(8)]
            hub.ingest(
                Batch(
                    "node-0",
                    frames=[Frame(now[0], ["gpu_utilization_percent"], entities, np.full((8, 1), 99.0))],
                )
            )
            if k <= 20:  # steps stop at 20 s: the job hangs
                records = [TrainingRecord(now[0], "train", r, k, {"step_seconds": 1.0}) for r in range(8)]
                hub.ingest(Batch("sdk", training=records))
            hub.evaluate(now[0])
        scenario = load_scenario(builtin_scenario("demo"))
        view = DemoView(client, scenario, "http://hub", scenario.duration)
        console = Console(record=True, width=200)
        console.print(view.render(60.0, []))
        text = console.export_text()
        api = client.get("/api/v1/productivity", params={"by": "fleet", "range": "1d"}).json()["groups"][0]
        stalled = api["states"]["busy_not_productive"]
        assert stalled["causes"]["hung"]["gpu_hours"] > 0
        line = next(row for row in text.splitlines() if "busy not productive" in row)
        assert (
            f"{stalled['gpu_hours']:.3f}" in line and f"{stalled['dollars']:.2f}" in line and "hung" in line
        )
        assert f"wasted {api['waste']['gpu_hours']:.3f} GPU-h" in text
    finally:
        hub.store.close()


def test_the_default_make_demo_plays_every_fault_it_announces() -> None:
    """Seen: ``make demo`` ran 180 s of a 900 s scenario, so 5 of the 8 announced faults never played."""
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    args = next(
        line.split("?=", 1)[1].split() for line in makefile.splitlines() if line.startswith("DEMO_ARGS")
    )
    scenario = load_scenario(builtin_scenario("demo"))
    end = float(args[args.index("--duration") + 1]) if "--duration" in args else scenario.duration
    assert len(scenario.faults) == 8
    for fault in scenario.faults:
        assert fault.at + (fault.duration or 0) <= end, fault.label()


def test_a_shortened_run_announces_the_faults_it_plays() -> None:
    """Seen: ``--duration 30`` announced "8 faults", played one, and scored it MISSED."""
    scenario = load_scenario(builtin_scenario("demo"))
    assert faults_played(scenario, scenario.duration) == "8 faults"
    assert faults_played(scenario, 30.0) == "1 of its 8 faults"


CSI = re.compile(r"\x1b\[(\??)([\d;]*)([A-Za-z])")


def terminal(stream: str, width: int, height: int) -> list[str]:
    """What a terminal of ``height`` rows shows and keeps in its scrollback after ``stream``:
    text, CR, LF, cursor up (never above the screen's top row), erase line; colours ignored."""
    lines, row, col = [""], 0, 0
    pos = 0
    while pos < len(stream):
        match = CSI.match(stream, pos) if stream[pos] == "\x1b" else None
        if match is not None:
            pos = match.end()
            private, arg, op = match.groups()
            if private or op == "m":
                continue
            if op == "A":
                row = max(len(lines) - height, 0, row - int(arg or 1))
            elif op == "K":
                lines[row] = "" if arg == "2" else lines[row][:col]
            continue
        ch = stream[pos]
        pos += 1
        if ch == "\r":
            col = 0
            continue
        if ch == "\n" or col >= width:
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
            if ch == "\n":
                continue
        line = lines[row].ljust(col)
        lines[row] = line[:col] + ch + line[col + 1 :]
        col += 1
    return lines


def play(frames: int, rows: int, height: int) -> tuple[str, str]:
    """The stream a terminal of ``height`` rows gets from the demo's live view of ``frames``
    frames of ``rows`` lines each, with an event logged above the view after each; and the part
    written from the moment the view stops."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=60, height=height, log_path=False)
    with LiveFrames(console=console, auto_refresh=False) as live:
        for k in range(frames):
            live.update(Group(*(Text(f"frame {k} row {r}") for r in range(rows))), refresh=True)
            console.log(f"event {k}")
        running = out.getvalue()
    console.print("the run's report")
    return out.getvalue(), out.getvalue()[len(running) :]


def test_the_live_view_leaves_its_last_frame_on_the_terminal_once() -> None:
    """Seen: ``make demo`` in a terminal (through ``script``) printed the last frame twice at exit."""
    stream, at_exit = play(frames=3, rows=10, height=30)
    # on the screen already, so not written again when the view stops
    assert "frame 2" not in at_exit
    shown = "\n".join(terminal(stream, 60, 30))
    assert shown.count("frame 2 row 0") == 1 and "frame 1 row 0" not in shown
    assert shown.index("frame 2 row 9") < shown.index("the run's report")


def test_a_last_frame_taller_than_the_screen_is_left_whole_once() -> None:
    stream, _ = play(frames=3, rows=30, height=12)
    shown = terminal(stream, 60, 12)
    text = "\n".join(shown)
    # cut to the screen while live, then shown whole, once, above the report
    assert [text.count(f"frame 2 row {r}") for r in (0, 15, 29)] == [1, 1, 1]
    assert "frame 1 row" not in text
    assert text.index("frame 2 row 29") < text.index("the run's report")
