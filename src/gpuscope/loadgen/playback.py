"""The load generator's traffic, pre-encoded: a ring of simulated ticks replayed, faults played live.

Simulating and encoding 1,024 nodes every second cost the generator more CPU than the hub got, so
the healthy fleet is simulated once, before the run, for ``ring`` ticks and encoded as binary
frames (:mod:`gpuscope.ingest.frame`). During the run each tick replays one of those frames per
node with only its timestamps, batch id and counters patched: counters (``*_total``) go on
rising by what they rose over the ring, so a wrap-around is never a counter reset. A counter that
rose over the ring but not on every tick (an error count: a corrected ECC error, a PCIe replay, an
NVLink CRC error) is held at its end-of-ring value after the first turn: replayed, one healthy GPU's
single error would recur every turn, a steady rate of errors no healthy GPU has. The training
SDKs' batches (step records and heartbeats, a few per rank) are re-encoded with their times and
steps moved on. The jobs that faults touch are not replayed: a second simulator plays just those
jobs live, with the faults, on node names mapped back into the fleet, so a fault's values, events
and silences are the simulator's.

A sender that a fault kills stops knocking, as a dead agent or rank does: :attr:`Playback.deaths`
names it and when it dies (a ``node_down``'s node; a ``rank_dropout``'s rank), and the run drops
what it still had queued. A job's ranks are one stream of the generator (one request a tick for
the whole job, to keep the request rate a real fleet's nodes make); the rank a ``rank_dropout``
kills is split off into a stream of its own (``sdk:<job>#<rank>``, naming ``job=,rank=`` as a real
rank's SDK does), so that its death is silence on the wire and not only in the job's data.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice, pairwise
from typing import Any

import numpy as np

from gpuscope.ingest.frame import Encoded, decode_frame, encode_frame, encode_parts, head
from gpuscope.ingest.overload import urgent_part
from gpuscope.loadgen.traffic import Outgoing, describe, parse_doc
from gpuscope.model import Batch, Event, Frame, Labels, TrainingRecord
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import Scenario

COUNTER_SUFFIX = "_total"
_F64 = struct.Struct("<d")


@dataclass(frozen=True, slots=True)
class _Encoded:
    """One node's batch of one ring tick: its frame body after the ids, and where to patch it."""

    rest: bytes
    ts: tuple[float, ...]
    ts_offsets: tuple[int, ...]
    value_offsets: tuple[int, ...]


@dataclass(slots=True)
class _NodeStream:
    """A node's ring: its encoded ticks and, per frame, what its counters rise by per ring turn."""

    source: str
    ticks: list[_Encoded]
    spans: list[Span | None]
    holds: list[Hold | None]  # per frame, like spans
    rows: int
    samples: int


@dataclass(slots=True)
class _SdkStream:
    """An SDK process's ring: its batches, re-encoded each tick with times and steps moved on."""

    source: str
    slots: dict[int, Batch]  # ring tick -> its batch, for the ticks it sent one
    steps: int  # how far steps advance over one ring turn
    spans: dict[tuple[Any, ...], Span]
    holds: dict[tuple[Any, ...], Hold]
    #: event kinds sent in more than one tick of the ring (heartbeats); the others (job_started)
    #: happened once, and are not sent again on later turns
    recurring: frozenset[str]
    prelude: list[Event]  # sent once, before the first tick's own events


def rank_stream(job: str, rank: int) -> str:
    """The stream of a rank sent on its own (:func:`gpuscope.loadgen.sender.sender_line` names it
    ``job=<job>,rank=<rank>``)."""
    return f"sdk:{job}#{rank}"


Span = np.ndarray[Any, np.dtype[np.float64]]
Hold = tuple[np.ndarray[Any, np.dtype[np.intp]], Span]  # flat positions in a frame's values, held values


def _frame_key(f: Frame) -> tuple[Any, ...]:
    return (tuple(f.metrics), tuple(tuple(e.items()) for e in f.entities))


