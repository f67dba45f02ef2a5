"""Client commands: options after the subcommand, one default hub, URLs named in errors, help, completion."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.cli import DELEGATED, build_parser, command_word, main
from gpuscope.completion import command_words, script, walk
from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer
from support import QuietHandler, free_port, loopback_http


@pytest.fixture
def hub_url() -> Iterator[str]:
    hub = Hub(DuckDBStore(":memory:", durable=False))
    service = AlertingService(hub, parse_alerting({}))
    server = HubServer(hub, "127.0.0.1", 0, alerting=service)
    service.start()
    server.start()
    yield server.url
    server.stop()
    service.stop()


class _HtmlNotFound(QuietHandler):
    def do_GET(self) -> None:
        body = b"<!DOCTYPE html><html><body><h1>Not Found</h1>" + b"x" * 2000 + b"</body></html>"
        self.reply(404, body, "text/html")


@pytest.fixture
def other_server() -> Iterator[str]:
    with loopback_http(_HtmlNotFound) as url:
        yield url


def test_client_options_go_before_or_after_the_subcommand(
    hub_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``alerts list --hub URL`` and ``alerts list --json`` failed with the top-level usage."""
    for argv in (
        ["alerts", "list", "--hub", hub_url, "--json"],
        ["alerts", "--hub", hub_url, "list", "--json"],
        ["alerts", "--json", "--hub", hub_url, "list"],
        ["alerts", "silences", "--hub", hub_url, "--json"],
        ["incidents", "--hub", hub_url, "--json"],
    ):
        assert main(argv) == 0, argv
        doc = orjson.loads(capsys.readouterr().out)
        assert {"alerts", "silences", "incidents"} & set(doc), argv


def test_verbose_after_the_subcommand() -> None:
    """Before: ``gpuscope hub -v`` failed with the top-level usage."""
    parser = build_parser()
    assert parser.parse_args(["hub", "-v"]).verbose is True
    assert parser.parse_args(["-v", "hub"]).verbose is True
    assert parser.parse_args(["hub"]).verbose is False
    assert parser.parse_args(["alerts", "list", "-v"]).verbose is True


def test_lineage_as_written_in_the_readme_uses_the_local_hub(
    hub_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``gpuscope lineage show chat @champion`` needed --hub or GPUSCOPE_HUB (rc 2)."""
    monkeypatch.delenv("GPUSCOPE_HUB", raising=False)
    assert build_parser().parse_args(["lineage", "show", "chat", "@champion"]).hub == "http://127.0.0.1:7470"
    monkeypatch.setenv("GPUSCOPE_HUB", hub_url)
    assert build_parser().parse_args(["alerts", "list"]).hub == hub_url
    assert main(["lineage", "show", "chat", "@champion"]) == 1  # this hub has no such version
    err = capsys.readouterr().err
    assert "HTTP 404" in err and "required" not in err
    assert main(["lineage", "changes", "chat", "--json"]) == 0
    assert isinstance(orjson.loads(capsys.readouterr().out), dict)


@pytest.mark.parametrize(
    "argv",
    [["alerts", "list"], ["alerts", "silences"], ["incidents"], ["lineage", "show", "chat", "v1"]],
    ids=" ".join,
)
def test_an_unreachable_hub_is_named(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``gpuscope alerts: [Errno 111] Connection refused`` without the URL."""
    url = f"http://127.0.0.1:{free_port()}"
    assert main([*argv, "--hub", url]) in (1, 2)
    err = capsys.readouterr().err
    assert f"cannot reach the hub at {url}" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv", [["alerts", "list"], ["incidents"], ["lineage", "show", "chat", "v1"]], ids=" ".join
)
def test_a_server_that_is_not_a_hub_is_not_dumped(
    argv: list[str], other_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the other server's whole HTML 404 page was printed."""
    assert main([*argv, "--hub", other_server]) == 1
    err = capsys.readouterr().err
    assert "without JSON (is it a gpuscope hub?)" in err and "<html" not in err and "xxxx" not in err


def test_help_names_no_document_outside_the_repo() -> None:
    """Before: ``sim-eval --help`` cited DESIGN §4 and §5, which users do not have."""
    helps = [p.format_help() for p in walk(build_parser())]
    assert len(helps) > 20
    assert not [h for h in helps if "DESIGN" in h]


def test_every_command_path_is_in_the_completion_table() -> None:
    paths = dict(command_words(build_parser()))
    assert "alerts_list" in paths and "--json" in paths["alerts_list"] and "--hub" in paths["alerts_list"]
    assert {"alerts", "config", "completion", "lineage"} <= set(paths[""])
    assert {"check", "reference"} <= set(paths["config"])


def _bash(words: list[str], tmp_path: Path) -> list[str]:
    path = tmp_path / "gpuscope.bash"
    path.write_text(script(build_parser(), "bash"))
    array = " ".join(f"'{w}'" for w in words)
    line = f"source {path}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; "
    line += '_gpuscope_complete; echo "${COMPREPLY[@]}"'
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True).stdout.split()


