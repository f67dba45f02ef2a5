"""Acknowledged means durable: a killed writer loses nothing it acknowledged; threads coalesce."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np

from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore
from store.store_helpers import frame, gpu

CHILD = textwrap.dedent(
    """
    import sys, threading
    import numpy as np
    from gpuscope.model import Batch, Frame
    from gpuscope.store.duckdb import DuckDBStore

    store = DuckDBStore(sys.argv[1], seal_interval_s=60, raw_retention_s=1e9)
    lock = threading.Lock()

    def upkeep():  # seals, rollups, retention and checkpoints race with the appends
        while True:
            store.rollup(4_000_000.0)
            store.compact(4_000_000.0)

    def run(worker):
        for k in range(100_000):
            t = float(worker * 1_000_000 + k)
            ents = [{"node": f"n{worker}", "gpu": str(g)} for g in range(8)]
            batch = Batch("child", frames=[Frame(t, ["util", "temp"], ents, np.full((8, 2), t))],
                          batch_id=f"{worker}:{k}")
            store.append(batch)
            with lock:
                print(batch.batch_id, flush=True)

    threading.Thread(target=upkeep, daemon=True).start()
    for w in range(4):
        threading.Thread(target=run, args=(w,), daemon=True).start()
    threading.Event().wait()
    """
)


def test_acknowledged_batches_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "crash.duckdb"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    acked: list[str] = []
    for line in proc.stdout:
        acked.append(line.strip())
        if len(acked) >= 400:
            break
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    acked += [line for line in rest.splitlines() if line.strip()]
    assert proc.returncode == -signal.SIGKILL
    with DuckDBStore(str(path)) as store:
        for bid in acked:
            worker, k = (int(x) for x in bid.split(":"))
            t = float(worker * 1_000_000 + k)
            points = store.series("temp", {"node": f"n{worker}"}, t, t)
            assert [(p.ts, p.value) for p in points] == [(t, t)], f"acknowledged batch {bid} was lost"
            assert store.append(Batch("again", batch_id=bid)).duplicate


def test_concurrent_appends_from_threads(tmp_path: Path) -> None:
    store = DuckDBStore(str(tmp_path / "threads.duckdb"))
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            ents = [gpu(f"n{w}", g) for g in range(4)]
            for k in range(50):
                result = store.append(Batch("t", frames=[frame(float(k), ["util"], ents, [[k + w]] * 4)]))
                assert result.samples == 4
                store.snapshot(["util"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.stats()["raw_rows"] == 8 * 50 * 4
    by_node = {a["group"]: a for a in store.aggregate("util", "node", 0, 49)}
    assert sorted(by_node) == [f"n{w}" for w in range(8)]
    assert all(a["count"] == 200 and a["mean"] == 24.5 + int(g[1:]) for g, a in by_node.items())
    assert len(store.snapshot()) == 32
    assert store.stats()["commits"] <= 400
    store.close()


def test_new_metrics_appear_while_rollups_run(tmp_path: Path) -> None:
    """Column additions (DDL) and maintenance transactions must not conflict."""
    store = DuckDBStore(str(tmp_path / "ddl.duckdb"))
    stop = threading.Event()
    errors: list[BaseException] = []

    def maintain() -> None:
        try:
            while not stop.is_set():
                store.rollup(10_000.0)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=maintain, daemon=True)
    thread.start()
    try:
        for k in range(40):
            values = np.full((2, 1), float(k))
            store.append(
                Batch(
                    "t",
                    frames=[
                        frame(float(k * 60), [f"metric_{k}"], [gpu("n0", 0), gpu("n0", 1)], values.tolist())
                    ],
                )
            )
    finally:
        stop.set()
        thread.join(timeout=60)
    assert errors == []
    assert store.stats()["metrics"] == 40
    store.rollup(10_000.0)
    assert store.aggregate("metric_39", "gpu", 0, 3_000)[0]["mean"] == 39.0
    store.close()
