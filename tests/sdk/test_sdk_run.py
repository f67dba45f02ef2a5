"""The run API against a real hub over HTTP: records, merging, spooling, drops, checkpoints."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpuscope
from gpuscope.hub import Hub
from gpuscope.sdk import Run
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer
from sdk.hubquery import events, records
from support import free_port, wait_until


def _init(hub: str, tmp: Path, job: str = "unit", **kw: object) -> Run:
    return gpuscope.init(job=job, hub=hub, state_dir=tmp / "state", flush_interval=0.05, **kw)  # type: ignore[arg-type]


def test_one_record_per_step_with_merged_metrics(tmp_path: Path, local_hub: HubServer) -> None:
    run = _init(
        local_hub.url, tmp_path, rank=1, world_size=2, node="n1", gpu=3, flops_per_step=2e9, peak_flops=1e12
    )
    for step in range(5):
        with run.step(tokens=1000, samples=4):
            time.sleep(0.01)
        run.log(step, loss=2.0 - step * 0.1, learning_rate=1e-3)
    run.finish()
    rows = records(local_hub.url, "unit")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and all(r["rank"] == 1 for r in rows)
    m = rows[0]["metrics"]
    assert m["loss"] == 2.0 and m["step_seconds"] >= 0.01
    assert m["tokens_per_second"] == pytest.approx(1000 / m["step_seconds"])
    assert m["mfu_ratio"] == pytest.approx(2e9 / m["step_seconds"] / 1e12)
    assert rows[0]["labels"] == {"node": "n1", "gpu": "3"}
    assert "goodput_ratio" in rows[-1]["metrics"]
    # only rank 0 speaks for the job
    assert (
        events(local_hub.url, "unit", "job_started") == []
        and events(local_hub.url, "unit", "job_ended") == []
    )
    beats = events(local_hub.url, "unit", "heartbeat")
    assert beats and beats[0]["labels"] == {"job": "unit", "rank": "1", "node": "n1", "gpu": "3"}
    with pytest.raises(ValueError, match="non-negative int"):
        run.log(-1, loss=1.0)
    for bad in (0, -300, float("inf"), "300"):
        with pytest.raises(ValueError, match="checkpoint_every must be a positive number of seconds"):
            _init(local_hub.url, tmp_path, job="bad-interval", checkpoint_every=bad)


def test_a_step_is_not_split_when_its_log_comes_late(tmp_path: Path, local_hub: HubServer) -> None:
    """The training thread descheduled between the step's timing and its ``log``: still one record."""
    run = gpuscope.init(job="late-log", hub=local_hub.url, state_dir=tmp_path / "s", flush_interval=30)
    time.sleep(0.2)  # the background thread's first round has run; the next is 30 s away
    with run.step(0):
        pass
    t = time.monotonic()
    run.shipper.tick(t)
    run.shipper.tick(t + 1.0)  # quiet for longer than settle, but no later step has begun
    run.log(0, loss=1.5)
    run.finish()
    (record,) = records(local_hub.url, "late-log")
    assert record["step"] == 0 and record["metrics"]["loss"] == 1.5 and "step_seconds" in record["metrics"]


def test_bad_metric_values_are_counted_not_sent(tmp_path: Path, local_hub: HubServer) -> None:
    run = _init(local_hub.url, tmp_path)
    run.log(0, loss=1.5, note="text")  # type: ignore[arg-type]
    run.finish()
    assert run.stats()["sdk_invalid_metrics"] == 1
    metrics = records(local_hub.url, "unit")[0]["metrics"]
    assert metrics["loss"] == 1.5 and "note" not in metrics


def test_full_buffer_drops_are_counted_and_reported(tmp_path: Path, local_hub: HubServer) -> None:
    run = gpuscope.init(
        job="drops", hub=local_hub.url, state_dir=tmp_path / "s", capacity=5, flush_interval=30
    )
    time.sleep(0.2)  # the first round has run; the next is 30 s away
    for step in range(20):
        run.log(step, loss=1.0)
    assert run.stats()["dropped_records"] == 15
    run.shipper.heartbeat()
    run.finish()
    assert len(records(local_hub.url, "drops")) == 5
    assert max(e["data"]["dropped_records"] for e in events(local_hub.url, "drops", "heartbeat")) == 15


