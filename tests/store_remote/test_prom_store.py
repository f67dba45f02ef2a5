"""The remote backend's own contract: the wire format, PromQL escaping, what a failing or refusing
TSDB does to a batch, the PostgreSQL meta store shared by hubs, the ``storage:`` config, and a
real ``gpuscope hub --config`` process writing to VictoriaMetrics."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import orjson
import psycopg
import pytest

from gpuscope.config import ConfigError, HubConfig, load_config
from gpuscope.model import Alert, Batch, Event, Frame, TrainingRecord
from gpuscope.store.base import AppendResult, GpuTime
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.errors import StoreError
from gpuscope.store.remote.local import LocalTSDB, free_port
from gpuscope.store.remote.meta import PostgresMeta
from gpuscope.store.remote.prom_store import PromStore
from gpuscope.store.remote.promql import quote, selector
from gpuscope.store.settings import open_store
from store_remote.tsdbs import ReadYourWrites
from support import HubProcess, loopback_http, wait_until

pytestmark = pytest.mark.integration

NOW = float(int(time.time()) - 60)


def frame(ts: float, value: float, node: str = "n0") -> Frame:
    return Frame(ts, ["gpu_temp_celsius"], [{"node": node, "gpu": "0", "job": "j"}], np.array([[value]]))


def test_promql_strings_cannot_be_escaped_from() -> None:
    assert quote('x"} or vector(1) #') == '"x\\"} or vector(1) #"'
    assert quote("a\\b\nc") == '"a\\\\b\\nc"'
    assert selector("m", {"node": 'n"', "gpu": "1"}) == '{__name__="m", gpu="1", node="n\\""}'
    for bad in ({"__name__": "x"}, {"a-b": "x"}):
        with pytest.raises(ValueError, match="not a valid label name"):
            selector("m", bad)
    with pytest.raises(ValueError, match="not a valid Prometheus metric name"):
        selector('m"}', {})


class _Failing(http.server.BaseHTTPRequestHandler):
    """A TSDB stand-in that answers every write with one status (fault injection)."""

    status = 503
    hits = 0

    def do_POST(self) -> None:
        type(self).hits += 1
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(b"overloaded")

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def failing_tsdb() -> Iterator[str]:
    _Failing.hits = 0
    with loopback_http(_Failing) as url:
        yield url


def test_5xx_is_retried_then_a_store_error_and_the_batch_is_not_recorded(failing_tsdb: str) -> None:
    meta = DuckDBStore(":memory:")
    # 2 s holds about six tries at 0.05 s doubling: a slow first request under load still leaves a retry
    store = PromStore(f"{failing_tsdb}/api/v1/write", failing_tsdb, meta, retry_s=2.0)
    batch = Batch("a", frames=[frame(NOW, 1.0)], events=[Event(NOW, "xid", {"node": "n0"})], batch_id="b1")
    with pytest.raises(StoreError, match=r"remote write to http://127\.0\.0\.1:\d+/api/v1/write failed"):
        store.append(batch)
    assert _Failing.hits >= 2  # retried with backoff
    assert store.counters.get("store.remote_write_retries") == _Failing.hits - 1
    assert not meta.has_batch("b1") and meta.events(0, NOW + 10) == []  # the sender keeps and resends it
    assert store.counters.get("store.remote_write_failures") == 1
    store.close()


def test_unreachable_tsdb_is_a_store_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    store = PromStore(f"{url}/api/v1/write", url, DuckDBStore(":memory:"), retry_s=0.2)
    with pytest.raises(StoreError, match="ConnectError"):
        store.append(Batch("a", frames=[frame(NOW, 1.0)]))
    store.close()


@pytest.mark.parametrize("tsdb", ["prometheus"], indirect=True)
def test_4xx_refusals_are_counted_and_named(tsdb: LocalTSDB) -> None:
    store = ReadYourWrites(tsdb, DuckDBStore(":memory:"), retry_s=1)
    assert store.append(Batch("a", frames=[frame(NOW, 1.0)])).samples == 1
    late = store.append(Batch("a", frames=[frame(NOW - 30, 2.0)], events=[Event(NOW, "xid", {})]))
    assert late.samples == 0 and late.refused_samples == 1 and late.events == 1  # the rest is kept
    assert "the TSDB refused" in late.notes[0] and "out of order" in late.notes[0]
    assert store.counters.get("store.remote_refused_samples") == 1
    store.close()


@pytest.mark.parametrize("tsdb", ["victoriametrics", "prometheus"], indirect=True)
def test_a_big_batch_goes_in_parallel_lanes_and_reads_back_whole(tsdb: LocalTSDB) -> None:
    # tiny requests, lanes and series-head cache: 9 requests in 3 lanes of 2 entities each, heads
    # evicted as it goes
    store = ReadYourWrites(
        tsdb, DuckDBStore(":memory:"), max_request_samples=5, parallel_requests=3, label_cache_series=8
    )
    entities = [{"node": "n", "gpu": str(g)} for g in range(6)]

    def tick(k: int) -> Frame:
        values = np.array([[k * 100 + g * 10 + j for j in range(2)] for g in range(6)], dtype=np.float64)
        return Frame(NOW + k, ["m_a", "m_b"], entities, values)

    # out of time order: a series' samples must still go in time order (Prometheus refuses older)
    result = store.append(Batch("s", frames=[tick(2), tick(0), tick(1)]))
    assert (result.samples, result.refused_samples, result.notes) == (36, 0, [])
    assert store.counters.get("store.remote_write_requests") == 9
    assert store.append(Batch("s", frames=[tick(3)])).samples == 12  # one time: 3 shares of 4
    assert store.counters.get("store.remote_write_requests") == 12
    assert store._cached <= 8
    for j, metric in enumerate(["m_a", "m_b"]):
        for g in range(6):
            points = store.series(metric, {"gpu": str(g)}, NOW - 1, NOW + 4, points=100)
            assert [p.value for p in points] == [k * 100 + g * 10 + j for k in range(4)], (metric, g)
    store.close()


@pytest.mark.parametrize("tsdb", ["victoriametrics"], indirect=True)
def test_series_a_tsdb_cannot_hold_are_refused_and_named(tsdb: LocalTSDB) -> None:
    store = ReadYourWrites(tsdb, DuckDBStore(":memory:"))
    entities = [{"node": "a"}, {"node": "b", "__x": "1"}, {"node": "c\ud800"}]
    frame = Frame(NOW, ["gpu_temp_celsius", "bad-name"], entities, np.arange(6.0).reshape(3, 2))
    result = store.append(Batch("s", frames=[frame]))
    assert result.samples == 1 and result.refused_samples == 5
    assert sorted(result.notes) == [
        "refused 1 sample(s): label '__x' is reserved",
        "refused 1 sample(s): label 'node' is not valid UTF-8",
        "refused 3 sample(s): metric name 'bad-name' is not a Prometheus name",
    ]
    rows = store.snapshot(["gpu_temp_celsius"])
    assert [(r["labels"], r["values"]) for r in rows] == [({"node": "a"}, {"gpu_temp_celsius": 0.0})]
    store.close()


class _MetaFailingOnce(DuckDBStore):
    """A meta store whose first commit fails (fault injection): the hub answers 503, the sender
    retries the whole batch, and its telemetry reaches the TSDB a second time."""

    failures = 1

    def append(self, batch: Batch) -> AppendResult:
        if self.failures:
            self.failures -= 1
            raise StoreError("meta store unavailable")
        return super().append(batch)


@pytest.mark.parametrize("tsdb", ["victoriametrics"], indirect=True)
def test_a_batch_retried_after_its_meta_commit_failed_is_stored_once(tsdb: LocalTSDB) -> None:
    store = ReadYourWrites(tsdb, _MetaFailingOnce(":memory:"))
    batch = Batch("a", frames=[frame(NOW, 7.0)], events=[Event(NOW, "xid", {})], batch_id="b-1")
    with pytest.raises(StoreError, match="meta store unavailable"):
        store.append(batch)
    assert store.append(batch).samples == 1
    tsdb.flush()
    [group] = store.aggregate("gpu_temp_celsius", "node", NOW - 1, NOW + 1)
    assert (group["count"], group["mean"]) == (1, 7.0)  # -dedup.minScrapeInterval=1ms keeps one
    store.close()


def test_postgres_meta_shared_by_two_hubs(postgres_dsn: str) -> None:
    a, b = PostgresMeta(postgres_dsn), PostgresMeta(postgres_dsn)
    hostile = {"node": 'n"0', "gpu": "\\1"}
    batch = Batch(
        "x",
        events=[Event(NOW, "xid", hostile, {"code": 79, "msg": "nul\u0000byte"}), Event(NOW + 1, "xid", {})],
        training=[TrainingRecord(NOW, "job", 0, 7, {"loss": float("nan"), "lr": 0.1}, {"node": "n"})],
        batch_id="once",
    )
    assert a.append(batch).events == 2
    assert b.has_batch("once") and b.append(batch).duplicate  # the other hub sees the id
    [ev] = b.events(0, NOW + 10, "xid", hostile)
    assert ev.labels == hostile and ev.data == {"code": 79, "msg": "nul\u0000byte"}
    assert b.events(0, NOW + 10, "xid", {"node": 'n"'}) == []  # a prefix of the value is no match
    [rec] = b.training("job", 0, NOW + 10)
    assert rec.step == 7 and np.isnan(rec.metrics["loss"]) and rec.metrics["lr"] == 0.1
    alert = Alert("al-1", "gpu_xid_fatal", "P1", "platform", hostile, NOW, "XID 79", 2.5)
    a.save_alert(alert)
    alert.resolved_at = NOW + 5
    a.save_alert(alert)
    assert [x.resolved_at for x in b.alerts()] == [NOW + 5] and b.alerts(firing_only=True) == []
    assert b.stats()["rows"] == {"events": 2, "training": 1, "alerts": 1, "batch_ids": 1}
    assert a.compact(NOW + 91 * 86400)["events"] == 2
    a.close()
    b.close()


def test_postgres_meta_saves_many_alerts_at_once_a_repeated_one_as_listed_last(postgres_dsn: str) -> None:
    a, b = PostgresMeta(postgres_dsn), PostgresMeta(postgres_dsn)
    alerts = [
        Alert(f"al-{i}", "gpu_lost", "P1", "infra", {"node": f"n{i}"}, NOW + i, "lost", 1.0)
        for i in range(50)
    ]
    a.save_alerts(alerts)
    again = Alert("al-3", "gpu_lost", "P1", "infra", {"node": "n3"}, NOW + 3, "lost", 1.0)
    again.resolved_at = NOW + 60
    a.save_alerts([alerts[3], *alerts[40:], again])
    a.save_alerts([])
    back = {x.id: x for x in b.alerts()}
    assert len(back) == 50 and back["al-3"].resolved_at == NOW + 60
    assert len(b.alerts(firing_only=True)) == 49
    a.close()
    b.close()


def test_postgres_meta_gpu_time_shared_and_folded_once_by_two_hubs(postgres_dsn: str) -> None:
    a, b = PostgresMeta(postgres_dsn), PostgresMeta(postgres_dsn)
    h = 3600.0 * 1000
    minutes = [GpuTime(60, h + 60 * k, "node-a", "0", "j", "t", "", "training", 60.0, 0.0) for k in range(60)]
    a.save_gpu_time(minutes)
    b.save_gpu_time([GpuTime(60, h, "node-b", "0", "", "", "chat", "serving", 40.0, 0.0)])
    b.save_gpu_time([GpuTime(60, h, "node-b", "0", "", "", "chat", "serving", 50.0, 1.5)])
    assert len(b.gpu_time(h, h + 3600)) == 61  # each hub sees the other's cells
    with ThreadPoolExecutor(2) as pool:  # both hubs fold at once: each minute is moved once
        folded = list(pool.map(lambda m: m.fold_gpu_time(h + 3600), [a, b]))
    assert sorted(folded) == [0, 61]
    cells = {(c.res, c.node): (c.gpu, c.seconds, c.lost) for c in a.gpu_time(h, float("inf"))}
    assert cells == {(3600, "node-a"): ("", 3600.0, 0.0), (3600, "node-b"): ("", 50.0, 1.5)}
    assert a.compact(h + 91 * 86400)["gpu_time"] == 2
    a.close()
    b.close()


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gpuscope.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("storage: {backend: influx}\n", "storage.backend"),
        ("storage: {backend: prometheus, query_url: 'http://x'}\n", "storage.remote_write_url"),
        (
            "storage: {backend: prometheus, remote_write_url: 'ftp://x', query_url: 'http://x'}\n",
            "storage.remote_write_url",
        ),
        ("storage: {remote_writ_url: 'http://x'}\n", "storage.remote_writ_url"),
        ("storage: {timeout_s: fast}\n", "storage.timeout_s"),
        ("storage: {headers: [a]}\n", "storage.headers"),
        ("storage: {meta: postgres}\n", "storage.postgres_dsn"),
        ("storage: {meta: sqlite}\n", "storage.meta"),
        ("storage: {basic_auth: {username: u}}\n", "storage.basic_auth"),
    ],
)
def test_bad_storage_config_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(write_config(tmp_path, text))


@pytest.mark.parametrize("tsdb", ["victoriametrics"], indirect=True)
def test_open_store_builds_the_remote_backend_with_credentials(
    tmp_path: Path, tsdb: LocalTSDB, postgres_dsn: str
) -> None:
    (tmp_path / "token").write_text("s3cret-token\n")
    cfg = load_config(
        write_config(
            tmp_path,
            f"storage: {{backend: prometheus, remote_write_url: '{tsdb.write_url}', query_url: '{tsdb.url}', "
            f"bearer_token_file: '{tmp_path / 'token'}', headers: {{X-Scope-OrgID: t1}}, meta: postgres, "
            f"postgres_dsn: '{postgres_dsn}'}}\n",
        )
    )
    assert "s3cret" not in repr(cfg) and postgres_dsn not in repr(cfg)
    store = open_store(cfg.storage_settings(), cfg.store_limits())
    assert isinstance(store, PromStore) and isinstance(store.meta, PostgresMeta)
    assert store.append(Batch("a", frames=[frame(NOW, 3.0)], batch_id="z")).samples == 1
    assert store.stats()["backend"] == "prometheus" and "s3cret" not in orjson.dumps(store.stats()).decode()
    store.close()
    local = HubConfig(storage_path=str(tmp_path / "d.duckdb")).storage_settings()
    assert isinstance(open_store(local), DuckDBStore)


@pytest.mark.parametrize("tsdb", ["victoriametrics"], indirect=True)
def test_hub_process_with_remote_storage_ingests_and_answers_series(
    tmp_path: Path, tsdb: LocalTSDB, hub_factory: type[HubProcess]
) -> None:
    config = write_config(
        tmp_path,
        f"storage: {{backend: prometheus, remote_write_url: '{tsdb.write_url}', query_url: '{tsdb.url}'}}\n",
    )
    hub = hub_factory(free_port(), tmp_path / "meta.duckdb", ["--config", config])
    hub.wait_ready()
    body = {
        "source": "node-0",
        "batch_id": "e2e-1",
        "frames": [
            {
                "ts": NOW + k,
                "metrics": ["gpu_temp_celsius"],
                "entities": [{"node": "node-0", "gpu": "0"}],
                "values": [[60.0 + k]],
            }
            for k in range(3)
        ],
    }
    r = httpx.post(
        f"{hub.url}/api/v1/ingest", content=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200 and r.json()["accepted"]["samples"] == 3, r.text
    # straight from the TSDB: the hub wrote it there
    tsdb.flush()
    raw = httpx.get(f"{tsdb.url}/api/v1/export", params={"match[]": "gpu_temp_celsius"}).text
    assert '"node":"node-0"' in raw and "60,61,62" in raw
    params = {"metric": "gpu_temp_celsius", "node": "node-0", "start": NOW - 1, "end": NOW + 5}

    def answered() -> bool:
        tsdb.flush()
        points = httpx.get(f"{hub.url}/api/v1/series", params=params).json()["points"]
        return [p[1] for p in points] == [60.0, 61.0, 62.0]

    wait_until(answered, 15, "the hub to read the series back from VictoriaMetrics")
    health = httpx.get(f"{hub.url}/api/v1/health").json()
    assert health["store"]["backend"] == "prometheus"


def _concurrent_appends(store: PromStore, n: int, boot: str = "boot") -> list[AppendResult]:
    """``n`` agents' batches (a sample and an event each) appended by ``n`` threads at once."""
    start = threading.Barrier(n)

    def one(i: int) -> AppendResult:
        batch = Batch(
            f"node-{i}",
            frames=[frame(NOW, float(i), node=f"node-{i}")],
            events=[Event(NOW, "mark", {"node": f"node-{i}"}, {"i": i})],
            batch_id=f"node-{i}:{boot}:0",
        )
        start.wait()
        return store.append(batch)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


