"""Delivering encoded batches to the hub, in order, through the spool when the hub is away.

A 2xx answer means the hub stored the batch durably; when it names the owner of this sender's
shard (a sharded cluster), the next batches go there (:mod:`.route`). A connection error, a 5xx,
408, 421 or 429 means "later": the batch goes to the spool and the sender backs off (exponential, jittered,
capped), or waits the ``Retry-After`` the hub gave. Any other status is a permanent refusal:
retrying would never succeed, so the batch is counted as ``batches_refused``, the hub's message is
logged once, and delivery moves on. A sender made with ``stop_on_refused_token`` (the node agent)
treats 401 and 403 apart: every batch would be refused alike, so it raises :class:`TokenRefused`
instead, keeping the batch in the spool for a later start with a token the hub accepts. While the
spool holds anything, new batches queue behind it so the hub receives batches in the order they
were collected, except news (:meth:`Sender.submit_urgent`): an XID or a lost GPU goes ahead of the
spool, marked ``X-Gpuscope-Urgent``, which a hub that sheds load still admits. Such news is written
ahead too, to a spool of its own (``urgent_spool``), before it is sent: an agent killed during
that send replays it first at its next start (the hub keeps one copy by batch id), and news the hub
does not take now is retried ahead of the ordinary spool.

A body is a JSON batch or a binary frame (:mod:`gpuscope.ingest.frame`); each is posted with its
own content type, so spooled records of either kind replay as they were written. A hub that does
not read frames answers 415: the frame is converted to JSON and posted again at once, and frames go
out as JSON for :data:`FRAME_RETRY_S` before the hub is asked again (it may have been upgraded).
"""

from __future__ import annotations

import logging
import random
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

import httpx
import orjson

from gpuscope import __version__
from gpuscope.agent.route import CONNECT_TIMEOUT_S, HubRoute, parse_hubs
from gpuscope.agent.spool import Spool
from gpuscope.counters import Counters
from gpuscope.ingest.frame import CONTENT_TYPE as FRAME_CONTENT_TYPE
from gpuscope.ingest.frame import JSON_CONTENT_TYPE, frame_to_json, is_frame
from gpuscope.ingest.overload import SENDER_HEADER, URGENT_EVENTS, URGENT_HEADER, sender_header
from gpuscope.ingest.payload import PayloadError
from gpuscope.tls import client_context

log = logging.getLogger("gpuscope.agent.sender")

