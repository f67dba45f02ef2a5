"""Lineage: the registry, its API on a real hub server, and the CLI against it (round trips)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpuscope.hub import Hub
from gpuscope.lineage import LineageError, LineageRegistry, for_hub
from gpuscope.lineage.cli import add_arguments, run
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.lineage_api import LineageApi
from gpuscope.web.server import HubServer

HASH_A, HASH_B = "a1b2c3d4e5f60718", "ffee0011ffee0011"


def seeded(reg: LineageRegistry) -> None:
    reg.add_run("pretrain-7", {"owner": "ml"}, started_at=10.0)
    reg.add_checkpoint("pretrain-7", 1000, HASH_A, "/ckpt/1000", at=100.0)
    reg.add_checkpoint("pretrain-7", 2000, HASH_B, "/ckpt/2000", at=200.0)
    reg.register_version("chat", "v1", "pretrain-7", 1000, {"eval_loss": 2.1}, at=150.0)
    reg.register_version("chat", "v2", "pretrain-7", 2000, {"eval_loss": 1.9}, at=250.0)


def test_registry_chain_aliases_and_changes(tmp_path: Path) -> None:
    events: list[str] = []
    reg = LineageRegistry(str(tmp_path / "l.duckdb"), emit=lambda evs: events.extend(e.kind for e in evs))
    seeded(reg)
    reg.promote("chat-api", "chat", "v1", alias="champion", at=300.0)
    reg.promote("chat-api", "chat", "v2", traffic_share=0.1, at=1000.0)
    assert reg.resolve("chat", "@champion") == "v1"
    v2 = reg.version("chat", "v2")
    assert v2["checkpoint"] == {
        "job": "pretrain-7",
        "step": 2000,
        "manifest_hash": HASH_B,
        "path": "/ckpt/2000",
        "at": 200.0,
    }
    assert v2["run"]["meta"] == {"owner": "ml"} and v2["metrics"] == {"eval_loss": 1.9}
    (change,) = reg.changes_before("chat-api", at=1100.0, window=600.0)
    assert change["version"] == "v2" and change["previous_version"] == "v1"
    assert change["seconds_before"] == 100.0 and change["run"] == "pretrain-7"
    assert change["previous_metrics"] == {"eval_loss": 2.1} and change["traffic_share"] == 0.1
    assert [c["version"] for c in reg.changes_before("chat-api", 1100.0, 1e6)] == ["v2", "v1"]
    assert reg.serving("chat-api", at=500.0)["version"] == "v1"
    assert events == ["model_version_registered"] * 2 + ["model_version_promoted"] * 2
    with pytest.raises(LineageError, match="already registered"):
        reg.register_version("chat", "v2", "pretrain-7", 2000)
    with pytest.raises(LineageError, match="no checkpoint"):
        reg.register_version("chat", "v3", "pretrain-7", 3000)
    with pytest.raises(LineageError, match="no alias"):
        reg.resolve("chat", "@canary")
    with pytest.raises(LineageError, match="hex"):
        reg.add_checkpoint("pretrain-7", 5, "not-a-hash")
    reg.close()
    again = LineageRegistry(str(tmp_path / "l.duckdb"))  # durable: a reopened registry has it all
    assert again.resolve("chat", "@champion") == "v1"


@pytest.fixture
def hub_url(tmp_path: Path) -> Iterator[tuple[str, Hub]]:
    store = DuckDBStore(str(tmp_path / "hub.duckdb"))
    hub = Hub(store)
    server = HubServer(hub, "127.0.0.1", 0)
    registry = for_hub(hub)
    server.api.app.router.routes.extend(LineageApi(registry, server.api._authorize_write).routes())
    server.start()
    yield server.url, hub
    server.stop()
    registry.close()


def cli(url: str, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, object]:
    """The command with ``--json``: its exit status, and the hub's answer (stderr on failure)."""
    code, out = said(url, *argv, "--json", capsys=capsys)
    return code, (json.loads(out) if code == 0 else out)


#: the training run and checkpoint the CLI tests register versions of
RUN = ("run", "ft-3", "--meta", "dataset=v9")
CHECKPOINT = ("checkpoint", "ft-3", "500", HASH_A, "--path", "s3://b/500")


def register(version: str, metric: str = "auc=0.91") -> tuple[str, ...]:
    """``register ranker VERSION`` from ft-3's step-500 checkpoint, with ``--metric``."""
    return ("register", "ranker", version, "--job", "ft-3", "--step", "500", "--metric", metric)