@pytest.mark.parametrize("tsdb", ["victoriametrics"], indirect=True)
def test_concurrent_appends_share_remote_writes_and_postgres_transactions(
    tsdb: LocalTSDB, postgres_dsn: str
) -> None:
    n = 24
    meta = PostgresMeta(postgres_dsn)
    store = ReadYourWrites(tsdb, meta)
    results = _concurrent_appends(store, n)
    assert [(r.samples, r.events, r.duplicate) for r in results] == [(1, 1, False)] * n
    requests = store.counters.get("store.remote_write_requests")
    assert requests <= n // 2, requests  # one request per append before grouping
    assert meta._appends is not None and meta._lookups is not None
    assert meta._appends.items == n and meta._appends.groups <= n // 2  # transactions
    assert meta._lookups.items == n and meta._lookups.groups <= n // 2  # id lookups
    # everything is stored, once: a retry of every batch is a duplicate
    assert len(store.meta.events(0, NOW + 10, "mark", limit=1000)) == n
    assert store.aggregate("gpu_temp_celsius", "node", NOW - 1, NOW + 1)[0]["count"] == 1
    assert len(store.aggregate("gpu_temp_celsius", "node", NOW - 1, NOW + 1)) == n
    assert all(r.duplicate for r in _concurrent_appends(store, n))
    store.close()

    # the same without grouping: a request and a transaction per append (the figure bench_remote
    # prints beside the grouped one)
    plain = ReadYourWrites(tsdb, PostgresMeta(postgres_dsn, group_writes=False), group_writes=False)
    assert not any(r.duplicate for r in _concurrent_appends(plain, n, "rebooted"))
    assert plain.counters.get("store.remote_write_requests") == n
    plain.close()