def test_hub_away_then_back_spools_and_replays(tmp_path: Path) -> None:
    port = free_port()
    run = _init(f"http://127.0.0.1:{port}", tmp_path, job="away")
    for step in range(10):
        run.log(step, loss=float(step))
    wait_until(lambda: run.stats().get("batches_spooled", 0) > 0, 10, "batches in the spool")
    store = DuckDBStore(str(tmp_path / "hub.duckdb"))
    server = HubServer(Hub(store), "127.0.0.1", port)
    server.start()
    try:
        wait_until(lambda: len(records(server.url, "away")) == 10, 20, "the spooled records replayed")
        run.finish()
        stats = run.stats()
        assert (
            stats["batches_replayed"] >= 1
            and stats["backlog"] == 0
            and stats.get("spool_dropped_batches", 0) == 0
        )
    finally:
        server.stop()
        store.close()


def test_checkpoint_events_manifest_and_verification(tmp_path: Path, local_hub: HubServer) -> None:
    run = _init(local_hub.url, tmp_path, job="ckpt")
    path = tmp_path / "model.bin"
    with run.checkpoint(7, path) as scope:
        path.write_bytes(b"weights" * 10_000)
    assert scope.future is not None
    scope.future.result(10)
    with pytest.raises(OSError), run.checkpoint(8, tmp_path / "nodir" / "x.bin"):
        (tmp_path / "nodir" / "x.bin").write_bytes(b"x")
    path.write_bytes(b"weights" * 9_999 + b"WEIGHTS")  # damaged after the save
    results = run.verify_checkpoint(path).result(10)
    run.finish()
    assert [r.ok for r in results] == [False]
    started = events(local_hub.url, "ckpt", "checkpoint_started")
    assert sorted(e["data"]["step"] for e in started) == [7, 8]
    done = events(local_hub.url, "ckpt", "checkpoint_completed")
    assert len(done) == 1 and done[0]["data"]["bytes"] == 70_000 and done[0]["data"]["step"] == 7
    failed = events(local_hub.url, "ckpt", "checkpoint_failed")
    assert len(failed) == 1 and "FileNotFoundError" in failed[0]["data"]["reason"]
    verified = events(local_hub.url, "ckpt", "checkpoint_verified")
    assert verified[0]["data"]["ok"] is False and verified[0]["data"]["step"] == 7
    assert run.goodput_report().badput_seconds["checkpoint"] > 0


def test_torch_save_and_wrapped_collectives_in_one_process(tmp_path: Path, local_hub: HubServer) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    run = _init(local_hub.url, tmp_path, job="coll")
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'rdv'}")
    try:
        tracker = run.track_collectives()
        for step in range(3):
            with run.step(step):
                t = torch.ones(4)
                tracker.all_reduce(t)
                tracker.barrier()
        assert tracker.state() == {"collective_seq": 6, "collective_waiting_seconds": 0.0}
        model = torch.nn.Linear(4, 2)
        model(torch.ones(1, 4)).sum().backward()
        run.grad_norm(model.parameters())
        run.save(model.state_dict(), tmp_path / "m.pt", step=2).future.result(10)  # type: ignore[union-attr]
        run.finish()
    finally:
        dist.destroy_process_group()
    rows = records(local_hub.url, "coll")
    assert all("collective_wait_seconds" in r["metrics"] for r in rows)
    assert rows[-1]["metrics"]["grad_norm"] > 0
    assert events(local_hub.url, "coll", "checkpoint_completed")[0]["data"]["step"] == 2


def test_import_gpuscope_stays_cheap() -> None:
    code = (
        "import sys, gpuscope; "
        "print('gpuscope.sdk' in sys.modules, 'torch' in sys.modules, callable(gpuscope.init))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True"]


