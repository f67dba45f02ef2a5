"""The hub's own ingest lag: admission of ingest requests, shedding, and the ``hub_overloaded`` finding.

A hub that takes every request it is sent falls behind without bound once senders offer more than
it can store: requests queue for its worker threads, their senders time out and retry, and the
batches it has not yet seen make healthy senders look silent. So every ingest request is admitted
here first. The hub is *behind* while its oldest admitted request has waited longer than
``max_lag_s``, while ``max_in_flight`` requests are already admitted, while its evaluation loop
runs late by more than ``max_eval_lag_s``, or while its event loop answers a timer more than
``max_loop_lag_s`` late (a hub starved of CPU: requests then wait before they can be admitted),
or while acknowledged batches wait longer than ``max_lag_s`` for its detectors (the observe stage).
While behind it refuses new ingest requests at once with 503 and a ``Retry-After`` (senders keep
the batch and spool), which costs it almost nothing.

It stays behind until ``settle_s`` after the last sign of lag: senders that were refused come back
after their ``Retry-After``, and until they have, their silence is the hub's doing, not theirs.
What the hub did to whom is reported as a :class:`ShedCover` (senders refused, by the identity
they name in ``X-Gpuscope-Sender``, and the delay the hub imposed on everyone, measured in one
place, :class:`~gpuscope.ingest.delay.HubDelay`); which silence verdicts that holds is decided in
one place, :mod:`gpuscope.gaps`.

Shedding must not hide a hard fault: a sender's news of an XID or a lost GPU would otherwise wait
behind its spool and the hub's refusals for minutes (a 1,024-node run that shed 29 % of its
batches took 76 s to raise ``gpu_xid_fatal``). So a sender sends such events in their own small
request, ahead of its spool, marked ``X-Gpuscope-Urgent: events``; the hub admits one even while
behind, if it is within ``max_urgent_bytes`` and fewer than ``max_urgent_in_flight`` are in flight
(a sender that marks everything urgent gains at most that, and is shed past it), and refuses it at
decode (400 naming the field, counted as ``ingest_refused_urgent``) unless it holds only events of
:data:`URGENT_KINDS` (:func:`check_urgent`): the lane is no way around the shedding for metrics.

Every request that names its sender is also a knock (:class:`Wire`): the hub keeps the time of each
named sender's latest request of any kind, so that a sender that stopped knocking is judged as on a
healthy hub however far behind the hub's data is (:mod:`gpuscope.gaps`).
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuscope.ingest.delay import HubDelay
from gpuscope.ingest.payload import PayloadError
from gpuscope.model import Batch, Finding, Labels
from gpuscope.rules import HUB_OVERLOADED

#: the request header in which a sender names what it reports for (``node=n1``, ``job=j,rank=0``),
#: so that a hub that refuses or queues its request knows whose silence is its own doing
SENDER_HEADER = "X-Gpuscope-Sender"
#: the labels a sender may name (those the silence verdicts are about)
SENDER_KEYS = frozenset({"node", "job", "rank"})
_MAX_SENDER_HEADER = 512
#: the request header by which a sender marks a small request of events only (an XID, a lost GPU,
#: a job's state change), sent ahead of its spool: the hub admits it even while it sheds load
URGENT_HEADER = "X-Gpuscope-Urgent"
URGENT_EVENTS = "events"


#: events of a hard fault, whose alert must not wait behind a spool: the rest (heartbeats, a job's
#: start, a checkpoint) keep their place in the sender's order
URGENT_KINDS = frozenset({"xid", "gpu_lost", "ecc_dbe", "job_failed", "process_exited"})


def check_urgent(batch: Batch) -> None:
    """A batch marked urgent holds events of :data:`URGENT_KINDS` only, at least one: the lane
    (admitted while the hub sheds) carries a hard fault's news, never metrics, training records or
    routine events. Raises :class:`~gpuscope.ingest.payload.PayloadError` naming the field."""
    mark = f"a request marked {URGENT_HEADER}: {URGENT_EVENTS}"
    if batch.frames:
        raise PayloadError("frames", f"{mark} carries events only, not frames of samples")
    if batch.training:
        raise PayloadError("training", f"{mark} carries events only, not training records")
    if not batch.events:
        raise PayloadError("events", f"{mark} carries at least one event")
    for i, event in enumerate(batch.events):
        if event.kind not in URGENT_KINDS:
            kinds = ", ".join(sorted(URGENT_KINDS))
            raise PayloadError(
                f"events[{i}].kind", f"{event.kind!r} is not urgent news; {mark} carries {kinds}"
            )


def urgent_part(batch: Batch) -> tuple[Batch | None, Batch | None]:
    """``batch`` split as an agent sends it while it has a spool: its news (events of
    :data:`URGENT_KINDS`: an XID, a lost GPU, a failed job) in a small batch of its own, sent ahead
    of the spool, and the rest in order with the spool (None where a part is empty). The news keeps
    its own timestamps, so the hub sees the fault when it happened however long the frames wait."""
    news = [e for e in batch.events if e.kind in URGENT_KINDS]
    if not news:
        return None, batch
    bid = batch.batch_id
    urgent = Batch(batch.source, [], news, [], f"{bid}:urgent" if bid is not None else None)
    routine = [e for e in batch.events if e.kind not in URGENT_KINDS]
    if not (batch.frames or routine or batch.training):
        return urgent, None
    return urgent, Batch(batch.source, batch.frames, routine, batch.training, bid)


SenderKey = tuple[tuple[str, str], ...]


class SenderHeaderError(ValueError):
    """A malformed ``X-Gpuscope-Sender``: the request is taken, the sender counted as unnamed."""


def sender_header(labels: Mapping[str, str]) -> str:
    """The header value naming ``labels`` (what a sender reports for)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def parse_sender(value: str | None) -> SenderKey | None:
    """The identity a request names (None: it names none); raises :class:`SenderHeaderError`."""
    if value is None:
        return None
    if len(value) > _MAX_SENDER_HEADER:
        raise SenderHeaderError(f"{SENDER_HEADER} is over {_MAX_SENDER_HEADER} characters")
    pairs: dict[str, str] = {}
    for part in value.split(","):
        key, eq, name = part.strip().partition("=")
        if not eq or key not in SENDER_KEYS or not name or key in pairs:
            raise SenderHeaderError(
                f"{SENDER_HEADER}: {part.strip()!r} is not one of node=, job=, rank= (each once)"
            )
        pairs[key] = name
    return tuple(sorted(pairs.items()))


