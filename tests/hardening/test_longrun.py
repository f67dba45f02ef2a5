"""The long run, bounded: ``bench/bench_longrun.py``'s own code for 15 simulated minutes.

The demo cluster (4 nodes, 32 GPUs, a training job and a service) runs from hh:50, so the hub's
maintenance seals the first hour into Parquet pieces and merges them while agents keep sending;
random faults include a node that goes down (it sends nothing) and a crashing job. Afterwards every sample,
event and training record the senders had acknowledged is counted again in the closed store's
files, exactly. Samples every 5 s instead of the demo's 1 s keep the run within its time budget
on two cores; the benchmark runs 6 hours at 1 s.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gpuscope.model import Batch, Frame
from gpuscope.sim.kinds import FAULT_KINDS
from gpuscope.sim.scenario import load_scenario
from gpuscope.store.duckdb import DuckDBStore
from support import load_script

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_longrun.py"
DURATION = 900.0
INTERVAL = 5.0
KINDS = ("node_down", "xid", "ecc_dbe", "rank_dropout", "latency_spike", "job_crash")


longrun = load_script(BENCH, "bench_longrun")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("longrun")
    yield longrun.run_longrun(
        workdir,
        duration=DURATION,
        seed=3,
        t0=longrun.EPOCH_HOUR + 50 * 60,
        kinds=KINDS,
        interval=INTERVAL,
    )


def test_every_acknowledged_sample_event_and_record_is_stored_exactly_once(run: Any) -> None:
    r, st = run, run.stored
    assert r.mismatches() == []
    sent_samples = r.total("samples") - r.total("refused_samples")
    assert st.samples == sent_samples > 300_000
    assert st.events == r.total("events") > 0
    assert st.training == r.total("training") > 0
    assert st.distinct_samples == st.samples  # no (entity, ts, metric) twice
    assert st.distinct_events == st.events and st.distinct_training == st.training
    assert sorted(st.batch_ids) == sorted(r.ledger.acked)
    assert r.hub_counters.get("ingest_duplicate_batches", 0) == 0


def test_every_sender_delivered_and_nothing_was_refused_or_left_behind(run: Any) -> None:
    r, sent = run, run.sent
    ticks = int(DURATION / INTERVAL)
    assert {"node-0", "node-1", "node-2", "node-3", "sdk:llm-pretrain", "sdk:chat-api"} <= set(sent)
    down = next(f for f in r.scenario.faults if f.kind == "node_down")
    for name in ("node-0", "node-1", "node-2", "node-3"):
        silent = round(min(down.duration, DURATION - down.at) / INTERVAL) if name == down.node else 0
        assert abs(sent[name].batches - (ticks - silent)) <= 1, name  # a down node sends nothing
    for name, s in sent.items():
        assert (s.refused_batches, s.duplicates) == (0, 0), name
    for name, stats in r.agent_stats.items():
        assert stats["batches_refused"] == stats["spool_pending_batches"] == 0, name


def test_the_first_hour_was_sealed_into_a_chunk_while_agents_kept_sending(run: Any) -> None:
    st = run.stored
    # the first hour's one-minute pieces merged into one file; the next hour's still pieces
    assert st.merged_files == 1 and st.chunk_files > 1 and st.chunk_rows > 0 and st.hot_rows > 0
    assert st.rows == st.chunk_rows + st.hot_rows
    assert run.maintenance_runs >= DURATION / 60 - 1


def test_the_schedule_is_recorded_and_every_fault_is_scored(run: Any, tmp_path: Path) -> None:
    scenario = run.scenario
    assert sorted(f.kind for f in scenario.faults) == sorted(KINDS)
    path = tmp_path / "longrun.yaml"
    path.write_text(run.schedule)
    assert load_scenario(path).faults == scenario.faults
    report = run.report
    assert [o.fault for o in report.outcomes] == list(scenario.faults)
    print(f"recall {report.recall:.0%}, {len(run.alerts)} alerts")


def test_the_default_schedule_has_every_fault_kind_once_in_order_and_valid() -> None:
    scenario, _ = longrun.longrun_scenario(6 * 3600, seed=10)
    faults = scenario.faults
    assert sorted(f.kind for f in faults) == sorted(FAULT_KINDS)
    assert all(a.end <= b.at for a, b in itertools.pairwise(faults))  # one at a time
    assert faults[0].at >= longrun.WARM_UP and faults[-1].end <= scenario.duration
    again, _ = longrun.longrun_scenario(6 * 3600, seed=10)
    assert again.faults == faults
    other = longrun.random_faults(scenario, 6 * 3600, random.Random(11))
    assert [f["kind"] for f in other] != [f.kind for f in faults]


def test_the_store_count_finds_a_sample_stored_twice(tmp_path: Path) -> None:
    """The check itself: a batch stored again under a new id (a retry the hub failed to
    recognise) shows up as samples twice and as the wrong batch ids, not as a silent match."""
    path = tmp_path / "twice.duckdb"
    labels = [{"node": "n", "gpu": "0"}]
    frame = Frame(
        1_700_000_000.0, ["gpu_temp_celsius", "gpu_power_watts"], labels, np.array([[61.0, np.nan]])
    )
    with DuckDBStore(str(path)) as store:
        store.append(Batch("n", frames=[frame], batch_id="n:1"))
        store.append(Batch("n", frames=[frame], batch_id="n:1-again"))
    st = longrun.count_store(path)
    assert (st.samples, st.distinct_samples, st.rows, st.distinct_rows) == (2, 1, 2, 1)
    assert sorted(st.batch_ids) == ["n:1", "n:1-again"]


def test_a_batch_whose_first_answer_was_lost_counts_as_acknowledged_once() -> None:
    """Under load a sender may time out on a batch the hub did store; its retry is answered as a
    duplicate. That first duplicate answer is the batch's acknowledgement, a second one is not."""
    ledger = longrun.Ledger()
    answer = {"duplicate": True, "refused": {"samples": 0}}
    ledger.answer("node-0:7", httpx.Response(200, json=answer))
    ledger.answer("node-0:7", httpx.Response(200, json=answer))
    assert ledger.acked == ["node-0:7"] and ledger.late_acks == ["node-0:7"]
    assert ledger.duplicates == ["node-0:7"]
    ledger.answer("node-0:8", httpx.Response(200, json={"duplicate": False, "refused": {"samples": 0}}))
    assert ledger.acked == ["node-0:7", "node-0:8"] and ledger.late_acks == ["node-0:7"]