def said(url: str, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The command as a person runs it: its exit status and what it printed (stderr on failure)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    code = run(parser.parse_args(["--hub", url, *argv]))
    out = capsys.readouterr()
    return code, (out.out if code == 0 else out.err)


def test_the_cli_prints_lines_a_tree_and_a_table_for_people(
    hub_url: tuple[str, Hub], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = hub_url
    assert said(url, *RUN, capsys=capsys) == (0, "registered training run ft-3 (dataset=v9)\n")
    code, out = said(url, *CHECKPOINT, capsys=capsys)
    assert (code, out) == (0, "registered checkpoint ft-3 step 500 (manifest a1b2c3d4e5f6…, s3://b/500)\n")
    code, out = said(url, *register("3"), capsys=capsys)
    assert code == 0 and out.startswith("registered ranker 3\nranker 3\n")
    code, out = said(
        url, "promote", "search", "ranker", "3", "--alias", "champion", "--traffic", "0.25", capsys=capsys
    )
    assert (code, out) == (
        0,
        "ranker 3 now serves search at 25 % of its traffic, from checkpoint ft-3 step 500 "
        "(manifest a1b2c3d4e5f6…, s3://b/500); @champion points at it\n",
    )
    code, out = said(url, "show", "ranker", "@champion", capsys=capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0] == "ranker 3  @champion"
    assert "metrics: auc 0.91" in lines[2]
    assert "checkpoint: ft-3 step 500 (manifest a1b2c3d4e5f6…, s3://b/500), saved " in lines[3]
    assert "training run: ft-3, started " in lines[4] and lines[4].endswith(", dataset=v9")
    assert "search: 25 % of traffic from " in lines[6]
    assert "{" not in out  # no JSON
    code, out = said(url, "changes", "search", capsys=capsys)
    assert code == 0 and "what changed for search before" in out
    (row,) = [line for line in out.splitlines() if "ranker" in line]
    assert [cell.strip() for cell in row.split("│")[3:9]] == ["ranker", "3", "-", "25 %", "ft-3", "-"]
    code, out = said(url, "changes", "other", capsys=capsys)
    assert code == 0 and out.startswith("no promotion of other in the 3600 s before ")


def test_cli_round_trips_through_the_api(
    hub_url: tuple[str, Hub], capsys: pytest.CaptureFixture[str]
) -> None:
    url, hub = hub_url
    assert cli(url, *RUN, capsys=capsys)[0] == 0
    assert cli(url, *CHECKPOINT, capsys=capsys)[0] == 0
    code, out = cli(url, *register("3"), capsys=capsys)
    assert code == 0 and out["checkpoint"]["manifest_hash"] == HASH_A  # type: ignore[index]
    code, out = cli(url, "promote", "search", "ranker", "3", "--alias", "champion", capsys=capsys)
    assert code == 0 and out["source"]["job"] == "ft-3"  # type: ignore[index]
    code, shown = cli(url, "show", "ranker", "@champion", capsys=capsys)
    assert code == 0 and shown["version"] == "3" and shown["aliases"] == ["champion"]  # type: ignore[index]
    assert shown["run"]["meta"] == {"dataset": "v9"}  # type: ignore[index]
    code, changes = cli(url, "changes", "search", capsys=capsys)
    assert code == 0 and changes["changes"][0]["run"] == "ft-3"  # type: ignore[index]
    code, err = cli(url, "show", "ranker", "@canary", capsys=capsys)
    assert code == 1 and "no alias" in str(err)
    code, err = cli(url, *register("4", metric="auc"), capsys=capsys)
    assert code == 2 and "KEY=VALUE" in str(err)
    # promotions and registrations are events in the hub's store
    kinds = [e.kind for e in hub.store.events(0, 2e10)]
    assert "model_version_promoted" in kinds and "model_version_registered" in kinds
    bad = httpx.post(url + "/api/v1/lineage/promotions", content=b"[1]")
    assert bad.status_code == 400 and bad.json()["field"] == "body"


def test_history_registered_after_the_fact_keeps_its_own_times(hub_url: tuple[str, Hub]) -> None:
    """A version that has served since last week is promoted then, not when the hub heard of it:
    the service page, the deployment list and version_regression read that time."""
    url, hub = hub_url
    api = url + "/api/v1/lineage"
    week = 1_796_000_000.0
    for path, body in [
        ("checkpoints", {"job": "sft-2", "step": 40, "manifest_hash": HASH_B, "at": week - 7200}),
        ("versions", {"model": "chat", "version": "v7", "job": "sft-2", "step": 40, "at": week - 3600}),
        ("promotions", {"service": "chat-api", "model": "chat", "version": "v7", "at": week}),
    ]:
        res = httpx.post(f"{api}/{path}", json=body)
        assert res.status_code == 200, res.text
    shown = httpx.get(f"{api}/versions/chat/v7").json()
    assert (shown["checkpoint"]["at"], shown["registered_at"]) == (week - 7200, week - 3600)
    assert [d["promoted_at"] for d in shown["deployments"]] == [week]
    promoted = [
        e for e in hub.store.events(0, 2e10, "model_version_promoted") if e.labels["service"] == "chat-api"
    ]
    assert [e.ts for e in promoted] == [week]
    future = httpx.post(
        f"{api}/promotions", json={"service": "chat-api", "model": "chat", "version": "v7", "at": 4e9}
    )
    assert future.status_code == 400 and future.json()["field"] == "at"
    wrong = httpx.post(
        f"{api}/checkpoints", json={"job": "sft-2", "step": 41, "manifest_hash": HASH_A, "at": "now"}
    )
    assert wrong.status_code == 400 and wrong.json()["field"] == "at"
