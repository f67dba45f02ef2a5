"""One seam for "don't blame senders for the hub's own gap" (gpuscope.gaps): a real hub, in
virtual time, that sheds or delays its senders while behind on ingest. It blames none of the
senders it refused or kept waiting, yet judges a sender it did not refuse (a node that died) at
its threshold plus the delay the hub imposed, however long the hub stays behind."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import pytest

from detect.rig import FakeCluster, FakeJob
from gpuscope.gaps import SILENCE_RULES
from gpuscope.hub import Hub
from gpuscope.ingest.overload import (
    OverloadMonitor,
    OverloadSettings,
    SenderHeaderError,
    covers,
    parse_sender,
    sender_header,
)
from gpuscope.model import Alert, Batch
from gpuscope.store.duckdb import DuckDBStore

LOOP_LAG = 3.0  # how late the behind hub's event loop runs its timers


Make = Callable[[float], Iterable[Batch | None]]
Name = Callable[[Batch], dict[str, str] | None]


class Rig:
    """A hub whose overload monitor runs on the test's clock. Each tick, the batches of ``make``
    reach the hub's detectors and those of ``refuse`` are offered through admission, as the HTTP
    route does, while the hub is behind (so it refuses them with Retry-After)."""

    def __init__(self) -> None:
        self.hub = Hub(DuckDBStore(":memory:", durable=False))
        self.hub.overload = OverloadMonitor(OverloadSettings(), name="hub-a", rng=random.Random(1))

    def tick(self, t: float, batches: Iterable[Batch | None], refused: Iterable[Batch], name: Name) -> None:
        for batch in batches:
            if batch is not None:
                self.hub.ingest(batch)
        for batch in refused:
            labels = name(batch)
            key = parse_sender(sender_header(labels)) if labels else None
            assert self.hub.overload.admit(t, key).ticket is None  # the sender keeps it and spools
        self.hub.evaluate(t)

    def run(
        self,
        start: int,
        stop: int,
        make: Make,
        name: Name = lambda b: None,
        *,
        refuse: Callable[[float], list[Batch]] | None = None,
    ) -> None:
        """Ticks ``start..stop-1``; with ``refuse``, the hub is behind (its event loop runs late)."""
        for t in range(start, stop):
            self.hub.overload.loop_lag(float(t), LOOP_LAG if refuse is not None else 0.0)
            self.tick(float(t), make(float(t)), refuse(float(t)) if refuse is not None else [], name)

    def blamed(self) -> list[Alert]:
        alerts, _ = self.hub.alert_view()
        return [a for a in alerts if a.rule in SILENCE_RULES]


def node_of(batch: Batch) -> dict[str, str]:
    return {"node": batch.source}


def test_nodes_the_hub_refused_while_behind_are_not_blamed() -> None:
    cluster = FakeCluster(nodes=4, gpus=2)
    rig = Rig()
    rig.run(0, 30, cluster.batches, node_of)
    # behind for 40 s: every request of three named nodes is refused, one node's still get through
    rig.run(30, 70, lambda t: cluster.batches(t)[:1], node_of, refuse=lambda t: cluster.batches(t)[1:])
    rig.run(70, 72, lambda t: [])  # caught up; the refused senders come back after Retry-After
    rig.run(72, 120, cluster.batches, node_of)
    assert rig.blamed() == []
    assert rig.hub.counters.get("silence_verdicts_held_overload") > 0
    assert any(a.rule == "hub_overloaded" for a in rig.hub.alert_view()[0])


def test_senders_that_name_nobody_are_all_held_while_the_hub_refuses_them() -> None:
    cluster = FakeCluster(nodes=4, gpus=2)
    rig = Rig()
    rig.run(0, 30, cluster.batches)
    rig.run(30, 70, lambda t: cluster.batches(t)[:1], refuse=lambda t: cluster.batches(t)[1:])  # unnamed
    rig.run(70, 72, lambda t: [])
    rig.run(72, 120, cluster.batches)
    assert rig.blamed() == []
    assert rig.hub.counters.get("silence_verdicts_held_overload") > 0


def test_a_node_down_while_the_hub_stays_behind_is_reported_within_threshold_and_the_hubs_delay() -> None:
    """The hub is behind for a minute, refusing the named live nodes two times in three; node-3
    dies at 30 (last report at 29). Its verdict is due at its threshold (4 x its 1 s period) plus
    the delay the hub made every request wait, not when the hub has caught up."""
    cluster = FakeCluster(nodes=4, gpus=2)
    rig = Rig()
    rig.run(0, 30, cluster.batches, node_of)
    cluster.down.add("node-3")
    turn = {"node-0": 0, "node-1": 1, "node-2": 2}

    def through(t: float) -> list[Batch]:
        return [b for b in cluster.batches(t) if int(t) % 3 == turn[b.source]]

    def refused(t: float) -> list[Batch]:
        return [b for b in cluster.batches(t) if int(t) % 3 != turn[b.source]]

    rig.run(30, 90, through, node_of, refuse=refused)
    (alert,) = rig.blamed()
    assert alert.entity == {"node": "node-3"} and alert.rule == "node_unreachable"
    assert 29 + 4 <= alert.started_at <= 29 + 4 + LOOP_LAG + 1


def test_a_firing_alert_is_never_held() -> None:
    cluster = FakeCluster(nodes=4, gpus=2)
    rig = Rig()
    rig.run(0, 30, cluster.batches)
    cluster.down.add("node-3")
    rig.run(30, 40, cluster.batches)
    (alert,) = rig.blamed()
    assert alert.firing
    rig.run(40, 70, lambda t: cluster.batches(t)[:1], refuse=lambda t: cluster.batches(t)[1:])  # all held
    assert alert.firing and alert.resolved_at is None


def test_ranks_whose_reports_the_hub_sheds_while_behind_are_not_lost_or_stalled() -> None:
    cluster = FakeCluster(nodes=2, gpus=4)
    job = FakeJob.on(cluster.names, 4)
    cluster.allocate(job.name, job.placement)
    rig = Rig()

    def named(batch: Batch) -> dict[str, str]:
        return node_of(batch) if batch.source in cluster.names else {"job": job.name}

    rig.run(0, 60, lambda t: [*cluster.batches(t), job.batch(t)], named)
    spooled: list[Batch | None] = []

    def sdk(t: float) -> list[Batch]:
        batch = job.batch(t)
        spooled.append(batch)
        return [batch] if batch is not None else []

    # behind: the nodes' batches get through, the SDK's are refused (it spools them)
    rig.run(60, 90, cluster.batches, named, refuse=sdk)
    rig.run(90, 91, cluster.batches, named)
    # the SDK comes back after Retry-After with its spooled records, then carries on
    rig.tick(91.0, [*cluster.batches(91.0), *spooled, job.batch(91.0)], [], named)
    rig.run(92, 150, lambda t: [*cluster.batches(t), job.batch(t)], named)
    assert rig.blamed() == []


def test_a_sender_names_what_it_reports_for_and_a_malformed_name_is_refused() -> None:
    node = parse_sender(sender_header({"node": "n1"}))
    rank = parse_sender("job=llm,rank=3")
    assert node is not None and rank is not None
    assert (
        covers(node, {"node": "n1"}) and not covers(node, {"node": "n2"}) and not covers(node, {"job": "llm"})
    )
    assert covers(rank, {"job": "llm", "rank": "3", "node": "n1"}) and covers(rank, {"job": "llm"})
    assert not covers(rank, {"job": "llm", "rank": "4"})
    assert parse_sender(None) is None
    for bad in ("gpu=1", "node", "node=", "node=a,node=b", "x" * 600):
        with pytest.raises(SenderHeaderError, match="X-Gpuscope-Sender"):
            parse_sender(bad)


def test_nodes_whose_requests_queue_before_admission_are_not_blamed_and_a_dead_one_is() -> None:
    """While behind, the live nodes' requests are not refused but queue on the way in (a
    sender's connection pool, the kernel's accept queue): each node's spool reaches the hub in
    bursts every ``period`` seconds, ``LAG`` seconds old, which no measure of requests in flight
    sees. The hub measures that delay from the senders' own timestamps and the turns of their
    queues: nobody live is blamed, and a node that dies meanwhile is alerted within its threshold
    plus that delay of its last report."""
    lag, period = 8, 9
    cluster = FakeCluster(nodes=18, gpus=2)
    rig = Rig()
    queued: dict[str, list[Batch]] = {name: [] for name in cluster.names}
    heard_last: dict[str, float] = {}
    delays: list[float] = []

    def through(t: float) -> list[Batch]:
        delays.append(rig.hub.overload.cover(t).delay)
        for batch in cluster.batches(t):
            queued[batch.source].append(batch)
        out: list[Batch] = []
        for i, name in enumerate(cluster.names):
            if t < 30 or int(t + i) % period == 0:
                ready = [b for b in queued[name] if b.frames[0].ts <= t - (lag if t >= 30 else 0)]
                queued[name] = [b for b in queued[name] if b not in ready]
                out += ready
                if ready:
                    heard_last[name] = t
        return out

    rig.run(0, 30, through, node_of)
    rig.run(30, 60, through, node_of, refuse=lambda t: [])  # behind, nobody refused
    cluster.down.add("node-17")
    rig.run(60, 120, through, node_of, refuse=lambda t: [])
    (alert,) = rig.blamed()
    assert alert.entity == {"node": "node-17"} and alert.rule == "node_unreachable"
    late = rig.hub.overload.status(120.0)["arrival_lag_seconds"]  # a turn of the queue: its period
    assert lag - 0.5 <= late <= period  # less the drift a sender's usual offset may follow
    delay = max(delays)  # the longest the hub measured (the first turns of the queues: longer)
    assert heard_last["node-17"] + 4 <= alert.started_at <= heard_last["node-17"] + 4 + delay + 1


def test_senders_still_queued_after_the_hub_caught_up_are_not_blamed_and_a_dead_one_is() -> None:
    """What a hub at 384 nodes did: while behind, its senders' news queued on the way in and
    arrived 12 s late; when it caught up, most queues drained at once, but those of a few nodes
    and of the training job's SDK had their turn 12 s later still. Held only for the settle time
    after it was seen, that 12-s delay no longer covered them: ``node_unreachable`` and
    ``rank_lost`` for healthy senders. A node that died during the overload is still alerted
    within its threshold plus the delay the hub measured."""
    lag, behind, caught_up, turn = 12, 30, 50, 62
    cluster = FakeCluster(nodes=20, gpus=2)
    job = FakeJob.on(cluster.names[:4], 2)
    cluster.allocate(job.name, job.placement)
    stuck = {*cluster.names[4:7], f"sdk:{job.name}"}  # their queues' turn comes last
    rig = Rig()
    queued: list[Batch] = []
    heard_last: dict[str, float] = {}
    delays: list[float] = []

    def named(batch: Batch) -> dict[str, str]:
        return node_of(batch) if batch.source in cluster.names else {"job": job.name}

    def through(t: float) -> list[Batch]:
        queued.extend(b for b in [*cluster.batches(t), job.batch(t)] if b is not None)
        if t < behind:
            cutoff = {b.source: t for b in queued}
        elif t < caught_up:
            cutoff = {b.source: t - lag for b in queued}
        else:
            cutoff = {b.source: (t - lag if t < turn else t) if b.source in stuck else t for b in queued}
        ready = [b for b in queued if _ts(b) <= cutoff[b.source]]
        queued[:] = [b for b in queued if _ts(b) > cutoff[b.source]]
        heard_last.update((b.source, t) for b in ready)
        delays.append(rig.hub.overload.cover(t).delay)
        return ready

    rig.run(0, behind, through, named)
    rig.run(behind, 40, through, named, refuse=lambda t: [])  # behind, nobody refused
    cluster.down.add("node-19")  # dies during the overload
    rig.run(40, caught_up, through, named, refuse=lambda t: [])
    for t in range(caught_up, turn):  # caught up; the stuck senders' news stays where it queued
        rig.run(t, t + 1, lambda t: [b for b in through(t) if b.source not in stuck], named)
    rig.run(turn, 120, through, named)
    (alert,) = rig.blamed()
    assert alert.entity == {"node": "node-19"} and alert.rule == "node_unreachable"
    measured = max(delays)
    assert lag - 0.5 <= measured <= lag + 1
    assert heard_last["node-19"] + 4 <= alert.started_at <= heard_last["node-19"] + 4 + measured + 1


def _ts(batch: Batch) -> float:
    return max([f.ts for f in batch.frames] + [r.ts for r in batch.training] + [e.ts for e in batch.events])


def test_senders_refused_while_behind_are_not_blamed_while_their_spools_queue_on_the_way_back() -> None:
    """Refused senders come back once the hub has caught up, and their spools wait in the same
    queue as everyone's news (10 s here): the gap the hub made them ends at the settle time after
    its last refusal, and their silence is judged from then plus that delay, not from then only.
    A refused node that died meanwhile is still alerted within that much."""
    lag, behind, caught_up, back = 10, 30, 50, 62
    cluster = FakeCluster(nodes=10, gpus=2)
    refused_nodes = set(cluster.names[:6])
    rig = Rig()
    spooled: list[Batch] = []
    delays: list[float] = []

    def refuse(t: float) -> list[Batch]:
        out = [b for b in cluster.batches(t) if b.source in refused_nodes]
        spooled.extend(out)
        return out

    def through(t: float) -> list[Batch]:
        delays.append(rig.hub.overload.cover(t).delay)
        if t < behind:
            return cluster.batches(t)
        if t < caught_up:
            return [b for b in cluster.batches(t) if b.source not in refused_nodes]
        queued = [*spooled, *(b for b in (cluster.batch(t - lag, n) for n in cluster.names) if b)]
        spooled[:] = [b for b in queued if b.source in refused_nodes and t < back]
        return [b for b in queued if b.source not in refused_nodes or t >= back]

    rig.run(0, behind, through, node_of)
    rig.run(behind, 40, through, node_of, refuse=refuse)
    cluster.down.add("node-5")  # refused until it died
    rig.run(40, caught_up, through, node_of, refuse=refuse)
    rig.run(caught_up, 110, through, node_of)  # the refused nodes' spools are back at ``back``
    (alert,) = rig.blamed()
    assert alert.entity == {"node": "node-5"} and alert.rule == "node_unreachable"
    gap_end = 39 + rig.hub.overload.settings.settle
    assert alert.started_at <= gap_end + 4 + max(delays) + 1


def test_a_node_that_stops_knocking_is_found_at_its_threshold_however_late_the_others_news_is() -> None:
    """Behind for 90 s: every live node is refused each second (it knocks: it comes back after
    Retry-After) and its news reaches the detectors 40 s late, as through a deep spool (nothing
    for 40 s, then each second's news 40 s old); node-11 dies at 30 and knocks no more. The hub's
    delay and the fleet's watermark are 40 s, yet node-11 is judged as on a healthy hub: at its
    threshold plus the settle time after its last knock, not 40 s later; the refused live nodes
    raise nothing."""
    lag = 40
    cluster = FakeCluster(nodes=12, gpus=2)  # the one that dies is under a tenth of the senders
    rig = Rig()
    queued: list[Batch] = []
    settle = rig.hub.overload.settings.settle

    def knock(t: float, names: Iterable[str]) -> None:
        for name in names:
            admission = rig.hub.overload.admit(t, parse_sender(sender_header({"node": name})))
            if admission.ticket is not None:
                rig.hub.overload.done(admission.ticket)

    for t in range(0, 30):
        knock(float(t), cluster.names)
        rig.run(t, t + 1, cluster.batches, node_of)
    cluster.down.add("node-11")
    for t in range(30, 120):
        queued.extend(b for b in cluster.batches(float(t)) if b is not None)
        ready = [b for b in queued if _ts(b) <= t - lag]
        queued[:] = [b for b in queued if _ts(b) > t - lag]
        rig.hub.overload.loop_lag(float(t), LOOP_LAG)
        knock(float(t), [n for n in cluster.names if n not in cluster.down])
        rig.tick(float(t), ready, [], node_of)
    assert rig.hub.overload.cover(119.0).delay >= lag / 2  # the hub knows its senders' news is late
    (alert,) = rig.blamed()
    assert alert.entity == {"node": "node-11"} and alert.rule == "node_unreachable"
    assert 29 + 4 + settle <= alert.started_at <= 29 + 4 + settle + 1
    assert alert.details["wire_silence_seconds"] >= 4 + settle
    (nodes,) = [d for d in rig.hub.detection.detectors if d.rules == ("node_unreachable",)]
    withheld = [nodes.counters.get(f"node_verdicts_withheld_{why}") for why in ("hub_gap", "watermark")]
    assert sum(withheld) > 0  # the live ones, silent on the hub's clock, were withheld
    assert nodes.counters.get("node_verdicts_found_on_wire") >= 1


def _last_step_ts(batches: Iterable[Batch]) -> float:
    return max((r.ts for b in batches for r in b.training), default=float("-inf"))


def test_a_job_that_hangs_while_the_hub_refuses_its_requests_is_stalled_at_its_threshold_and_lag() -> None:
    """Behind from 60 to 240 s, the hub refuses the job's SDK two seconds in three (it names
    ``job=llm``; its spool comes back in order on the third); the agents get through. The job
    hangs at 120: its ranks heartbeat at the same step. The refusals keep moving the end of the
    gap the hub made the job, so this verdict was held for as long as the hub was behind (the
    1,024-agent run never reported its hang); yet the heartbeats the hub took and saw show the job
    still for its threshold in the ranks' own time, which no refusal or lag of the hub's explains.
    It is stalled at its usual bound plus the lag of the job's data, while the hub is still behind;
    before the hang, the same refusals blamed nobody."""
    lag = 3  # the SDK's data reaches the detectors every third second
    cluster = FakeCluster(nodes=4, gpus=2)
    job = FakeJob.on(cluster.names, 2)
    cluster.allocate(job.name, job.placement)
    rig = Rig()
    sdk = f"sdk:{job.name}"
    spooled: list[Batch] = []
    taken: list[Batch] = []

    def named(batch: Batch) -> dict[str, str]:
        return node_of(batch) if batch.source in cluster.names else {"job": job.name}

    def through(t: float) -> list[Batch]:
        batch = job.batch(t)
        if batch is not None:
            spooled.append(batch)
        if int(t) % lag:
            return cluster.batches(t)
        taken.extend(spooled)
        back, spooled[:] = list(spooled), []
        return [*cluster.batches(t), *back]

    def refused(t: float) -> list[Batch]:
        return [] if int(t) % lag == 0 else [Batch(sdk)]

    rig.run(0, 60, lambda t: [*cluster.batches(t), job.batch(t)], named)
    rig.run(60, 120, through, named, refuse=refused)
    assert rig.blamed() == []  # the refused job is neither lost nor stalled
    job.hung = True
    rig.run(120, 240, through, named, refuse=refused)
    last_step = _last_step_ts(taken)
    (alert,) = rig.blamed()
    assert alert.rule == "training_stalled" and alert.entity == {"job": job.name}
    threshold = alert.details["threshold_seconds"]  # 8 s: max(2.5 x 1-s steps, 8 s)
    assert last_step + threshold <= alert.started_at <= last_step + threshold + lag + 1
    assert alert.started_at < 240 and rig.hub.overload.behind(alert.started_at)  # not once caught up
    assert alert.details["event_seconds_since_step"] >= threshold
    assert rig.hub.counters.get("silence_verdicts_held_overload") > 0  # the refusals were held


def _by_rank(batch: Batch | None, ranks: int) -> list[Batch]:
    """A job's tick as its ranks' SDKs send it, each rank its own stream; only rank 0 writes the
    checkpoint (the others wait for it in a barrier, heartbeating at its step)."""
    if batch is None:
        return []
    out = []
    for rank in range(ranks):
        mine = [e for e in batch.events if e.labels.get("rank", "0") == str(rank)]
        if rank:
            mine = [e for e in mine if not e.kind.startswith("checkpoint_")]
        records = [r for r in batch.training if r.rank == rank]
        out.append(Batch(f"sdk:{batch.source}:{rank}", events=mine, training=records))
    return out


def test_a_checkpoint_whose_start_the_hub_refused_is_no_stall_while_other_ranks_wait_at_its_step() -> None:
    """Each rank sends on its own (``job=llm,rank=N``). Behind from 60 s; rank 0 starts a 40-s
    checkpoint at 100 (the others wait at its step) and the hub refuses rank 0 from 95 to 150, so
    its checkpoint's start reaches the hub 50 s late, while ranks 1-7 keep showing the hub the same
    step for 40 s. That is no evidence of a hang: rank 0's own data, which would tell, has not been
    seen. Nobody is stalled or lost, and a hang after is still found while the hub is behind."""
    cluster = FakeCluster(nodes=4, gpus=2)
    job = FakeJob.on(cluster.names, 2)
    ranks = len(job.placement)
    cluster.allocate(job.name, job.placement)
    rig = Rig()
    spooled: list[Batch] = []
    taken: list[Batch] = []

    def named(batch: Batch) -> dict[str, str]:
        if batch.source in cluster.names:
            return node_of(batch)
        return {"job": job.name, "rank": batch.source.rsplit(":", 1)[1]}

    def rank0_refused(t: float) -> bool:
        return 95 <= t < 150

    def through(t: float) -> list[Batch]:
        parts = _by_rank(job.batch(t), ranks)
        if parts and rank0_refused(t):
            spooled.append(parts[0])
            parts = parts[1:]
        elif parts:
            parts, spooled[:] = [*spooled, *parts], []
        taken.extend(parts)
        return [*cluster.batches(t), *parts]

    def refused(t: float) -> list[Batch]:
        return [Batch(f"sdk:{job.name}:0")] if rank0_refused(t) else []

    rig.run(0, 60, lambda t: [*cluster.batches(t), *_by_rank(job.batch(t), ranks)], named)
    rig.run(60, 100, through, named, refuse=refused)
    job.start_checkpoint(100.0, 40.0)
    rig.run(100, 180, through, named, refuse=refused)
    assert rig.blamed() == []
    assert rig.hub.counters.get("silence_verdicts_held_overload") > 0
    job.hung = True
    rig.run(180, 240, through, named, refuse=lambda t: [])
    (alert,) = rig.blamed()
    assert alert.rule == "training_stalled" and alert.entity == {"job": job.name}
    last_step = _last_step_ts(taken)
    assert alert.started_at <= last_step + alert.details["threshold_seconds"] + 1
    assert rig.hub.overload.behind(alert.started_at)