def covers(sender: SenderKey, entity: Labels) -> bool:
    """Does a sender naming ``sender`` report for ``entity``: they share a label, and agree on
    every label they share (``node=n1`` covers ``{"node": "n1"}``; ``job=j`` every rank of j)."""
    shared = [(k, v) for k, v in sender if k in entity]
    return bool(shared) and all(entity[k] == v for k, v in shared)


#: how long a refusal is remembered past the settle time (the longest silence threshold it may hold)
REFUSALS_KEPT_S = 600.0


@dataclass(frozen=True, slots=True)
class Wire:
    """Who the hub heard knock, as of an evaluation: per sender named in ``X-Gpuscope-Sender``, the
    hub time of its latest request of any kind (admitted, refused, urgent; one with a request in
    flight counts as knocking at ``clock``). A refused sender keeps knocking (it comes back after
    its Retry-After); a dead one stops, whatever the spools of the others hold back.

    ``clock``: the freshest knock of any sender (a hub whose event loop is starved reads no headers
    at all, and nobody's silence on the wire grows meanwhile). ``settle``: the longest a sender the
    hub refused stays away (its Retry-After, at most twice ``retry_after_s``, plus transit).
    ``turn``: how long the fleet's senders go between knocks now, the 90th percentile of their
    silences on the wire over 0.9. Requests that wait on the senders' side (their connection pool,
    a congested link, a load generator's stalled process) reach the hub in turn, so the senders'
    silences spread over one turn and the longest is about the 90th percentile over 0.9: a wait the
    hub cannot see itself, allowed for as long as it is more than a tenth of the senders' (up to a
    tenth of them dead at once leave the percentile to the live ones)."""

    last: Mapping[SenderKey, float] = field(default_factory=dict)
    clock: float = -math.inf
    settle: float = 0.0
    turn: float = 0.0

    def silence(self, sender: SenderKey) -> float | None:
        """How long ``sender`` has not knocked (None: it never named itself to this hub)."""
        last = self.last.get(sender)
        return None if last is None else max(0.0, self.clock - last)

    def dead(self, sender: SenderKey, threshold: float) -> bool:
        """Silent on the wire past ``threshold`` plus the settle time (or the fleet's turn, if
        longer): silence neither a refusal nor the senders' own queues explain, so its verdict is
        judged as on a healthy hub, however far behind the hub's data is."""
        silence = self.silence(sender)
        return silence is not None and silence >= threshold + max(self.settle, self.turn)


