"""What a new user reads when a first command line is wrong: a port out of range, a duration of 0, a
hub URL without its scheme, a demo's or a hub's port already taken. Each is one line naming the
option, with exit status 2, and no traceback. Also what they read when it is right: a piped demo's
output comes out as whole lines, each written as it happens, beginning with the URL it serves at; a
hub names its dashboard; a demo too short for its faults says its score judges nothing; a piped
``sim-eval`` shows its progress as lines; every option says in ``--help`` what it takes.
"""

from __future__ import annotations

import argparse
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpuscope.demo
from gpuscope.cli import build_parser, main
from gpuscope.completion import walk
from gpuscope.demo import run_demo
from support import HubProcess, free_port

SCENARIO = """
name: first-use
seed: 3
duration: {duration}
interval: 1
cluster: {{nodes: 1, gpus_per_node: 2, gpu_model: H100-SXM5-80GB}}
jobs:
  - {{name: train, kind: training, nodes: [node-0], step_time: 1.0}}
faults:
  - {{at: 1, kind: thermal_throttle, target: {{node: node-0, gpu: 1}}, duration: 2}}
"""


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``gpuscope argv`` printed on stderr, having exited with status 2."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port that something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("port", ["99999", "0", "-1", "65536", "abc", "80.5"])
def test_a_demo_port_out_of_range_is_refused_naming_port(
    port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(["demo", "--port", port], capsys)
    assert "argument --port: must be a port number from 1 to 65535 (got " in err


@pytest.mark.parametrize("duration", ["0", "-5", "nan", "soon"])
def test_a_demo_duration_not_above_zero_is_refused_naming_duration(
    duration: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(["demo", "--duration", duration], capsys)
    assert "argument --duration: must be a number of seconds more than 0 (got " in err


@pytest.mark.parametrize(
    "argv",
    [
        ["agent", "--hub", "hub.example:8080"],
        ["alerts", "--hub", "hub.example:8080", "list"],
        ["alerts", "list", "--hub", "hub.example:8080"],
        ["incidents", "--hub", "hub.example:8080"],
        ["node", "--hub", "hub.example:8080", "drains"],
        ["lineage", "show", "chat", "@champion", "--hub", "hub.example:8080"],
        ["verify-checkpoint", "--hub", "hub.example:8080", "ckpt"],
        ["loadgen", "--hub", "hub.example:8080", "--duration", "5"],
    ],
    ids=lambda argv: argv[0] if argv[1] == "--hub" else f"{argv[0]}-{argv[1]}",
)
def test_a_hub_url_without_its_scheme_is_refused_naming_hub(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(argv, capsys)
    assert re.search(r"argument --hub(s/--hub)?: the scheme is required", err), err
    assert "must start with http:// or https:// (got 'hub.example:8080'; e.g. http://hub.example:8080)" in err


def test_a_bad_gpuscope_hub_is_refused_before_anything_is_sent(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSCOPE_HUB", "hub.example:8080")
    err = refused(["alerts", "list"], capsys)
    assert "the scheme is required" in err and "(got 'hub.example:8080'" in err


def test_a_demo_port_in_use_is_named_with_how_to_pick_another(
    taken_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--port", str(taken_port), "--exit", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert f"--port {taken_port}: port {taken_port} on 127.0.0.1 is in use" in err
    assert "pick another with --port N, or leave --port out to take any free port" in err
    assert "Traceback" not in err


def test_the_default_port_taken_the_demo_says_so_and_serves_on_another(
    taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpuscope.demo, "DEFAULT_PORT", taken_port)
    path = tmp_path / "first-use.yaml"
    path.write_text(SCENARIO.format(duration=3))
    assert run_demo(scenario_path=path) == 0
    out = capsys.readouterr().out
    moved = re.search(
        rf"port {taken_port} is in use \(another hub or demo\?\), so this demo serves on port (\d+)", out
    )
    assert moved is not None, out
    assert "choose a port with --port N" in out
    assert f"dashboard: http://127.0.0.1:{moved.group(1)}/ui/" in out


def test_a_demo_too_short_for_any_fault_says_its_score_judges_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``--duration 15`` ended with ``recall 1.00 precision 1.00 alerts 0`` and nothing else."""
    path = tmp_path / "first-use.yaml"
    path.write_text(SCENARIO.format(duration=60))
    assert run_demo(scenario_path=path, duration=0.5, port=free_port()) == 0
    out = capsys.readouterr().out
    assert "scenario first-use, 0.5 s, 0 of its 1 fault\n" in out
    assert (
        "no fault starts within this 0.5 s run (the first is at 1 s), so recall and precision below judge "
        "nothing; run longer with --duration, or leave it out\n"
    ) in out


def test_a_piped_demo_writes_whole_lines_as_they_happen(tmp_path: Path) -> None:
    path = tmp_path / "first-use.yaml"
    path.write_text(SCENARIO.format(duration=600))
    port = free_port()
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuscope.cli",
            "demo",
            "--scenario",
            str(path),
            "--port",
            str(port),
            "--exit",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert demo.stdout is not None
        first = demo.stdout.readline()
        # written while the run goes on, not held in a buffer until the process ends
        assert demo.poll() is None
        assert first == f"dashboard: http://127.0.0.1:{port}/ui/\n"
        lines = [first]
        while not any("injecting" in line for line in lines):
            lines.append(demo.stdout.readline())
            assert lines[-1], "the demo ended before injecting its fault"
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=120)
    finally:
        demo.kill()
    lines += rest.splitlines(keepends=True)
    text = "".join(lines)
    assert "\r" not in text and "\x1b" not in text  # no progress redrawn, no terminal codes
    header = next(line for line in lines if line.startswith("gpuscope demo: hub API at"))
    assert header.rstrip().endswith("scenario first-use, 600 s, 1 fault")  # one line, not wrapped
    injecting = next(line for line in lines if "injecting" in line)
    assert re.fullmatch(
        r"\[\d\d:\d\d:\d\d\] injecting faults\[0\] thermal_throttle at 1s on node=node-0, gpu=1\n", injecting
    )
    assert "interrupted\n" in lines and any(line.startswith("data kept in ") for line in lines)


def test_a_hub_says_where_its_dashboard_is(tmp_path: Path) -> None:
    port = free_port()
    hub = HubProcess(tmp_path, port, tmp_path / "hub.duckdb")
    try:
        hub.wait_ready()
        assert f"dashboard: http://127.0.0.1:{port}/ui/\n" in hub.output()
    finally:
        hub.close()


def test_every_option_and_argument_of_every_command_has_help() -> None:
    """Before: ``alerts ack --comment``, ``lineage register --job/--step`` and others were listed in
    ``--help`` with no word on what they take."""
    bare = [
        f"{command.prog} {' / '.join(action.option_strings) or action.dest}"
        for command in walk(build_parser())
        for action in command._actions
        if action.help is None and action.nargs != argparse.PARSER  # subcommands have their own help
    ]
    assert bare == []


def test_a_hub_port_in_use_is_named_with_how_to_listen_elsewhere(
    taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``gpuscope hub: [Errno 98] Address already in use``."""
    argv = ["hub", "--listen", f"127.0.0.1:{taken_port}", "--db", str(tmp_path / "hub.duckdb")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"gpuscope hub: 127.0.0.1:{taken_port} is in use (another hub?); stop it, or listen elsewhere with "
        "--listen HOST:PORT or listen: in the config\n"
    )


def test_piped_sim_eval_shows_its_progress_as_whole_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a piped ``sim-eval`` printed nothing until the end (its bar is drawn on terminals only)."""
    path = tmp_path / "first-use.yaml"
    path.write_text(SCENARIO.format(duration=300))
    assert main(["sim-eval", str(path)]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    progress = [line for line in err.splitlines() if line.startswith("simulating first-use: ")]
    assert [line.split()[2] for line in progress] == ["20%", "40%", "60%", "80%", "100%"]
    assert progress[-1] == "simulating first-use: 100% (300 of 300 s)"