def _counter_spans(slots: dict[int, Batch], ring: int) -> dict[tuple[Any, ...], Span]:
    """Per frame layout, what its counters rise by over one turn of the ring (zero elsewhere)."""
    first: dict[tuple[Any, ...], tuple[int, Frame]] = {}
    last: dict[tuple[Any, ...], tuple[int, Frame]] = {}
    for k, b in sorted(slots.items()):
        for f in b.frames:
            key = _frame_key(f)
            first.setdefault(key, (k, f))
            last[key] = (k, f)
    spans: dict[tuple[Any, ...], Span] = {}
    for key, (k0, f) in first.items():
        cols = [j for j, m in enumerate(f.metrics) if m.endswith(COUNTER_SUFFIX)]
        k1, g = last[key]
        if not cols or k1 == k0:
            continue
        span = np.zeros_like(f.values)
        # the rise per tick seen, over the whole turn: the value after the wrap is one tick on
        rise = (g.values[:, cols] - f.values[:, cols]) * (ring / (k1 - k0))
        span[:, cols] = np.nan_to_num(np.maximum(rise, 0.0))
        spans[key] = span
    return spans


class _Rises:
    """Per frame layout, how often each value rose from one ring tick to the next."""

    def __init__(self) -> None:
        self.rose: dict[tuple[Any, ...], np.ndarray[Any, np.dtype[np.int64]]] = {}
        self.steps: Counter[tuple[Any, ...]] = Counter()

    def add(self, prev: Batch, b: Batch) -> None:
        before = {_frame_key(f): f for f in prev.frames}
        for f in b.frames:
            key = _frame_key(f)
            p = before.get(key)
            if p is None or p.values.shape != f.values.shape:
                continue
            up = (f.values > p.values).astype(np.int64)
            self.rose[key] = self.rose[key] + up if key in self.rose else up
            self.steps[key] += 1

    def holds(self, first: Batch, last: Batch) -> dict[tuple[Any, ...], Hold]:
        """The counters that rose from ``first`` to ``last`` but not on every step between: held."""
        start = {_frame_key(f): f for f in first.frames}
        out: dict[tuple[Any, ...], Hold] = {}
        for g in last.frames:
            key = _frame_key(g)
            f = start.get(key)
            rose = self.rose.get(key)
            if f is None or rose is None or f.values.shape != g.values.shape:
                continue
            counter = np.array([m.endswith(COUNTER_SUFFIX) for m in g.metrics])
            held = counter[None, :] & (g.values > f.values) & (rose < self.steps[key])
            if held.any():
                at = np.flatnonzero(held)
                out[key] = (at, g.values.reshape(-1)[at].astype(np.float64))
        return out


def _unspanned(spans: dict[tuple[Any, ...], Span], holds: dict[tuple[Any, ...], Hold]) -> None:
    """Held counters do not rise from turn to turn."""
    for key, (at, _) in holds.items():
        if key in spans:
            span = spans[key].copy()
            span.reshape(-1)[at] = 0.0
            spans[key] = span


def _sdk_stream(source: str, slots: dict[int, Batch], ring: int, prelude: list[Event]) -> _SdkStream:
    ticks_of = Counter(kind for b in slots.values() for kind in {e.kind for e in b.events})
    recurring = frozenset(kind for kind, n in ticks_of.items() if n > 1)
    once = [e for e in prelude if e.kind not in recurring]
    steps = _steps(list(slots.values()))
    spans = _counter_spans(slots, ring)
    holds: dict[tuple[Any, ...], Hold] = {}
    if len(slots) > 1:
        rises = _Rises()
        ordered = [slots[k] for k in sorted(slots)]
        for prev, b in pairwise(ordered):
            rises.add(prev, b)
        holds = rises.holds(ordered[0], ordered[-1])
        _unspanned(spans, holds)
    return _SdkStream(source, slots, steps, spans, holds, recurring, once)


