""":class:`gpuscope.store.base.Store` on any Prometheus-compatible TSDB (VictoriaMetrics single or
cluster, Mimir, Thanos Receive, Prometheus with its remote-write receiver).

Write path: a batch is validated and converted exactly as the embedded store does it (the same
:class:`~gpuscope.store.prepare.Preparer`: the same refusals, limits, float32 values and notes),
its telemetry sent with remote-write (one series per metric and label set, attribution labels such
as ``job`` included; requests of at most ``max_request_samples`` samples, ``parallel_requests`` at
a time; series heads cached, see :mod:`~gpuscope.store.remote.wire`; the samples of small batches
appended at the same time go in one request, see :mod:`gpuscope.store.group`), and only once the TSDB
answered 2xx are its events, training records and batch id committed to the meta store: a batch is
acknowledged only when all of it is stored, and a retry after a failure writes the same samples
again, which the TSDB keeps once (same timestamp, same value: Prometheus drops the repeat,
VictoriaMetrics does with ``-dedup.minScrapeInterval=1ms``). 5xx, 429 and connection errors are
retried with backoff for ``retry_s``, then :class:`StoreError` (the hub answers 503 and the sender
keeps the batch); other 4xx mean the TSDB refused samples (too old, out of order, over its
limits): counted, named in the notes, not retried.

Read path: PromQL over HTTP. ``series`` is ``sum(sum_over_time)/sum(count_over_time)`` per step
(the mean of all samples in each bucket, as the embedded store computes it), ``aggregate`` four
instant queries over the whole range, ``snapshot`` the last value and its time per series within a
window. Rollups, downsampling and retention of telemetry are the TSDB's job: :meth:`rollup` does
nothing and :meth:`compact` only applies retention to the meta store.

Differences a user can see: data becomes visible when the TSDB makes it searchable (VictoriaMetrics
hides the newest ``-search.latencyOffset``, 30 s by default, and flushes within about a second);
the entity and metric limits are counted per hub process; ``snapshot`` ages are measured from the
wall clock, not from the newest sample.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import re
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
import numpy.typing as npt

from gpuscope.counters import Counters
from gpuscope.model import ATTRIBUTION_LABELS, Batch, Event, Labels, TrainingRecord
from gpuscope.signals import ALL_METRICS
from gpuscope.store.base import AppendResult, Durable, SeriesPoint
from gpuscope.store.batch_ids import BatchIds, Claim
from gpuscope.store.errors import StoreError
from gpuscope.store.group import GroupCommitter
from gpuscope.store.prepare import Prepared, Preparer, to_ms
from gpuscope.store.registry import ATTR_COLUMNS, ColumnRegistry, EntityRegistry
from gpuscope.store.remote import wire
from gpuscope.store.remote.meta import MetaStore
from gpuscope.store.remote.promql import (
    LABEL_NAME_RE,
    METRIC_NAME_RE,
    PromQL,
    duration,
    names_selector,
    quote,
    selector,
)
from gpuscope.store.remote.records import MetaRecords
from gpuscope.store.replay import REPLAY_LIMIT, Row, Scope, batches, ceil_div, check_window, ms_range

DAY = 86_400.0
MAX_NOTES = 20
MAX_POINTS = 11_000  # Prometheus refuses range queries of more points per series

#: One entity's series heads for a set of metric columns (an object array of bytes, None where
#: refused) and the refused columns with the reason.
_Row = tuple[npt.NDArray[np.object_], tuple[tuple[int, str], ...]]
#: The series heads of a frame's rows (rows × metric columns, None where refused) and its refused
#: cells (row, column, reason).
_Block = tuple[npt.NDArray[np.object_], tuple[tuple[int, int, str], ...]]
#: The series heads and sample fields of one request's worth of samples.
_Lane = tuple[list[bytes], list[bytes]]
#: What became of a request: taken (None), (samples refused, the TSDB's answer), or a failure.
_Outcome = tuple[int, str] | StoreError | None
#: How long the request writer waits for the rest of a wave of concurrent appends (see group.py).
GROUP_LINGER_S = 0.005


@dataclass(slots=True)
class _Started:
    """A batch :meth:`PromStore.append_then` took: its telemetry encoded (one request's worth at
    most), its events and training records for the meta store, and what the sender is told."""

    batch: Batch
    lane: _Lane
    result: AppendResult


def redact(url: str) -> str:
    """A URL without user:password, for logs and stats."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _note(result: AppendResult, text: str) -> None:
    if len(result.notes) < MAX_NOTES:
        result.notes.append(text)