#: the share of the named senders whose silence on the wire is taken as the fleet's turn
TURN_QUANTILE = 0.9


def _turn(silences: list[float]) -> float:
    """The fleet's turn (:class:`Wire`) from its senders' silences on the wire, sorted."""
    if not silences:
        return 0.0
    rank = max(0, math.ceil(TURN_QUANTILE * len(silences)) - 1)  # nearest rank
    return silences[rank] / TURN_QUANTILE


def node_sender(node: str) -> SenderKey:
    """The sender key an agent names (``node=<node>``)."""
    return (("node", node),)


def rank_sender(job: str, rank: str) -> SenderKey:
    """The sender key a training rank's SDK names (``job=<job>,rank=<rank>``)."""
    return (("job", job), ("rank", rank))


@dataclass(frozen=True, slots=True)
class ShedCover:
    """What the hub did to its senders lately. ``refused``: each named sender it refused, and when
    the gap it made ends (its last refusal plus ``settle``: by then the sender is back);
    ``everyone_until``: the same for senders that named nobody (every sender's gap); ``delay``: how
    long the hub made its senders' news wait (:meth:`~gpuscope.ingest.delay.HubDelay.delay`). A
    request in flight is not its sender's gap: a sender with a backlog always has
    one, and the data in it is what the sender queued before; the delay covers it."""

    refused: Mapping[SenderKey, float] = field(default_factory=dict)
    everyone_until: float = -math.inf
    delay: float = 0.0
    wire: Wire = field(default_factory=Wire)