def _steps(batches: list[Batch]) -> int:
    seen = [t.step for b in batches for t in b.training] + [
        int(e.data["step"]) for b in batches for e in b.events if isinstance(e.data.get("step"), int)
    ]
    return max(seen) - min(seen) + 1 if seen else 0


def _moved(batch: Batch, shift: float, turn: int, stream: _SdkStream, batch_id: str) -> Batch:
    """``batch`` ``shift`` seconds and ``turn`` turns of the ring later."""
    steps = turn * stream.steps

    def values(f: Frame) -> Span:
        if not turn:
            return f.values
        key = _frame_key(f)
        span = stream.spans.get(key)
        out = f.values.copy() if span is None else f.values + turn * span
        hold = stream.holds.get(key)
        if hold is not None:
            out.reshape(-1)[hold[0]] = hold[1]
        return out

    return Batch(
        source=batch.source,
        frames=[Frame(f.ts + shift, f.metrics, f.entities, values(f)) for f in batch.frames],
        events=[
            Event(e.ts + shift, e.kind, e.labels, _stepped(e.data, steps) if steps else e.data)
            for e in batch.events
            if not turn or e.kind in stream.recurring
        ],
        training=[
            TrainingRecord(t.ts + shift, t.job, t.rank, t.step + steps, t.metrics, t.labels)
            for t in batch.training
        ],
        batch_id=batch_id,
    )


def _stepped(data: dict[str, Any], steps: int) -> dict[str, Any]:
    step = data.get("step")
    return {**data, "step": step + steps} if isinstance(step, int) else data


def _touched(doc: dict[str, Any]) -> set[str]:
    """Names of the jobs the scenario's faults touch (a node's fault touches the job on it)."""
    jobs: set[str] = set()
    for f in doc["faults"]:
        target = f.get("target", {})
        for job in doc["jobs"]:
            if job["name"] == target.get("job") or target.get("node") in job["nodes"]:
                jobs.add(job["name"])
    return jobs