def test_bash_completion(tmp_path: Path) -> None:
    assert "alerts" in _bash(["gpuscope", "al"], tmp_path)
    assert _bash(["gpuscope", "alerts", "li"], tmp_path) == ["list"]
    assert _bash(["gpuscope", "alerts", "--hub", "http://h:1", "list", "--j"], tmp_path) == ["--json"]
    assert _bash(["gpuscope", "config", ""], tmp_path) == [
        "check",
        "reference",
        "--help",
        "-h",
        "--verbose",
        "-v",
    ] or set(_bash(["gpuscope", "config", ""], tmp_path)) >= {"check", "reference"}
    assert main(["completion", "bash"]) == 0


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh (Debian package zsh) is not installed")
def test_zsh_completion(tmp_path: Path) -> None:
    path = tmp_path / "_gpuscope"
    path.write_text(script(build_parser(), "zsh"))
    subprocess.run(["zsh", "-n", str(path)], check=True)
    # compdef and compadd belong to zsh's completion system: stand-ins record what would be offered
    line = (
        'compdef() { :; }; compadd() { shift; print -r -- "$@"; }; '
        f"source {path}; words=(gpuscope alerts --hub http://h:1 list ''); CURRENT=6; _gpuscope"
    )
    offered = subprocess.run(["zsh", "-c", line], capture_output=True, text=True, check=True).stdout.split()
    assert {"--json", "--hub", "--all", "--rule"} <= set(offered) and "list" not in offered


def test_every_positional_argument_has_help() -> None:
    """Before: the positional arguments of ``alerts ack`` and ``lineage *`` had no help."""
    bare = [
        f"{p.prog} {a.dest}"
        for p in walk(build_parser())
        for a in p._actions
        if not a.option_strings and a.nargs != "A..." and not a.help and a.dest != "==SUPPRESS=="
    ]
    assert not bare, bare


#: the subcommands' modules that a hub does not need (``token`` lives with the hub's own auth)
_NOT_THE_HUBS = sorted({spec.module for spec in DELEGATED.values()} - {"gpuscope.web.auth"})

#: run in a fresh interpreter: which of those ``gpuscope hub --help`` and ``gpuscope --help`` loaded
_LOADED_BY_HELP = f"""
import sys
from gpuscope.cli import main
for argv in (["hub", "--help"], ["--help"]):
    try:
        main(argv)
    except SystemExit:
        pass
print(sorted(set({_NOT_THE_HUBS!r}) & set(sys.modules)), file=sys.stderr)
"""


def test_the_hub_starts_without_importing_the_other_subcommands() -> None:
    """Before: building the parser imported the load generator, the agent, lineage, the SDK..."""
    done = subprocess.run([sys.executable, "-c", _LOADED_BY_HELP], capture_output=True, text=True, check=True)
    assert "usage: gpuscope hub" in done.stdout and "loadgen" in done.stdout  # both helps printed
    assert len(_NOT_THE_HUBS) == 5 and done.stderr.strip().splitlines()[-1] == "[]"


def test_only_the_chosen_subcommand_gets_its_arguments() -> None:
    assert command_word(["-v", "loadgen", "--hub", "x"]) == "loadgen" and command_word(["--help"]) == ""
    assert all(name in build_parser("").format_help() for name in DELEGATED)  # listed, not built
    for name, spec in DELEGATED.items():  # every row names a real module and its functions
        runs = {p.prog: p.get_default("func") for p in walk(build_parser(name))}
        assert runs[f"gpuscope {name}"].__module__ == spec.module
        assert all(runs[f"gpuscope {other}"] is None for other in DELEGATED if other != name)