@dataclass(frozen=True, slots=True)
class OverloadSettings:
    """Limits past which the hub sheds ingest load (see the module docstring)."""

    max_in_flight: int = 256
    max_lag_s: float = 2.0
    max_eval_lag_s: float = 5.0
    max_loop_lag_s: float = 2.0
    retry_after_s: float = 2.0
    #: urgent requests (see the module docstring) admitted while behind: at most this many in
    #: flight, each at most this large
    max_urgent_in_flight: int = 64
    max_urgent_bytes: int = 65536
    settle_s: float = 0.0  # 0: the longest Retry-After handed out (2 x retry_after_s), plus 2 s
    #: how long ``hub_overloaded`` stays firing after the last sign of lag. Shedding stops within
    #: ``settle``; the alert does not, so a hub that keeps falling behind for a few seconds at a
    #: time is one alert for the platform team, not one page per episode (a 2-hour soak on a
    #: starved machine raised it 78 times without this)
    alert_hold_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("max_lag_s", "max_eval_lag_s", "max_loop_lag_s", "retry_after_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"overload.{name} must be a positive number of seconds, got {value!r}")
        for name in ("max_in_flight", "max_urgent_in_flight", "max_urgent_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"overload.{name} must be a whole number of at least 1, got {value!r}")
        for name in ("settle_s", "alert_hold_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"overload.{name} must be a non-negative number, got {value!r}")

    @property
    def settle(self) -> float:
        return self.settle_s or 2 * self.retry_after_s + 2.0


@dataclass(frozen=True, slots=True)
class Admission:
    """An admitted request (``ticket``) or a refusal with the seconds the sender should wait."""

    ticket: int | None
    retry_after: int = 0


class OverloadMonitor:
    """Admits or sheds ingest requests and knows whether the hub is behind. Thread-safe: requests
    are admitted on the event loop and finished on worker threads; the evaluator reads it.

    Times are the hub's clock (wall seconds live), passed in so tests and sim-eval drive them."""

    def __init__(
        self, settings: OverloadSettings | None = None, *, name: str = "hub", rng: random.Random | None = None
    ) -> None:
        self.settings = settings or OverloadSettings()
        self.name = name
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        #: ticket -> (admitted at, its sender); dicts keep insertion order
        self._in_flight: dict[int, tuple[float, SenderKey | None]] = {}
        #: named sender -> its latest request of any kind (:class:`Wire`)
        self._knocks: dict[SenderKey, float] = {}
        self._latest_knock = -math.inf
        self._knocks_pruned = -math.inf
        self._urgent: set[int] = set()  # tickets of urgent requests admitted while behind
        self._refused: dict[SenderKey, float] = {}  # named sender -> last refused at
        self._refused_anonymous = -math.inf
        #: how long the hub makes its senders' news wait: the one measure the verdicts and health read
        self.delay = HubDelay(
            self.settings.settle, forget_s=REFUSALS_KEPT_S, arrival_floor=self.settings.max_lag_s
        )
        self._next_ticket = 0
        self._last_sign = -math.inf  # latest time the hub saw itself behind
        self._behind_since: float | None = None
        self._alert_since: float | None = None  # hub_overloaded firing since (held past an episode)
        self._observe_lag = 0.0
        self._consume_lag = 0.0  # how long ingest workers' acknowledged batches wait for the hub
        self._workers_lagging: dict[int, bool] = {}  # ingest worker -> behind at its last report
        self.shed = 0  # requests refused while behind
        self.urgent_admitted = 0  # urgent requests admitted while behind
        self.episodes = 0  # times the hub fell behind

    def admit(
        self, now: float, sender: SenderKey | None = None, urgent_bytes: int | None = None
    ) -> Admission:
        """Admit an ingest request of ``sender`` (None: it named none) now, or refuse it (the hub
        is behind) with a Retry-After. ``urgent_bytes``: the declared size of a request marked
        urgent (None: not marked), admitted while behind within the urgent limits."""
        with self._lock:
            if sender is not None:
                self._knocks[sender] = now
            if now > self._latest_knock:
                self._latest_knock = now
            if self._lagging(now):
                self._sign(now)
                s = self.settings
                if (
                    urgent_bytes is not None
                    and urgent_bytes <= s.max_urgent_bytes
                    and len(self._urgent) < s.max_urgent_in_flight
                ):
                    ticket = self._next_ticket
                    self._next_ticket += 1
                    self._urgent.add(ticket)
                    self.urgent_admitted += 1
                    return Admission(ticket)
                self.shed += 1
                if sender is None:
                    self._refused_anonymous = now
                else:
                    self._refused[sender] = now
                base = self.settings.retry_after_s
                # spread the senders' return over [base, 2 base] so they do not come back together
                return Admission(None, max(1, math.ceil(base * (1.0 + self._rng.random()))))
            ticket = self._next_ticket
            self._next_ticket += 1
            self._in_flight[ticket] = (now, sender)
            return Admission(ticket)

    def done(self, ticket: int) -> None:
        """The admitted request was answered (stored, refused or failed)."""
        with self._lock:
            self._in_flight.pop(ticket, None)
            self._urgent.discard(ticket)

    def evaluated(self, now: float, lag: float) -> None:
        """The evaluation due ``lag`` seconds before ``now`` ran now."""
        self.delay.evaluation(now, lag)  # nothing was stamped heard meanwhile: the verdicts' delay too
        with self._lock:
            if lag > self.settings.max_eval_lag_s:
                self._sign(now)

    def loop_lag(self, now: float, lag: float, next_due: float = math.inf) -> None:
        """The HTTP event loop ran a timer ``lag`` seconds late at ``now``; its next is due at
        ``next_due``: a loop that is blocked is seen late while it is blocked, not once it has
        run again (by then the silences it caused may have been judged)."""
        self.delay.loop(now, lag, next_due)
        with self._lock:
            if lag > self.settings.max_loop_lag_s:
                self._sign(now)

    def observe_lag(self, now: float, lag: float) -> None:
        """The oldest acknowledged batch the hub's detectors had not yet seen at ``now`` had
        waited ``lag`` seconds (the observe stage's backlog, :mod:`gpuscope.observing`)."""
        with self._lock:
            self._observe_lag = lag
            if lag > self.settings.max_lag_s:
                self._sign(now)

    def consume_lag(self, now: float, lag: float) -> None:
        """Batches that ingest workers acknowledged (:mod:`gpuscope.web.ingest_workers`) had
        waited ``lag`` seconds at ``now`` for the hub to take them from the workers' logs."""
        with self._lock:
            self._consume_lag = lag
            if lag > self.settings.max_lag_s:
                self._sign(now)

    def lagging(self, now: float) -> bool:
        """Whether the hub shows a sign of lag at ``now`` (what ingest workers admit by; each
        adds the settle time itself)."""
        with self._lock:
            return self._lagging_here(now)

    def worker_report(
        self,
        now: float,
        worker: int,
        refused: Mapping[SenderKey, float],
        anonymous: float,
        shed: int,
        lagging: bool,
        knocks: Mapping[SenderKey, float] | None = None,
    ) -> None:
        """What ingest worker ``worker`` did since its last report: the senders it refused (and when),
        the last refusal of a sender naming nobody, how many requests it shed, whether it saw
        itself behind, and who knocked on it (and when): the hub's verdicts hold those senders'
        silence, a sender that stopped knocking on every process is judged as on a healthy hub,
        and ``hub_overloaded`` is the hub's however many processes take its ingest."""
        with self._lock:
            for sender, at in (knocks or {}).items():
                if at > self._knocks.get(sender, -math.inf):
                    self._knocks[sender] = at
                if at > self._latest_knock:
                    self._latest_knock = at
            for sender, at in refused.items():
                self._refused[sender] = max(at, self._refused.get(sender, -math.inf))
            self._refused_anonymous = max(self._refused_anonymous, anonymous)
            self.shed += shed
            self._workers_lagging[worker] = lagging
            if lagging or shed:
                self._sign(now)

    def take_knocks(self) -> dict[SenderKey, float]:
        """The named senders that knocked since the last take (with their latest knock), forgotten
        here: what an ingest worker reports to its hub, whose wire keeps them. A worker's table so
        holds one report's senders, not every sender it ever served, and a report costs what is new.
        (Only a worker's monitor is taken from: a hub's own :meth:`cover` reads its table.)"""
        with self._lock:
            knocks, self._knocks = self._knocks, {}
            return knocks

    def take_refusals(self) -> tuple[dict[SenderKey, float], float]:
        """The named senders refused since the last take (with when), forgotten here as
        :meth:`take_knocks` does, and the last refusal of one naming nobody: what an ingest
        worker reports to its hub."""
        with self._lock:
            refused, self._refused = self._refused, {}
            return refused, self._refused_anonymous

    def arrived(self, now: float, stamps: Iterable[tuple[str, float]]) -> None:
        """The detectors saw at ``now`` the batches of these senders: each (sender, the latest of
        its own timestamps in a batch); how late that news is counts as the hub's delay while it
        is behind and while its senders' queues drain after (:meth:`HubDelay.arrived`)."""
        with self._lock:
            since_lag = now - self._last_sign
        self.delay.arrived(now, stamps, since_lag)

    def _oldest_wait(self, now: float) -> float:
        for admitted, _ in self._in_flight.values():
            return now - admitted
        return 0.0

    def cover(self, now: float) -> ShedCover:
        """Whom the hub refused or keeps waiting at ``now`` (see :class:`ShedCover`)."""
        with self._lock:
            settle = self.settings.settle
            oldest = self._oldest_wait(now)
            kept = settle + REFUSALS_KEPT_S
            self._refused = {k: t for k, t in self._refused.items() if now - t < kept}
            refused = {k: t + settle for k, t in self._refused.items()}
            everyone_until = self._refused_anonymous + settle
            last, clock = self._knocked(now, kept)
        self.delay.waiting(now, oldest)
        turn = _turn(sorted(clock - t for t in last.values()))
        wire = Wire(last, clock, settle, turn)
        return ShedCover(refused, everyone_until=everyone_until, delay=self.delay.delay(now), wire=wire)

    def _knocked(self, now: float, kept: float) -> tuple[dict[SenderKey, float], float]:
        """Each named sender's latest knock as of ``now``, and the freshest (under the lock);
        senders silent for ``kept`` are forgotten."""
        if now - self._knocks_pruned >= kept:
            self._knocks = {k: t for k, t in self._knocks.items() if now - t < kept}
            self._knocks_pruned = now
        last = dict(self._knocks)
        clock = self._latest_knock
        for _, sender in self._in_flight.values():
            if sender is not None:
                last[sender] = clock  # waiting on the hub: as fresh as anyone
        return last, clock

    def _lagging(self, now: float) -> bool:
        return self._lagging_here(now) or any(self._workers_lagging.values())

    def _lagging_here(self, now: float) -> bool:
        """A sign of lag in this process (an ingest worker's own is in ``_workers_lagging``)."""
        s = self.settings
        return (
            self._consume_lag > s.max_lag_s
            or len(self._in_flight) >= s.max_in_flight
            or self._oldest_wait(now) > s.max_lag_s
            or self.delay.evaluation_lag > s.max_eval_lag_s
            or self.delay.loop_overdue(now) > s.max_loop_lag_s
            or self._observe_lag > s.max_lag_s
        )

    def _sign(self, now: float) -> None:
        if self._behind_since is not None and now - self._last_sign >= self.settings.settle:
            self._behind_since = None  # the previous episode ended unobserved
        if self._behind_since is None:
            self._behind_since = now
            self.episodes += 1
        self._last_sign = max(self._last_sign, now)

    def behind(self, now: float) -> bool:
        """Is the hub behind at ``now``: lagging, or within ``settle`` of the last sign of lag?"""
        with self._lock:
            if self._lagging(now):
                self._sign(now)
            if self._behind_since is not None and now - self._last_sign >= self.settings.settle:
                self._behind_since = None
            return self._behind_since is not None

    def findings(self, now: float) -> list[Finding]:
        """``hub_overloaded`` while the hub is behind and for ``alert_hold_s`` after the last sign of
        lag: one alert per hub however often it falls behind meanwhile."""
        behind = self.behind(now)
        with self._lock:
            last_sign = self._last_sign
            if behind:
                if self._alert_since is None:
                    self._alert_since = self._behind_since
            elif self._alert_since is not None and now - last_sign >= self.settings.alert_hold_s:
                self._alert_since = None
            since = self._alert_since
        if since is None:
            return []
        status = self.status(now)
        state = (
            f"oldest request waited {status['oldest_wait_seconds']:.1f} s, {status['in_flight']} in flight"
            if behind
            else f"caught up {now - last_sign:.0f} s ago after {self.episodes} episode(s) of lag"
        )
        return [
            Finding(
                HUB_OVERLOADED,
                {"hub": self.name},
                f"The hub is behind on ingest: {state}, {self.shed} requests refused with Retry-After so far",
                value=status["oldest_wait_seconds"],
                affected_gpus=0,
                details={"since_ts": since, "behind_now": behind, **status},
            )
        ]

    def status(self, now: float) -> dict[str, Any]:
        """For /api/v1/health and the alert's details."""
        with self._lock:
            status: dict[str, Any] = {
                "behind": self._behind_since is not None,
                "behind_since": self._behind_since,
                "in_flight": len(self._in_flight),
                "oldest_wait_seconds": round(self._oldest_wait(now), 3),
                "observe_lag_seconds": round(self._observe_lag, 3),
                "worker_lag_seconds": round(self._consume_lag, 3),
                "shed_requests": self.shed,
                "urgent_admitted_while_behind": self.urgent_admitted,
                "episodes": self.episodes,
            }
        return {**status, **self.delay.status(now)}