def _live_doc(doc: dict[str, Any], jobs: set[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The scenario of just ``jobs`` and their faults, on nodes node-0.. of a smaller cluster;
    with the map from those node names back to the fleet's."""
    back: dict[str, str] = {}
    there: dict[str, str] = {}
    live_jobs = []
    for job in doc["jobs"]:
        if job["name"] not in jobs:
            continue
        nodes = []
        for node in job["nodes"]:
            if node not in there:
                there[node] = f"node-{len(there)}"
                back[there[node]] = node
            nodes.append(there[node])
        live_jobs.append({**job, "nodes": nodes})
    faults = []
    for f in doc["faults"]:
        target = dict(f.get("target", {}))
        if "node" in target:
            if target["node"] not in there:
                raise ValueError(f"fault {f}: {target['node']} runs no job of the scenario")
            target["node"] = there[target["node"]]
        faults.append({**f, "target": target})
    live = {**doc, "name": f"{doc['name']}-live", "jobs": live_jobs, "faults": faults}
    live["cluster"] = {**doc["cluster"], "nodes": len(there)}
    return live, back


def _renamed_labels(labels: Labels, back: dict[str, str], uuids: dict[tuple[str, str], str]) -> Labels:
    node = labels.get("node")
    if node is None or node not in back:
        return labels
    out = {**labels, "node": back[node]}
    uuid = uuids.get((out["node"], out.get("gpu", "")))
    if "uuid" in out and uuid is not None:
        out["uuid"] = uuid  # the fleet's GPU on that node, not the small cluster's
    return out


def _renamed_data(obj: Any, back: dict[str, str]) -> Any:
    """Node names inside event data (a job's placement) mapped back into the fleet."""
    if isinstance(obj, str):
        return back.get(obj, obj)
    if isinstance(obj, list):
        return [_renamed_data(x, back) for x in obj]
    if isinstance(obj, dict):
        return {k: _renamed_data(v, back) for k, v in obj.items()}
    return obj


def _renamed(batch: Batch, back: dict[str, str], uuids: dict[tuple[str, str], str]) -> Batch:
    def labels(x: Labels) -> Labels:
        return _renamed_labels(x, back, uuids)

    source = back.get(batch.source, batch.source)
    return Batch(
        source=source,
        frames=[Frame(f.ts, f.metrics, [labels(e) for e in f.entities], f.values) for f in batch.frames],
        events=[Event(e.ts, e.kind, labels(e.labels), _renamed_data(e.data, back)) for e in batch.events],
        training=[
            TrainingRecord(t.ts, t.job, t.rank, t.step, t.metrics, labels(t.labels)) for t in batch.training
        ],
        batch_id=f"{source}:{(batch.batch_id or '').rpartition(':')[2]}",
    )


class Playback:
    """Every tick's outgoing batches: the healthy fleet from a pre-encoded ring, faulty jobs live.

    Build it before the run (it simulates ``ring`` ticks of the fleet), then iterate :meth:`ticks`.
    """

    def __init__(self, doc: dict[str, Any], ring: int = 30, warmup: int = 60, urgent: bool = True) -> None:
        if ring < 2 or warmup < 0:
            raise ValueError(f"ring must hold at least 2 ticks and warmup none or more, got {ring}, {warmup}")
        self.doc = doc
        #: send a batch's news (a hard fault's events) ahead of the spool, marked urgent
        self.urgent = urgent
        self.scenario: Scenario = parse_doc(doc)
        self.interval = float(doc["interval"])
        touched = _touched(doc)
        #: sender -> seconds into the run at which a fault kills it (it sends nothing from then)
        self.deaths: dict[str, float] = {}
        #: (job, rank) of each rank sent as a stream of its own
        self._own: set[tuple[str, int]] = set()
        for f in doc["faults"]:
            target = f.get("target", {})
            if f["kind"] == "node_down" and "node" in target:
                self.deaths[str(target["node"])] = float(f["at"])
            elif f["kind"] == "rank_dropout" and "job" in target and "rank" in target:
                job, rank = str(target["job"]), int(target["rank"])
                self._own.add((job, rank))
                self.deaths[rank_stream(job, rank)] = float(f["at"])
        live_doc, self._back = _live_doc(doc, touched)
        self._live: Scenario | None = parse_doc(live_doc) if live_doc["jobs"] else None
        skip = set(self._back.values()) | {f"sdk:{j}" for j in touched}
        # a run within the ring plays the scenario's own ticks; a longer one replays a scenario
        # that goes on well past the ring, so that no job ends inside it (a service announces its
        # end ahead of time, and a job_ended would repeat every turn)
        length = warmup * self.interval + doc["duration"]
        if doc["duration"] > ring * self.interval:
            length += ring * self.interval + 600
        healthy = parse_doc({**doc, "faults": [], "duration": length})
        self.ring = ring
        # the ring starts after the jobs' start-up, whose low utilisation would otherwise return
        # every turn; what the start-up announced once (job_started) goes out on the first tick
        self._t0 = warmup * self.interval
        sim = Simulator(healthy, t0=0.0).ticks()
        prelude: dict[str, list[Event]] = {}
        for tick in islice(sim, warmup):
            for b in [*tick.node_batches.values(), *tick.sdk_batches]:
                prelude.setdefault(b.source, []).extend(b.events)
        # node batches are encoded as they come (only the first and last of each node are kept
        # as objects, for its counters), which keeps the generator's memory to the encoded ring
        encoded: dict[str, dict[int, _Encoded]] = {}
        ends: dict[str, dict[int, Batch]] = {}  # a node's first and last batch of the ring
        slow: set[str] = set()  # layout changes within the ring, or events: re-encoded each tick
        self._uuids: dict[tuple[str, str], str] = {}
        sdks: dict[str, dict[int, Batch]] = {}
        rises: dict[str, _Rises] = {}
        for j, tick in enumerate(islice(sim, ring)):
            for b in tick.node_batches.values():
                seen = ends.setdefault(b.source, {})
                if not seen:
                    for f in b.frames:
                        for e in f.entities:
                            if "uuid" in e and "node" in e:
                                self._uuids[(e["node"], e.get("gpu", ""))] = e["uuid"]
                if b.source in skip:
                    continue
                first = seen[min(seen)] if seen else b
                if (
                    b.events
                    or b.training
                    or [(f.metrics, f.values.shape) for f in b.frames]
                    != [(f.metrics, f.values.shape) for f in first.frames]
                ):
                    slow.add(b.source)
                if seen:
                    rises.setdefault(b.source, _Rises()).add(seen[max(seen)], b)
                seen.update({min(seen, default=j): first, j: b})
                if len(seen) > 2:
                    del seen[sorted(seen)[1]]
                parts = encode_parts(b)
                encoded.setdefault(b.source, {})[j] = _Encoded(
                    parts.rest, tuple(f.ts for f in b.frames), parts.ts_offsets, parts.value_offsets
                )
            for b in tick.sdk_batches:
                sdks.setdefault(b.source, {})[j] = b
        self._templates: dict[str, tuple[list[tuple[list[str], list[Labels]]], Encoded]] = {}
        self._nodes: list[_NodeStream] = []
        self._sdks: list[_SdkStream] = []
        for source, slots in encoded.items():
            if len(slots) != ring or source in slow or prelude.get(source):
                # read back from the frames: the same batches, as objects to re-encode each tick
                batches = {k: decode_frame(head(source, None) + e.rest) for k, e in slots.items()}
                self._sdks.append(_sdk_stream(source, batches, ring, prelude.get(source, [])))
                continue
            first_batch = ends[source][0]
            shape = describe(first_batch, b"")
            spans = _counter_spans(ends[source], ring)
            holds = rises[source].holds(first_batch, ends[source][max(ends[source])])
            _unspanned(spans, holds)
            keys = [_frame_key(f) for f in first_batch.frames]
            ticks = [slots[k] for k in range(ring)]
            self._nodes.append(
                _NodeStream(
                    source,
                    ticks,
                    [spans.get(k) for k in keys],
                    [holds.get(k) for k in keys],
                    shape.rows,
                    shape.samples,
                )
            )
        self._sdks.extend(
            _sdk_stream(s, slots, ring, prelude.get(s, [])) for s, slots in sdks.items() if s not in skip
        )
        quiet = set(prelude) - set(ends) - set(sdks) - skip  # sent in the start-up only
        self._sdks.extend(_sdk_stream(s, {}, ring, prelude[s]) for s in sorted(quiet) if prelude[s])

    @property
    def replayed(self) -> int:
        """Senders replayed from the ring (the rest are played live)."""
        return len(self._nodes) + len(self._sdks)

    def ticks(self, t0: float) -> Iterator[tuple[float, list[Outgoing]]]:
        """Per sampling interval: its wall time (``t0`` + simulated seconds) and every batch due then."""
        live = iter(Simulator(self._live, t0=t0).ticks()) if self._live is not None else None
        n = int(self.scenario.duration / self.interval + 1e-9)
        for k in range(n):
            t = (k + 1) * self.interval
            out = self._replay(k, t0, t0 + t)
            if live is not None:
                tick = next(live)
                for b in [*tick.node_batches.values(), *tick.sdk_batches]:
                    for part in self._own_ranks(_renamed(b, self._back, self._uuids)):
                        out.extend(self._outgoing(part, self._live_body))
            yield t0 + t, out

    def _own_ranks(self, b: Batch) -> list[Batch]:
        """``b``, with the records of each rank sent as a stream of its own split off into a batch
        of that stream (the rest, where any, first)."""
        job = b.source.removeprefix("sdk:")
        ranks = sorted(r for j, r in self._own if j == job) if job != b.source else []
        out: list[Batch] = []
        rest = b
        for rank in ranks:
            mine = [e for e in rest.events if e.labels.get("rank") == str(rank)]
            records = [t for t in rest.training if t.rank == rank]
            if not (mine or records):
                continue
            stream = rank_stream(job, rank)
            out.append(Batch(stream, [], mine, records, f"{stream}:{(b.batch_id or '').rpartition(':')[2]}"))
            rest = Batch(
                rest.source,
                rest.frames,
                [e for e in rest.events if e.labels.get("rank") != str(rank)],
                [t for t in rest.training if t.rank != rank],
                rest.batch_id,
            )
        if rest.frames or rest.events or rest.training or not out:
            out.insert(0, rest)
        return out

    def _outgoing(self, b: Batch, body: Callable[[Batch], bytes]) -> list[Outgoing]:
        """``b`` to send: with its news split off, urgent, where the lane is on."""
        if not self.urgent:
            return [describe(b, body(b))]
        news, rest = urgent_part(b)
        out = [] if news is None else [describe(news, encode_frame(news), urgent=True)]
        return out if rest is None else [*out, describe(rest, body(rest))]

    def _live_body(self, b: Batch) -> bytes:
        """``b`` encoded; a node batch laid out like the sender's last one only has its times and
        values written into that one's bytes."""
        if b.events or b.training:
            return encode_frame(b)
        last = self._templates.get(b.source)
        if last is None or last[0] != [(f.metrics, f.entities) for f in b.frames]:
            parts = encode_parts(b)
            self._templates[b.source] = ([(f.metrics, f.entities) for f in b.frames], parts)
            return parts.body
        enc = last[1]
        buf = bytearray(enc.rest)
        for f, ts_at, values_at in zip(b.frames, enc.ts_offsets, enc.value_offsets, strict=True):
            _F64.pack_into(buf, ts_at, f.ts)
            raw = np.ascontiguousarray(f.values, dtype="<f8").tobytes()
            buf[values_at : values_at + len(raw)] = raw
        return head(b.source, b.batch_id) + buf

    def _replay(self, k: int, t0: float, due: float) -> list[Outgoing]:
        turn, slot = divmod(k, self.ring)
        shift = t0 - self._t0 + turn * self.ring * self.interval
        out: list[Outgoing] = []
        for s in self._nodes:
            enc = s.ticks[slot]
            buf = bytearray(enc.rest)
            for ts, off in zip(enc.ts, enc.ts_offsets, strict=True):
                _F64.pack_into(buf, off, ts + shift)
            if turn:
                for span, hold, off in zip(s.spans, s.holds, enc.value_offsets, strict=True):
                    if span is not None:
                        values = np.frombuffer(buf, dtype="<f8", count=span.size, offset=off)
                        values += turn * span.reshape(-1)
                        if hold is not None:
                            values[hold[0]] = hold[1]
            body = head(s.source, f"{s.source}:{enc.ts[0] + shift:.3f}") + buf
            out.append(Outgoing(s.source, body, s.rows, s.samples, 0, 0))
        for sdk in self._sdks:
            b = sdk.slots.get(slot)
            if b is None:
                if not (k == 0 and sdk.prelude):
                    continue
                b = Batch(sdk.source)
            if k == 0 and sdk.prelude:
                # as at the run's start (moved below by ``shift``), not in the past: the fleet
                # starts with the run, as a simulator started then would have it
                start = [Event(self._t0, e.kind, e.labels, e.data) for e in sdk.prelude]
                b = Batch(b.source, b.frames, [*start, *b.events], b.training, b.batch_id)
            out.extend(self._outgoing(_moved(b, shift, turn, sdk, f"{b.source}:{due:.3f}"), encode_frame))
        return out