def test_save_takes_the_step_first_and_the_old_order_with_a_warning(
    tmp_path: Path, local_hub: HubServer
) -> None:
    torch = pytest.importorskip("torch")
    run = _init(local_hub.url, tmp_path, job="save-order")
    state = {"w": torch.ones(2)}
    run.save(1, state, tmp_path / "a.pt").future.result(10)  # type: ignore[union-attr]
    run.save(state, tmp_path / "b.pt", step=2).future.result(10)  # type: ignore[union-attr]
    with pytest.warns(DeprecationWarning, match=r"run.save\(step, obj, path\)"):
        run.save(state, tmp_path / "c.pt", 3).future.result(10)  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="takes"):
        run.save(state, tmp_path / "d.pt")
    run.finish()
    done = events(local_hub.url, "save-order", "checkpoint_completed")
    assert sorted((e["data"]["step"], Path(e["data"]["path"]).name) for e in done) == [
        (1, "a.pt"),
        (2, "b.pt"),
        (3, "c.pt"),
    ]


def test_init_times_the_first_ddp_model_by_itself(tmp_path: Path, local_hub: HubServer) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.nn.modules.module import _global_forward_pre_hooks
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'rdv'}")
    try:
        run = gpuscope.init(
            job="auto-coll", hub=local_hub.url, rank=0, world_size=2, node="n", state_dir=tmp_path / "s"
        )
        assert run._ddp_watch is not None and len(_global_forward_pre_hooks) == 1
        torch.nn.Linear(2, 2)(torch.ones(1, 2))  # not DDP: still watching
        model = DistributedDataParallel(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            with run.step(step):
                model(torch.ones(2, 4)).sum().backward()
                opt.step()
        assert len(_global_forward_pre_hooks) == 0  # gone once the DDP model was found
        assert run.collectives is not None and run.collectives.seq == 4
        run.finish()
    finally:
        dist.destroy_process_group()
    rows = {int(r["step"]): r["metrics"] for r in records(local_hub.url, "auto-coll")}
    assert all("collective_wait_seconds" in rows[s] for s in range(4))
    assert all(rows[s]["collective_arrival_gap_seconds"] >= 0 for s in (1, 2, 3))


def test_ddp_watch_gives_up_on_a_job_without_ddp() -> None:
    torch = pytest.importorskip("torch")
    from torch.nn.modules.module import _global_forward_pre_hooks

    from gpuscope.sdk.collectives import CollectiveTracker, DdpWatch

    def never() -> CollectiveTracker:
        raise AssertionError("no DDP model here")

    watch = DdpWatch(never, patience=3)
    layer = torch.nn.Linear(2, 2)
    for _ in range(3):
        layer(torch.ones(1, 2))
    assert len(_global_forward_pre_hooks) == 0
    watch.remove()  # idempotent


def test_team_and_pod_uid_from_the_pods_downward_api_reach_job_started(
    tmp_path: Path, local_hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    podinfo = tmp_path / "podinfo"  # a downwardAPI volume with items labels and uid
    podinfo.mkdir()
    (podinfo / "labels").write_text('app="bert"\ngroup="nlp"\nteam="research"')
    (podinfo / "uid").write_text("6f1c2a34-8b7d-4e2f-9a10-1b2c3d4e5f60")
    monkeypatch.setenv("GPUSCOPE_PODINFO", str(podinfo))
    monkeypatch.setenv("GPUSCOPE_TEAM_LABEL", "group")
    run = _init(
        local_hub.url, tmp_path, job="pod-job", rank=0, world_size=1, node="n1", gpu=0, checkpoint_every=300
    )
    run.finish()
    (started,) = events(local_hub.url, "pod-job", "job_started")
    assert started["data"]["team"] == "nlp"
    # the interval the script saves at, for the hub to tell a first checkpoint that never came
    assert started["data"]["checkpoint_every"] == 300.0
    assert started["data"]["pod_uid"] == "6f1c2a34-8b7d-4e2f-9a10-1b2c3d4e5f60"