@pytest.mark.parametrize("tsdb", ["prometheus"], indirect=True)
def test_a_refusal_in_a_grouped_request_is_counted_against_its_own_batch(tsdb: LocalTSDB) -> None:
    store = ReadYourWrites(tsdb, DuckDBStore(":memory:"), retry_s=1)
    assert store.append(Batch("a", frames=[frame(NOW, 1.0)])).samples == 1
    late = store._preparer.prepare(Batch("a", frames=[frame(NOW - 30, 2.0)]))  # out of order
    fine = store._preparer.prepare(Batch("b", frames=[frame(NOW, 3.0, node="n1")]))
    lanes = [store._lanes(p, p.result)[0] for p in (late, fine)]
    refused, taken = store._send_group(lanes)
    assert isinstance(refused, tuple) and refused[0] == 1 and "out of order" in refused[1]
    assert taken is None
    assert store.counters.get("store.remote_write_grouped") == 2
    tsdb.flush()
    assert [p.value for p in store.series("gpu_temp_celsius", {"node": "n1"}, NOW - 1, NOW + 1)] == [3.0]
    store.close()


def _rows(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as con:
        return {
            t: int(con.execute(f"SELECT count(*) FROM gpuscope_{t}").fetchone()[0])  # type: ignore[index]
            for t in ("events", "training", "batch_ids")
        }


def test_steady_heartbeats_live_in_memory_and_only_transitions_are_stored(postgres_dsn: str) -> None:
    meta = PostgresMeta(postgres_dsn)
    t0 = time.time() - 300

    def beats(second: float, ranks: range, seq: int) -> Batch:
        events = [Event(t0 + second, "heartbeat", {"job": "j", "rank": str(r)}, {"step": seq}) for r in ranks]
        return Batch("sdk:j", events=events, batch_id=f"sdk:j:{seq}")

    meta.append(beats(0, range(4), 0))  # four ranks seen: four transitions
    assert _rows(postgres_dsn) == {"events": 4, "training": 0, "batch_ids": 1}
    before = _rows(postgres_dsn)
    for second in range(1, 40):  # steady: not one row, not even a batch id
        result = meta.append(beats(second, range(4), second))
        assert result.events == 4 and not result.duplicate
    assert _rows(postgres_dsn) == before
    assert meta.stats()["heartbeats"] == {"ranks": 4, "kept_in_memory": 4 * 39}
    # rank 3 stops: 60 s later (the others' beats tell the time) its loss is stored; it comes back
    for second in range(40, 110):
        meta.append(beats(second, range(3), second))
    meta.append(beats(110, range(3), 110))
    meta.append(beats(111, range(4), 111))
    kinds = [(e.kind, e.labels["rank"], e.ts - t0) for e in meta.events(0, time.time(), limit=100)]
    assert sorted(kinds) == sorted(
        [("heartbeat_seen", str(r), 0.0) for r in range(4)]
        + [("heartbeat_lost", "3", 39.0), ("heartbeat_seen", "3", 111.0)]
    )
    # a heartbeat riding with step records adds no row of its own
    record = TrainingRecord(t0 + 112, "j", 0, 112, {"loss": 1.0}, {})
    meta.append(Batch("sdk:j", events=beats(112, range(4), 112).events, training=[record], batch_id="x"))
    assert _rows(postgres_dsn)["events"] == 6
    meta.close()