INGEST_PATH = "/api/v1/ingest"
#: spool records carry the batch's sample count ahead of the body, for ``samples_sent``
_ENVELOPE = struct.Struct("<I")
_MAX_LOGGED_REFUSALS = 64
#: after a hub refused a frame (415), how long frames are sent as JSON before trying a frame again
FRAME_RETRY_S = 600.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry delays: ``initial * factor**n`` capped at ``cap``, reduced by up to ``jitter`` at random
    so agents that lost the hub together do not come back in lockstep."""

    initial: float = 0.5
    factor: float = 2.0
    cap: float = 10.0
    jitter: float = 0.5
    max_retry_after: float = 300.0

    def delay(self, failures: int, rng: random.Random) -> float:
        base = min(self.cap, self.initial * self.factor ** max(0, failures - 1))
        return base * (1.0 - self.jitter * rng.random())


class TokenRefused(Exception):
    """The hub refused this sender's token (HTTP 401 or 403): nothing can be delivered until the
    token or the hub's configuration changes. The message names the hub and the hub's reason,
    never the token."""

    def __init__(self, url: str, status: int, reason: str, token_given: bool) -> None:
        self.url, self.status, self.reason = url, status, reason
        if token_given:
            what = f"the hub at {url} refused the token (HTTP {status}: {reason})"
        else:
            what = f"the hub at {url} needs a token (HTTP {status}: {reason}); none was given"
        super().__init__(what)


class Outcome(Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    REFUSED = "refused"


class Sender:
    """Posts batches to ``<hub>/api/v1/ingest``; spools and retries what cannot be delivered now.

    Counters: ``batches_sent``, ``samples_sent``, ``batches_spooled``, ``batches_replayed``,
    ``batches_refused``, ``send_failures`` (attempts that will be retried).
    """

    def __init__(
        self,
        hub_url: str,
        *,
        spool: Spool,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 10.0,
        counters: Counters | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        ca_file: str | None = None,
        sender: Mapping[str, str] | None = None,
        stop_on_refused_token: bool = False,
        urgent_spool: Spool | None = None,
    ) -> None:
        self.spool = spool
        #: news (:meth:`submit_urgent`) written ahead and sent ahead of :attr:`spool`; None: news
        #: that is not taken joins :attr:`spool`
        self.urgent_spool = urgent_spool
        self.stop_on_refused_token = stop_on_refused_token
        self._token_given = bool(token)
        self._lock = threading.RLock()
        self.counters = counters if counters is not None else Counters()
        #: the hub posted to: a cluster's owner of this sender's shard once a hub named it
        self.route = HubRoute(parse_hubs(hub_url), INGEST_PATH, self.counters)
        self.clock = clock
        self.backoff = backoff if backoff is not None else Backoff()
        self.rng = rng if rng is not None else random.Random()
        headers = {"User-Agent": f"gpuscope-agent/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if sender:  # what it reports for: a hub that sheds or queues it does not blame its silence on it
            headers[SENDER_HEADER] = sender_header(sender)
        # https: the hub's certificate is verified, against ``ca_file`` / GPUSCOPE_CA_FILE if set
        verify = client_context(ca_file) if self.route.tls else True
        # a hub that does not accept the connection soon is gone: the next one is tried
        limits = httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S))
        self._client = httpx.Client(headers=headers, timeout=limits, transport=transport, verify=verify)
        self._failures = 0  # consecutive failed attempts
        self._next_attempt = float("-inf")
        self._logged_refusals: set[tuple[int, str]] = set()
        self._frames_refused_until = float("-inf")  # the hub answered 415 to a frame until then

    @property
    def url(self) -> str:
        return self.route.url

    @property
    def backlog(self) -> int:
        """Batches waiting in the spools."""
        return len(self.spool) + self._urgent_backlog

    @property
    def _urgent_backlog(self) -> int:
        return 0 if self.urgent_spool is None else len(self.urgent_spool)

    @property
    def hub_ok(self) -> bool:
        """False from a failed attempt until the next successful one."""
        return self._failures == 0

    def submit(self, body: bytes, samples: int = 0, *, deadline: float | None = None) -> None:
        """Deliver one encoded batch, or queue it behind earlier ones; then drain the spool.

        The batch is written ahead to the spool before it is posted, so an agent killed while a
        send is in flight replays it after a restart (the hub keeps one copy by batch id)."""
        with self._lock:  # acks name "the oldest record": one sender at a time keeps them right
            self._submit(body, samples, deadline)

    def _submit(self, body: bytes, samples: int, deadline: float | None) -> None:
        record = _ENVELOPE.pack(min(samples, 0xFFFFFFFF)) + body
        if not self.backlog and self.clock() >= self._next_attempt:
            written_ahead = self.spool.append(record)
            outcome = self._post(body)
            if outcome is not Outcome.RETRY:
                if written_ahead:
                    self.spool.ack()  # the spool held only this batch: it is the oldest record
                if outcome is Outcome.DELIVERED:
                    self._delivered(samples)
                return
            if written_ahead:
                self.counters.inc("batches_spooled")
            return  # the failure set the backoff: nothing more to try now
        if self.spool.append(record):
            self.counters.inc("batches_spooled")
        self._flush(deadline)

    def submit_urgent(self, body: bytes, *, deadline: float | None = None) -> None:
        """Deliver a batch of news (events only, :func:`~gpuscope.ingest.overload.urgent_part`)
        ahead of the spool, marked urgent, even while backing off. With nothing spooled it is an
        ordinary batch. Written ahead to the urgent spool first: an agent killed during the send
        replays it at its next start, ahead of everything; news the hub does not take now stays
        there and goes first at the next attempt. Without an urgent spool (or if it cannot be
        written) it is posted as it is and, not taken, joins the ordinary spool."""
        with self._lock:
            if not self.backlog and self.clock() >= self._next_attempt:
                self._submit(body, 0, deadline)
                return
            record = _ENVELOPE.pack(0) + body
            if self.urgent_spool is not None and self.urgent_spool.append(record):
                self._flush_urgent(force=True)
                return
            outcome = self._post(body, urgent=True)
            if outcome is Outcome.DELIVERED:
                self.counters.inc("batches_urgent")
                self._delivered(0)
            elif outcome is Outcome.RETRY and self.spool.append(record):
                self.counters.inc("batches_spooled")

    def _flush_urgent(self, *, force: bool = False) -> bool:
        """Send the urgent spool's news, oldest first, marked urgent (``force``: even while backing
        off, as news is); False when the hub did not take one (it stays, and is tried first next)."""
        spool = self.urgent_spool
        while spool is not None and len(spool) and (force or self.clock() >= self._next_attempt):
            record = spool.peek()
            if record is None:
                break
            if len(record) < _ENVELOPE.size:
                self.counters.inc("spool_corrupt_records")
                spool.ack()
                continue
            outcome = self._post(record[_ENVELOPE.size :], urgent=True)
            if outcome is Outcome.RETRY:
                return False
            spool.ack()
            if outcome is Outcome.DELIVERED:
                self.counters.inc("batches_urgent")
                self._delivered(0)
        return True

    def flush(self, deadline: float | None = None) -> int:
        """Deliver spooled batches in order until the spool is empty, the hub fails again, or the
        ``deadline`` (on the sender's clock) passes. Returns how many were delivered."""
        with self._lock:
            return self._flush(deadline)

    def _flush(self, deadline: float | None) -> int:
        delivered = 0
        if not self._flush_urgent():
            return delivered
        while len(self.spool) and self.clock() >= self._next_attempt:
            if deadline is not None and self.clock() >= deadline:
                break
            record = self.spool.peek()
            if record is None:
                break
            if len(record) < _ENVELOPE.size:
                self.counters.inc("spool_corrupt_records")
                self.spool.ack()
                continue
            (samples,) = _ENVELOPE.unpack_from(record)
            outcome = self._post(record[_ENVELOPE.size :])
            if outcome is Outcome.RETRY:
                break
            self.spool.ack()
            if outcome is Outcome.DELIVERED:
                self.counters.inc("batches_replayed")
                self._delivered(samples)
                delivered += 1
        return delivered

    def close(self) -> None:
        self._client.close()

    def _delivered(self, samples: int) -> None:
        self.counters.inc("batches_sent")
        self.counters.inc("samples_sent", samples)

    @property
    def sends_frames(self) -> bool:
        """False while frames go out as JSON because the hub refused one (415)."""
        return self.clock() >= self._frames_refused_until

    def _post(self, body: bytes, urgent: bool = False) -> Outcome:
        if is_frame(body) and not self.sends_frames:
            body = self._as_json(body)
        marks = {URGENT_HEADER: URGENT_EVENTS} if urgent else {}
        while True:
            try:
                resp = self._client.post(
                    self.url, content=body, headers={"Content-Type": _content_type(body), **marks}
                )
                if resp.status_code == 415 and is_frame(body):
                    self._frames_refused_until = self.clock() + FRAME_RETRY_S
                    self.counters.inc("frames_refused_by_hub")
                    log.info("hub %s does not read binary frames (415); sending JSON", self.url)
                    body = self._as_json(body)
                    resp = self._client.post(
                        self.url, content=body, headers={"Content-Type": JSON_CONTENT_TYPE, **marks}
                    )
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # the hub is gone (a cluster member died): the next known hub at once, not after
                # a backoff, so the sender's silence stays within the cluster's failover grace
                if self.route.fail_over():
                    self.counters.inc("send_failures")
                    continue
                self._failed(f"{type(exc).__name__}: {exc}", None)
                return Outcome.RETRY
            except httpx.RequestError as exc:
                self._failed(f"{type(exc).__name__}: {exc}", None)
                self.route.failed()
                return Outcome.RETRY
        status = resp.status_code
        if status == 421:  # "not the hub for this": another hub takes it, and names the owner
            self._failed(f"HTTP {status}: {_hub_message(resp)}", None)
            self.route.failed()
            return Outcome.RETRY
        if 200 <= status < 300:
            self.route.answered(resp.headers)
            if self._failures:
                log.info("hub %s reachable again; %d batches waiting in the spool", self.url, len(self.spool))
            self._failures, self._next_attempt = 0, float("-inf")
            return Outcome.DELIVERED
        if status in (408, 429) or status >= 500:
            self._failed(f"HTTP {status}: {_hub_message(resp)}", _retry_after(resp))
            return Outcome.RETRY
        message = _hub_message(resp)
        if status in (401, 403) and self.stop_on_refused_token:
            self.counters.inc(f"token_refused.{status}")
            raise TokenRefused(self.route.base, status, message, self._token_given)
        self.counters.inc("batches_refused")
        self.counters.inc(f"batches_refused.{status}")
        key = (status, message)
        if key not in self._logged_refusals and len(self._logged_refusals) < _MAX_LOGGED_REFUSALS:
            self._logged_refusals.add(key)
            log.error(
                "hub refused a batch, HTTP %d: %s (not retried; counted as batches_refused)", status, message
            )
        return Outcome.REFUSED

    def _as_json(self, body: bytes) -> bytes:
        try:
            return frame_to_json(body)
        except PayloadError:
            # a frame this sender wrote but cannot read back (damaged in the spool): the hub
            # refuses it by name, counted as batches_refused, and delivery moves on
            return body

    def _failed(self, why: str, retry_after: float | None) -> None:
        self.counters.inc("send_failures")
        self._failures += 1
        # the hub's Retry-After is its own estimate of when it can take the batch (an overloaded
        # hub spreads it over its senders): honour it as given rather than escalating the backoff,
        # so that senders it shed come back as soon as it asked, and not seconds later
        if retry_after is not None:
            delay = min(max(retry_after, self.backoff.initial), self.backoff.max_retry_after)
        else:
            delay = self.backoff.delay(self._failures, self.rng)
        self._next_attempt = self.clock() + delay
        if self._failures == 1:
            log.warning("cannot deliver to %s (%s); spooling and retrying with backoff", self.url, why)
        else:
            log.debug(
                "delivery attempt %d to %s failed (%s); next in %.1fs", self._failures, self.url, why, delay
            )


def _content_type(body: bytes) -> str:
    return FRAME_CONTENT_TYPE if is_frame(body) else JSON_CONTENT_TYPE


def _hub_message(resp: httpx.Response) -> str:
    """The hub's ``{"error": ..., "field": ...}`` as one line, or the start of the body."""
    try:
        obj = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and "error" in obj:
        field = obj.get("field")
        return f"{field}: {obj['error']}" if field else str(obj["error"])
    text = resp.text.strip().replace("\n", " ")
    return text[:300] or resp.reason_phrase


def _retry_after(resp: httpx.Response) -> float | None:
    return retry_after_seconds(resp.headers.get("retry-after"))


def retry_after_seconds(raw: str | bytes | None) -> float | None:
    """``Retry-After`` in seconds; the HTTP-date form is rare from an ingest API and ignored."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value >= 0 else None
