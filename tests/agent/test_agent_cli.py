"""``gpuscope agent`` arguments: --once output, collector choice, clear refusals."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import orjson
import pytest

from gpuscope.agent.cli import add_agent_arguments, collector_names, context_from_args, run_agent
from gpuscope.collect.base import COLLECTORS, Collected, Collector, load_collectors, register_collector

PROC = str(Path(__file__).parents[1] / "collect" / "fixtures" / "proc")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def dcgm_registered() -> Iterator[None]:
    class Dcgm(Collector):
        name: ClassVar[str] = "dcgm_test"
        enabled_by: ClassVar[tuple[str, ...]] = ("dcgm_url",)

        def collect(self, now: float) -> Collected:
            return Collected()

    saved = dict(COLLECTORS)
    register_collector(Dcgm)
    yield
    COLLECTORS.clear()
    COLLECTORS.update(saved)


def test_once_json_prints_one_round_from_a_fixture_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run_agent(parse("--once", "--json", "--node", "n9", "--proc-root", PROC, "--rate-window", "0")) == 0
    )
    out = orjson.loads(capsys.readouterr().out)
    assert out["sources"] == ["host", "jobprocs"]  # jobprocs: exits of training ranks (none here)
    assert out["entities"]["node=n9"]["node_tcp_out_segs_total"] == 594855
    assert out["errors"] == []


def test_once_text_is_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_agent(parse("--once", "--node", "n9", "--proc-root", PROC, "--rate-window", "0")) == 0
    out = capsys.readouterr().out
    assert "node=n9" in out and "  node_load1 = 0.05" in out


def test_default_collectors_and_options_that_switch_one_on(dcgm_registered: None) -> None:
    args = parse("--node", "n1")
    assert collector_names(args, context_from_args(args)) == ["host", "jobprocs"]
    args = parse("--node", "n1", "--dcgm-url", "http://127.0.0.1:9400/metrics")
    ctx = context_from_args(args)
    assert ctx.options == {"dcgm_url": "http://127.0.0.1:9400/metrics"}
    assert collector_names(args, ctx) == ["dcgm", "dcgm_test", "host", "jobprocs"]
    args = parse("--collector", "host", "--dcgm-url", "http://x/metrics")
    with pytest.raises(ValueError, match="--dcgm-url is given but no chosen collector uses it"):
        collector_names(args, context_from_args(args))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--collector", "host", "--scrape", "http://127.0.0.1:8000/metrics", "--once"],
            "--scrape is given but no chosen collector",
        ),
        (["--collector", "nvml9", "--once"], "unknown collector 'nvml9'"),
        (["--node", "n1"], "--hub URL is required"),
        (["--hub", "http://h", "--interval", "0"], "--interval must be positive"),
        (
            ["--hub", "http://h", "--interval", "2", "--send-spread", "1.6"],
            "gpuscope agent: --send-spread must be from 0 to below 0.8 x --interval (1.6 s), got 1.6",
        ),
        (["--hub", "http://h", "--send-spread=-0.1"], "--send-spread must be from 0 to below"),
        (["--kube-api", "--once"], "--kube-api adds pod metadata to --kubelet-socket's allocations"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_agent(parse(*argv, "--spool-dir", str(tmp_path))) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("hub", ["hub:7470", "http://a:7470,hub:7470"])
def test_a_hub_without_its_scheme_is_refused_naming_hub(hub: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("--hub", hub)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --hub: the scheme is required: a hub URL must start with http:// or https://" in err
    assert "(got 'hub:7470'; e.g. http://hub:7470)" in err


def test_without_nvml_the_agent_says_it_has_no_gpu_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: on a machine without the NVIDIA driver ``agent --once`` listed ``sources: host`` and
    nothing said why no GPU was read."""
    load_collectors()
    monkeypatch.setattr(COLLECTORS["nvml"], "default", False)  # as where the library is absent
    argv = ["--once", "--json", "--proc-root", PROC, "--spool-dir", str(tmp_path)]
    assert run_agent(parse(*argv)) == 0
    out, err = capsys.readouterr()
    assert "nvml" not in orjson.loads(out)["sources"]
    assert err == (
        "gpuscope agent: no GPU source: the NVML library (libnvidia-ml.so, from the NVIDIA driver) was not "
        "found and no --dcgm-url is given, so only host metrics are collected\n"
    )
    assert run_agent(parse(*argv, "--collector", "host")) == 0  # host alone, chosen: nothing to say
    assert capsys.readouterr().err == ""


def test_kube_api_outside_a_cluster_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    argv = ["--kubelet-socket", str(tmp_path / "kubelet.sock"), "--kube-api", "--once"]
    assert run_agent(parse(*argv, "--spool-dir", str(tmp_path))) == 2
    assert "not in a Kubernetes pod: KUBERNETES_SERVICE_HOST" in capsys.readouterr().err