class PromStore(MetaRecords):
    """Telemetry in a remote TSDB, everything else in a :class:`MetaStore` (:class:`MetaRecords`)."""

    def __init__(
        self,
        remote_write_url: str,
        query_url: str,
        meta: MetaStore,
        *,
        headers: dict[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        timeout_s: float = 10.0,
        retry_s: float = 30.0,
        max_entities: int = 100_000,
        max_metrics: int = 512,
        snapshot_window_s: float = 3600.0,
        max_request_samples: int = 10_000,
        parallel_requests: int = 4,
        label_cache_series: int = 1_000_000,
        counters: Counters | None = None,
        path: str | None = None,
        group_writes: bool = True,
    ) -> None:
        self.remote_write_url = remote_write_url
        self.query_url = query_url
        self.meta = meta
        self.path = path or meta.path  # lineage and alerting state files go beside this path
        self.retry_s = retry_s
        self.snapshot_window_s = snapshot_window_s
        self.max_request_samples = max_request_samples
        self.parallel_requests = parallel_requests
        self.label_cache_series = label_cache_series
        self.counters = counters if counters is not None else Counters()
        self.entities = EntityRegistry(max_entities)
        self.columns = ColumnRegistry(max_metrics)
        self._preparer = Preparer(self.entities, self.columns, ColumnRegistry(max_metrics))
        self._ids = BatchIds(1_000_000, DAY)  # concurrent appends of one id: one writes, one waits
        self._client = httpx.Client(
            headers=headers or {}, auth=auth, timeout=timeout_s, follow_redirects=False
        )
        self.promql = PromQL(self._client, query_url)
        # series heads per (metric columns, sample size, entity, attribution); see _row
        self._heads: dict[tuple[tuple[int, ...], int, int, int], _Row] = {}
        self._cached = 0  # series in _heads
        self._cache_lock = threading.Lock()
        # a whole frame's heads (an agent repeats its layout every tick) per (metric columns,
        # sample size, entity ids, attribution codes): no per-row lookups and stacking; see _block
        self._blocks: dict[tuple[tuple[int, ...], int, bytes, bytes], _Block] = {}
        self._blocked = 0  # series in _blocks
        self._pool: ThreadPoolExecutor | None = None  # senders of a batch's requests, made on need
        #: small batches of concurrent appends (an agent's tick each) share one remote-write request
        self.group_writes = group_writes
        self._writer: GroupCommitter[_Lane, _Outcome] | None = None  # made on need
        #: the writer of append_then's batches, a tick at once (made on need)
        self._tick: GroupCommitter[_Started, AppendResult | StoreError] | None = None
        self._closed_windows: bool | None = None  # range selectors include their left edge
        self._tlast: bool | None = None  # whether the TSDB has MetricsQL's tlast_over_time
        self._closed = False
        self._lock = threading.Lock()
        #: seconds of telemetry :meth:`replay` reads and turns into batches at a time
        self.replay_chunk_s = 30.0

    # ------------------------------------------------------------------ append

    def append_then(self, batch: Batch, durable: Durable) -> bool:
        """:meth:`append` without a thread waiting on it. The batch is validated and its telemetry
        encoded here (refusals raised at once); one writer thread then stores it with every batch
        started meanwhile, a tick at once: one batch-id lookup, one remote-write request and one
        meta-store transaction for all of them (:meth:`_commit_tick`), where :meth:`append` from
        concurrent threads waits for three grouped round trips, a hand-over and a wake-up each,
        per batch. ``durable`` hears each batch's result from that thread.

        What is stored is what :meth:`append` stores. False, with nothing done, when writes are
        not grouped, for a batch of more than one request's samples, and for a batch whose id is
        being stored right now (:meth:`append` waits for that one's outcome)."""
        self._check_open()
        if not self.group_writes or sum(f.values.size for f in batch.frames) > self.max_request_samples:
            return False
        bid = batch.batch_id
        if bid is not None:
            claim = self._ids.try_claim(bid)
            if claim is None:
                return False
            if claim is Claim.DUPLICATE:
                self.counters.inc("store.duplicate_batches")
                durable(AppendResult(duplicate=True))
                return True
        try:
            telemetry = self._preparer.prepare(Batch(batch.source, frames=batch.frames))
            self._preparer.prepare(Batch(batch.source, events=batch.events, training=batch.training))
            self.columns.mark_persisted(telemetry.columns)
            self.entities.mark_persisted(telemetry.entities)
            heads, fields, _, _ = self._encode(telemetry, telemetry.result)
            started = self._tick_writer().submit(_Started(batch, (heads, fields), telemetry.result))
        except BaseException:
            if bid is not None:
                self._ids.finish(bid, False, time.time())
            raise
        started.add_done_callback(functools.partial(self._ticked, bid, durable))
        return True

    def _ticked(self, bid: str | None, durable: Durable, done: Future[AppendResult | StoreError]) -> None:
        """A batch of :meth:`append_then` is stored, or failed (on the tick writer's thread)."""
        error = done.exception()
        outcome: AppendResult | Exception
        if error is None:
            outcome = done.result()
        else:
            outcome = error if isinstance(error, Exception) else RuntimeError(repr(error))
        if bid is not None:
            self._ids.finish(bid, isinstance(outcome, AppendResult), time.time())
        durable(outcome)

    def _tick_writer(self) -> GroupCommitter[_Started, AppendResult | StoreError]:
        with self._lock:
            self._check_open()
            if self._tick is None:
                self._tick = GroupCommitter(
                    self._commit_tick,
                    lambda started: max(1, len(started.lane[0])),
                    self.max_request_samples,
                    name="gpuscope-remote-tick",
                    linger_s=GROUP_LINGER_S,
                )
            return self._tick

    def _commit_tick(self, items: list[_Started]) -> list[AppendResult | StoreError]:
        """Store the batches started meanwhile: the ids another hub stored are duplicates, the
        others' telemetry goes in one request (each sent again alone should the TSDB refuse
        some of it, see :meth:`_send_group`), then their events, training records and ids in one
        meta-store transaction. A failure fails the batches it touched (their senders retry)."""
        ids = [s.batch.batch_id for s in items if s.batch.batch_id is not None]
        try:
            seen = self.meta.stored_ids(ids) if ids else set()
        except StoreError as exc:
            return [exc] * len(items)
        fresh = [s for s in items if s.batch.batch_id not in seen]
        sending = [s for s in fresh if s.lane[0]]
        failed: dict[int, StoreError] = {}
        outcomes = self._send_group([s.lane for s in sending]) if sending else []
        for s, outcome in zip(sending, outcomes, strict=True):
            if isinstance(outcome, StoreError):
                failed[id(s)] = outcome
            else:
                _refused(s.result, outcome)
        stored = [s for s in fresh if id(s) not in failed]
        rest = [_rest(s.batch) for s in stored]
        try:
            rests = self.meta.append_many(rest) if rest else []
        except StoreError as exc:
            failed.update((id(s), exc) for s in stored)
            stored, rests = [], []
        rest_of = {id(s): r for s, r in zip(stored, rests, strict=True)}
        out: list[AppendResult | StoreError] = []
        for s in items:
            if s.batch.batch_id in seen:
                self.counters.inc("store.duplicate_batches")
                out.append(AppendResult(duplicate=True))
            elif id(s) in failed:
                out.append(failed[id(s)])
            else:
                out.append(self._stored(s.result, rest_of[id(s)]))
        return out

    def _stored(self, result: AppendResult, rest: AppendResult) -> AppendResult:
        """A batch's outcome once its telemetry (``result``) and the rest (``rest``, the meta
        store's) are stored: the meta store's when another hub stored the id meanwhile (its
        telemetry is ours too), else both; counted."""
        if rest.duplicate:
            self.counters.inc("store.duplicate_batches")
            return rest
        result.events, result.training = rest.events, rest.training
        result.refused_samples += rest.refused_samples
        result.notes.extend(rest.notes[: max(0, MAX_NOTES - len(result.notes))])
        self.counters.inc("store.refused_entities", result.refused_entities)
        self.counters.inc("store.refused_samples", result.refused_samples)
        self.counters.inc("store.samples", result.samples)
        return result

    def append(self, batch: Batch) -> AppendResult:
        """Store a batch: telemetry acknowledged by the TSDB, then the rest in the meta store."""
        self._check_open()
        bid = batch.batch_id
        if bid is not None and self._claim(bid) is Claim.DUPLICATE:
            self.counters.inc("store.duplicate_batches")
            return AppendResult(duplicate=True)
        stored = False
        try:
            telemetry = self._preparer.prepare(Batch(batch.source, frames=batch.frames))
            # validate events and training now, so that a bad one refuses the batch before any write
            self._preparer.prepare(Batch(batch.source, events=batch.events, training=batch.training))
            self.columns.mark_persisted(telemetry.columns)  # no DDL here: names are series labels
            self.entities.mark_persisted(telemetry.entities)
            result = telemetry.result
            self._write(telemetry, result)
            result = self._stored(result, self.meta.append(_rest(batch)))
            stored = True
            return result
        finally:
            if bid is not None:
                self._ids.finish(bid, stored, time.time())

    def _claim(self, bid: str) -> Claim:
        """NEW when neither this hub nor the meta store (other hubs, earlier runs) has ``bid``."""
        if self._ids.claim(bid) is Claim.DUPLICATE:
            return Claim.DUPLICATE
        try:
            seen = self.meta.has_batch(bid)
        except BaseException:
            self._ids.finish(bid, False, time.time())
            raise
        if seen:
            self._ids.finish(bid, True, time.time())
            return Claim.DUPLICATE
        return Claim.NEW

    def _row(self, cols: tuple[int, ...], size: int, eid: int, code: int) -> _Row:
        """The series heads of one entity (and attribution) for the metric columns ``cols``, for
        samples of ``size`` bytes; cached, the oldest half dropped when the cache is full."""
        key = (cols, size, eid, code)
        row = self._heads.get(key)
        if row is not None:
            return row
        heads = np.empty(len(cols), dtype=object)
        refused: list[tuple[int, str]] = []
        for j, col in enumerate(cols):
            labels = self._labels_of(col, eid, code)
            if isinstance(labels, str):
                refused.append((j, labels))
            else:
                heads[j] = wire.series_head(labels, size)
        row = (heads, tuple(refused))
        with self._cache_lock:
            if key in self._heads:  # another append built it meanwhile
                return self._heads[key]
            if self._cached + len(cols) > self.label_cache_series:
                for old in list(itertools.islice(self._heads, len(self._heads) // 2 + 1)):
                    self._cached -= len(self._heads.pop(old)[0])
            self._heads[key] = row
            self._cached += len(cols)
        return row

    def _block(
        self, cols: tuple[int, ...], size: int, ent: npt.NDArray[Any], attr: npt.NDArray[Any]
    ) -> _Block:
        """The heads of a frame's rows (entities ``ent`` with attributions ``attr``) for the metric
        columns ``cols``, built from :meth:`_row` and cached, the oldest half dropped when the
        cache holds ``label_cache_series`` series."""
        key = (cols, size, ent.dtype.str.encode() + ent.tobytes(), attr.dtype.str.encode() + attr.tobytes())
        block = self._blocks.get(key)
        if block is not None:
            return block
        rows = [self._row(cols, size, e, a) for e, a in zip(ent.tolist(), attr.tolist(), strict=True)]
        heads = np.empty((len(rows), len(cols)), dtype=object)
        for i, (row, _) in enumerate(rows):
            heads[i] = row
        block = (heads, tuple((i, j, why) for i, (_, bad) in enumerate(rows) for j, why in bad))
        with self._cache_lock:
            if key in self._blocks:
                return self._blocks[key]
            if self._blocked + heads.size > self.label_cache_series:
                for old in list(itertools.islice(self._blocks, len(self._blocks) // 2 + 1)):
                    self._blocked -= self._blocks.pop(old)[0].size
            self._blocks[key] = block
            self._blocked += heads.size
        return block

    def _encode(
        self, prepared: Prepared, result: AppendResult
    ) -> tuple[list[bytes], list[bytes], npt.NDArray[np.int64], bool]:
        """Per sample to send, in time order: the head of its series, its ``samples`` field, and its
        entity id; and whether all have one timestamp (then any split keeps each series in time
        order)."""
        chunks = sorted(
            (
                (int(ts[0]), cols, ent, attr, values)
                for cols, block in prepared.blocks.items()
                for ts, ent, attr, values in zip(
                    block.ts, block.entity, block.attr, block.values, strict=True
                )
            ),
            key=lambda chunk: chunk[0],
        )
        heads: list[bytes] = []
        fields: list[bytes] = []
        entities: list[npt.NDArray[np.int64]] = []
        refused: dict[str, int] = {}
        for t, cols, ent, attr, values in chunks:
            size = wire.sample_size(t)
            block, bad = self._block(cols, size, ent, attr)
            present = ~np.isnan(values)
            for i, j, why in bad:
                if present[i, j]:
                    present[i, j] = False
                    refused[why] = refused.get(why, 0) + 1
            heads += block[present].tolist()
            fields += wire.samples(t, values[present])
            entities.append(np.broadcast_to(ent.astype(np.int64)[:, None], present.shape)[present])
        for why, n in refused.items():
            result.samples -= n
            result.refused_samples += n
            _note(result, f"refused {n} sample(s): {why}")
        one_time = len({chunk[0] for chunk in chunks}) <= 1
        return heads, fields, np.concatenate(entities) if entities else np.empty(0, np.int64), one_time

    def _labels_of(self, col: int, eid: int, code: int) -> list[tuple[str, str]] | str:
        """The wire labels of a series, or why it cannot be sent."""
        name = self.columns.name(col)
        labels = {**self.entities.labels(eid)}
        for k, v in zip(ATTR_COLUMNS, self.entities.attr_values(code), strict=True):
            if v is not None:
                labels[k] = v
        if not METRIC_NAME_RE.fullmatch(name):
            return f"metric name {name!r} is not a Prometheus name"
        reserved = [k for k in labels if k.startswith("__")]
        if reserved:
            return f"label {reserved[0]!r} is reserved"
        for k, v in labels.items():
            try:
                k.encode(), v.encode()
            except UnicodeEncodeError:  # a lone surrogate: protobuf strings are UTF-8
                return f"label {k!r} is not valid UTF-8"
        # an empty value means "no such label" to a TSDB: leave it out rather than send it
        return [("__name__", name), *((k, v) for k, v in labels.items() if v != "")]

    def _write(self, prepared: Prepared, result: AppendResult) -> None:
        """Send the telemetry in requests of at most ``max_request_samples``. A batch of more goes
        in ``parallel_requests`` lanes sent at the same time, each sent one request after the
        other. A TSDB may refuse a series' sample older than one it already has, so when the batch
        spans several times a lane holds the samples of a share of the entities, in time order,
        and a series is in one lane only. Every lane is sent (and refusals counted) before a
        failure is raised."""
        parts = self._lanes(prepared, result)
        if len(parts) == 1 and self.group_writes and len(parts[0][0]) <= self.max_request_samples:
            outcomes = [self._grouped_writer().submit(parts[0]).result()]
        elif len(parts) <= 1:
            outcomes = [o for part in parts for o in self._send_lane(*part)]
        else:
            with self._lock:
                self._check_open()
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.parallel_requests, "gpuscope-remote-write")
                pool = self._pool
            outcomes = [o for done in pool.map(lambda part: self._send_lane(*part), parts) for o in done]
        for outcome in outcomes:
            if not isinstance(outcome, StoreError):
                _refused(result, outcome)
        for outcome in outcomes:
            if isinstance(outcome, StoreError):
                raise outcome

    def _lanes(self, prepared: Prepared, result: AppendResult) -> list[tuple[list[bytes], list[bytes]]]:
        """The heads and sample fields of each lane (see _write): one lane unless the batch holds
        more than one request's samples; consecutive shares when it holds one time only."""
        heads, fields, entities, one_time = self._encode(prepared, result)
        lanes = self.parallel_requests
        if len(heads) <= self.max_request_samples or lanes <= 1:
            return [(heads, fields)] if heads else []
        if one_time:
            share = -(-len(heads) // lanes)
            return [(heads[a : a + share], fields[a : a + share]) for a in range(0, len(heads), share)]
        lane = entities % lanes
        order = np.argsort(lane, kind="stable")
        bounds = np.searchsorted(lane[order], np.arange(lanes + 1)).tolist()
        head_arr, field_arr = _objects(heads)[order], _objects(fields)[order]
        return [
            (head_arr[a:b].tolist(), field_arr[a:b].tolist()) for a, b in itertools.pairwise(bounds) if b > a
        ]

    def _grouped_writer(self) -> GroupCommitter[_Lane, _Outcome]:
        with self._lock:
            self._check_open()
            if self._writer is None:
                self._writer = GroupCommitter(
                    self._send_group,
                    lambda lane: len(lane[0]),
                    self.max_request_samples,
                    name="gpuscope-remote-writer",
                    linger_s=GROUP_LINGER_S,
                )
            return self._writer

    def _send_group(self, lanes: list[_Lane]) -> list[_Outcome]:
        """One request for the samples of several appends (each at most one request's worth). When
        the TSDB refuses some of them, each append's samples are sent again alone, so that the
        refusal is counted against the batch it belongs to (what it took it keeps once)."""
        if len(lanes) > 1:
            self.counters.inc("store.remote_write_grouped", len(lanes))
        heads = [h for lane in lanes for h in lane[0]] if len(lanes) > 1 else lanes[0][0]
        fields = [f for lane in lanes for f in lane[1]] if len(lanes) > 1 else lanes[0][1]
        outcome = self._send_once(heads, fields)
        if isinstance(outcome, tuple) and len(lanes) > 1:
            return [self._send_once(*lane) for lane in lanes]
        return [outcome] * len(lanes)

    def _send_once(self, heads: list[bytes], fields: list[bytes]) -> _Outcome:
        try:
            return self._send(heads, fields)
        except StoreError as exc:
            return exc

    def _send_lane(
        self, heads: list[bytes], fields: list[bytes]
    ) -> list[tuple[int, str] | StoreError | None]:
        """Requests of at most ``max_request_samples`` one after the other, up to the first that
        fails (the batch is then retried whole)."""
        step = self.max_request_samples
        outcomes: list[tuple[int, str] | StoreError | None] = []
        for a in range(0, len(heads), step):
            try:
                outcomes.append(self._send(heads[a : a + step], fields[a : a + step]))
            except StoreError as exc:
                outcomes.append(exc)
                break
        return outcomes

    def _send(self, heads: list[bytes], fields: list[bytes]) -> tuple[int, str] | None:
        """POST one WriteRequest; retry what may succeed later, until ``retry_s`` has passed. The
        number of samples the TSDB refused and its answer, or None when it took them."""
        body = wire.write_request(heads, fields)
        n = len(heads)
        url = self.remote_write_url
        deadline = time.monotonic() + self.retry_s
        delay, tries = 0.05, 0
        while True:
            tries += 1
            self.counters.inc("store.remote_write_requests")
            try:
                r = self._client.post(url, content=body, headers=wire.HEADERS)
                status, why = r.status_code, f"{r.status_code} {r.text.strip()[:300]}"
            except httpx.HTTPError as exc:
                status, why = 0, f"{type(exc).__name__}: {exc}"
            if 200 <= status < 300:
                return None
            if 400 <= status < 500 and status not in (408, 429):
                self.counters.inc("store.remote_refused_samples", n)
                return n, why
            if time.monotonic() + delay > deadline:
                self.counters.inc("store.remote_write_failures")
                raise StoreError(
                    f"remote write to {redact(url)} failed after {tries} tries in {self.retry_s:g} s: {why}"
                )
            self.counters.inc("store.remote_write_retries")
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    # ------------------------------------------------------------------ telemetry reads

    def series(
        self, metric: str, labels: Labels, start: float, end: float, points: int = 300
    ) -> list[SeriesPoint]:
        """Mean of all samples ``labels`` select per bucket, at most ``points`` buckets; a bucket
        ``[s, s + step)`` is evaluated at ``s + step - 1 ms`` over ``[step]`` (left-open windows)."""
        self._check_open()
        if points < 1:
            raise ValueError(f"points must be at least 1, got {points}")
        a, b = ms_range(start, end)
        if not METRIC_NAME_RE.fullmatch(metric) or not all(_selectable(k) for k in labels):
            return []  # no such series can exist
        step = max(1, ceil_div(b - a, min(points, MAX_POINTS)))
        n = ceil_div(b - a, step)
        sel = selector(metric, labels)
        # a window of step ms ending at s + step - 1 holds exactly [s, s + step) if it is left-open
        # (VictoriaMetrics, Prometheus 3); Prometheus 2 includes its left edge: one ms less there
        win = duration(step - 1 if self._left_closed() else step)
        query = f"sum(sum_over_time({sel}[{win}])) / sum(count_over_time({sel}[{win}]))"
        rows = self.promql.range(query, (a + step - 1) / 1000, (a + n * step - 1) / 1000, step / 1000)
        out = [
            SeriesPoint((round(float(t) * 1000) - step + 1) / 1000, float(v))
            for row in rows[:1]
            for t, v in row["values"]
        ]
        return out

    def _left_closed(self) -> bool:
        """Whether range selectors include their left edge, asked once: a 2 s window over a
        1 s subquery grid holds 3 points if so, 2 if not."""
        if self._closed_windows is None:
            rows = self.promql.instant("count_over_time(vector(1)[2s:1s])", 1000.0)
            self._closed_windows = bool(rows) and float(rows[0]["value"][1]) > 2
        return self._closed_windows

    def aggregate(self, metric: str, by: str, start: float, end: float) -> list[dict[str, Any]]:
        """Mean, min, max and count per value of ``by`` over [start, end]; series without it are
        left out."""
        self._check_open()
        a, b = ms_range(start, end)
        if not METRIC_NAME_RE.fullmatch(metric) or not _selectable(by):
            return []
        width = b - a - 1 if self._left_closed() else b - a  # see series
        rng = f"{selector(metric, {})}[{duration(width)}]"
        at = (b - 1) / 1000
        parts: dict[str, dict[str, float]] = {}
        for key, outer in (("sum", "sum"), ("count", "sum"), ("min", "min"), ("max", "max")):
            for row in self.promql.instant(f"{outer} by ({by}) ({key}_over_time({rng}))", at):
                group = row["metric"].get(by, "")
                if group:
                    parts.setdefault(group, {})[key] = float(row["value"][1])
        return [
            {
                "group": g,
                "mean": p["sum"] / p["count"],
                "min": p["min"],
                "max": p["max"],
                "count": int(p["count"]),
            }
            for g, p in sorted(parts.items())
            if p.get("count")
        ]

    def snapshot(
        self, metrics: list[str] | None = None, max_age: float | None = None
    ) -> list[dict[str, Any]]:
        """Newest value of each metric per entity within ``max_age`` (default ``snapshot_window_s``)
        of now. Series of one entity under several attribution labels (a GPU that changed jobs)
        merge into one row whose attribution is the newest."""
        self._check_open()
        at = time.time()
        window = self.snapshot_window_s if max_age is None else max_age
        win = duration(round(window * 1000))
        names = metrics if metrics is not None else self.promql.label_values("__name__", at - window, at)
        rows: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        wanted = [n for n in dict.fromkeys(names) if METRIC_NAME_RE.fullmatch(n)]

        def fetch(name: str) -> tuple[dict[tuple[tuple[str, str], ...], float], list[dict[str, Any]]]:
            # one metric per query: PromQL functions drop the name, so several would collide
            sel = selector(name, {})
            stamps = self._last_times(sel, win, window, at)
            return stamps, self.promql.instant(f"last_over_time({sel}[{win}])", at)

        if self._tlast is None and wanted:
            self._last_times(selector(wanted[0], {}), win, window, at)  # learn the dialect once
        with ThreadPoolExecutor(max_workers=min(8, len(wanted) or 1)) as pool:
            answers = list(pool.map(fetch, wanted))
        for name, (stamps, values) in zip(wanted, answers, strict=True):
            for r in values:
                labels = {k: v for k, v in r["metric"].items() if k != "__name__"}
                key = tuple(sorted((k, v) for k, v in labels.items() if k not in ATTRIBUTION_LABELS))
                ts = stamps.get(tuple(sorted(labels.items())), float(r["value"][0]))
                row = rows.setdefault(key, {"labels": labels, "ts": ts, "values": {}, "_at": {}})
                if ts >= row["_at"].get(name, -math.inf):
                    row["values"][name] = float(r["value"][1])
                    row["_at"][name] = ts
                if ts >= row["ts"]:
                    row["ts"], row["labels"] = ts, labels
        return [{"labels": r["labels"], "ts": r["ts"], "values": r["values"]} for r in rows.values()]

    def _last_times(
        self, sel: str, win: str, window: float, at: float
    ) -> dict[tuple[tuple[str, str], ...], float]:
        """Time of each series' newest sample: MetricsQL's ``tlast_over_time`` where the TSDB has it,
        else PromQL's ``timestamp()`` (exact within the 5-minute lookback) over a subquery whose
        resolution bounds the error for older samples."""
        if self._tlast is not False:
            try:
                rows = self.promql.instant(f"tlast_over_time({sel}[{win}])", at)
                self._tlast = True
            except StoreError:
                if self._tlast:
                    raise
                self._tlast = False
        if self._tlast is False:
            res = max(1, min(60, round(window / 60)))
            rows = self.promql.instant(f"max_over_time(timestamp({sel})[{win}:{res}s])", at)
            for r in self.promql.instant(f"timestamp({sel})", at):
                rows.append(r)  # exact, and later in the list: wins below
        return {
            tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")): float(r["value"][1])
            for r in rows
        }

    def replay(
        self,
        start: float,
        end: float,
        nodes: Iterable[str] | None = None,
        jobs: Iterable[str] | None = None,
    ) -> Iterator[Batch]:
        """The raw samples of [start, end] (a range selector read at a chunk's end returns them with
        their own timestamps, not resampled to a step) of the known signals and of the metrics
        this process has seen, with events and training records from the meta store.

        Telemetry is read and turned into batches ``replay_chunk_s`` at a time: a takeover's
        warm-up reads up to 15 minutes of every node of the shards taken, millions of samples at
        hundreds of nodes, and all of them at once as JSON, rows and frames took gigabytes. The
        batches are the same as one read of the whole window (every timestamp falls in one chunk)."""
        self._check_open()
        check_window(start, end)
        scope = Scope.of(nodes, jobs)
        a, b = ms_range(start, end)
        names = sorted({*ALL_METRICS, *(n for n in self.columns.names() if METRIC_NAME_RE.fullmatch(n))})
        matchers = [""] if scope.everything else []
        for label, values in (("node", scope.nodes), ("job", scope.jobs)):
            if values:
                matchers.append(f", {label}=~{quote('|'.join(re.escape(v) for v in sorted(values)))}")
        events = self.meta.events(start, end, limit=REPLAY_LIMIT)
        if scope.everything:
            found = self._jobs_in(names, a, b) | {e.labels.get("job") for e in events}
            wanted: Iterable[str] = {j for j in found if j}
        else:
            wanted = scope.jobs or ()
        training = sorted(
            (
                rec
                for job in sorted(wanted)
                for rec in self.meta.training(job, start, end, limit=REPLAY_LIMIT)
            ),
            key=lambda rec: rec.ts,
        )
        step = max(1, round(self.replay_chunk_s * 1000))
        edges = list(range(a, b, step))[1:]
        if edges and b - edges[-1] < 2:  # a window of 1 ms may not be expressible: join it
            edges.pop()
        chunks = list(itertools.pairwise([a, *edges, b]))
        return self._replay_chunks(names, matchers, chunks, events, training, scope)

    def _replay_chunks(
        self,
        names: list[str],
        matchers: list[str],
        chunks: list[tuple[int, int]],
        events: list[Event],
        training: list[TrainingRecord],
        scope: Scope,
    ) -> Iterator[Batch]:
        """The batches of each chunk [a, b) ms in turn (see replay)."""
        # events and training records in the chunk of their ms, as the telemetry rows are
        event_ms = [to_ms(e.ts) for e in events]
        train_ms = [to_ms(r.ts) for r in training]
        event_at = [bisect.bisect_left(event_ms, cb) for _, cb in chunks[:-1]]
        train_at = [bisect.bisect_left(train_ms, cb) for _, cb in chunks[:-1]]
        event_cuts = list(itertools.pairwise([0, *event_at, len(events)]))
        train_cuts = list(itertools.pairwise([0, *train_at, len(training)]))
        for (ca, cb), (ea, eb), (ta, tb) in zip(chunks, event_cuts, train_cuts, strict=True):
            rows = self._replay_rows(names, matchers, ca, cb)
            yield from batches(rows, events[ea:eb], training[ta:tb], scope)

    def _replay_rows(self, names: list[str], matchers: list[str], a: int, b: int) -> list[Row]:
        """The telemetry rows of [a, b) ms, in time order."""
        win = duration(b - a - 1 if self._left_closed() else b - a)  # see series
        series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for extra in matchers:
            query = f"{names_selector(names)[:-1]}{extra}}}[{win}]"
            for r in self.promql.instant(query, (b - 1) / 1000):
                series[tuple(sorted(r["metric"].items()))] = r
        rows: dict[tuple[float, tuple[tuple[str, str], ...]], Row] = {}
        for key, r in series.items():
            labels = {k: v for k, v in key if k != "__name__"}
            entity = tuple(sorted(labels.items()))
            name = r["metric"]["__name__"]
            for t, v in r.get("values") or []:
                ts = round(float(t) * 1000) / 1000
                rows.setdefault((ts, entity), (ts, labels, {}))[2][name] = float(v)
        return sorted(rows.values(), key=lambda row: row[0])

    def _jobs_in(self, names: list[str], a: int, b: int) -> set[str]:
        """The ``job`` labels of the series of ``names`` with samples in [a, b) ms."""
        win = duration(b - a - 1 if self._left_closed() else b - a)
        query = f"count by (job) (count_over_time({names_selector(names)}[{win}]))"
        return {str(r["metric"].get("job", "")) for r in self.promql.instant(query, (b - 1) / 1000)}

    def rollup(self, now: float) -> dict[str, int]:
        """Nothing to do: the TSDB downsamples (or queries raw data fast enough)."""
        return {}

    def stats(self) -> dict[str, Any]:
        return {
            "backend": "prometheus",
            "remote_write_url": redact(self.remote_write_url),
            "query_url": redact(self.query_url),
            "entities": len(self.entities),
            "metrics": len(self.columns),
            "counters": {k: v for k, v in self.counters.snapshot().items() if k.startswith("store.")},
            "meta": self.meta.stats(),
        }

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
            writer, self._writer = self._writer, None
            tick, self._tick = self._tick, None
        if tick is not None:
            tick.close()  # what it holds is stored first
        if pool is not None:
            pool.shutdown()
        if writer is not None:
            writer.close()
        self._client.close()
        self.meta.close()

    def __enter__(self) -> PromStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rest(batch: Batch) -> Batch:
    """What of a batch the meta store keeps: its events, training records and id."""
    return Batch(batch.source, events=batch.events, training=batch.training, batch_id=batch.batch_id)


def _refused(result: AppendResult, outcome: tuple[int, str] | None) -> None:
    """Count what the TSDB refused of a batch's samples (``outcome`` of its request)."""
    if outcome is not None:
        n, why = outcome
        result.samples -= n
        result.refused_samples += n
        _note(result, f"the TSDB refused (some of) {n} sample(s): {why}")


def _objects(items: list[bytes]) -> npt.NDArray[np.object_]:
    """A list as a 1-d object array (``np.array`` would make a bytes-string array of it)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _selectable(key: str) -> bool:
    """A label a selector may name (anything else cannot match a stored series)."""
    return bool(LABEL_NAME_RE.fullmatch(key)) and not key.startswith("__")


__all__ = ["PromStore", "redact"]
