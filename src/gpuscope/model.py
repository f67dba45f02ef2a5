"""The records that flow between stages: telemetry frames, events, training records, findings, alerts.

Every stage speaks these types, so a collector, the simulator, the HTTP ingest path and the
detectors stay independent of each other (the seams of DESIGN §1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

Labels = dict[str, str]
FloatArray = npt.NDArray[np.float64]

#: Label keys that say *who uses* an entity rather than *which* entity it is. They are stored per
#: row, not as part of the entity's identity, so a GPU keeps one series while jobs come and go.
ATTRIBUTION_LABELS: frozenset[str] = frozenset({"job", "pod", "container", "namespace"})
#: what a label key may be (as in Prometheus, and at most 64 characters)
LABEL_KEY_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")
#: 9999-12-31T23:59:59Z: anything later is milliseconds sent as seconds, or garbage.
MAX_TIMESTAMP = 253_402_300_799.0


def entity_key(labels: Labels) -> tuple[tuple[str, str], ...]:
    """A hashable identity for a label set (attribution labels excluded)."""
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ATTRIBUTION_LABELS))


@dataclass(slots=True)
class Frame:
    """Columnar telemetry: one timestamp, many entities, many metrics.

    GPU telemetry is sampled together, so a node's tick is one frame: ``values[i, j]`` is metric
    ``metrics[j]`` of entity ``entities[i]``; NaN means "not reported".
    """

    ts: float
    metrics: list[str]
    entities: list[Labels]
    values: FloatArray
    #: set by the frame decoder: two frames with the same layout number have equal ``metrics``
    #: and ``entities`` (a sender repeats its layout every tick), so what derives from those alone
    #: may be cached by it; numbers are never reused. None: unknown, derive afresh. Whoever
    #: changes a frame's metrics or entities sets it to None (and gives it a new metrics list,
    #: not the old one changed in place: see :func:`positions`).
    layout: int | None = None
    #: the metric positions of a frame without a layout number, with the list they were read from
    _positions: tuple[list[str], dict[str, int]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def sample_count(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.values)))

    def column(self, metric: str) -> FloatArray | None:
        """The values of one metric across the frame's entities, or None when absent."""
        j = positions(self).get(metric)
        return None if j is None else self.values[:, j]


#: metric positions by :attr:`Frame.layout` (:func:`positions`): every stage that reads a frame's
#: columns by name finds them here, once per layout; bounded (senders with ever-new layouts start
#: it afresh)
_by_layout: dict[int, dict[str, int]] = {}
MAX_LAYOUTS = 16_384


def positions(frame: Frame) -> dict[str, int]:
    """Where each metric is among ``frame``'s columns (the first of a name given twice; ingest
    refuses those). A scan of the metric list per look-up costs more than the rest of a frame's
    numpy work, and the engine, its detectors and the productivity model look several up a frame,
    so the positions are kept per layout number (a decoded frame's metrics are the same every tick
    for its layout); a frame without one keeps its own, for as long as it has the same metrics
    list. Shared: read it, never change it."""
    if frame.layout is not None:
        known = _by_layout.get(frame.layout)
        if known is None:
            if len(_by_layout) >= MAX_LAYOUTS:
                _by_layout.clear()
            known = _by_layout[frame.layout] = _scan(frame.metrics)
        return known
    own = frame._positions
    if own is None or own[0] is not frame.metrics:
        own = frame._positions = (frame.metrics, _scan(frame.metrics))
    return own[1]


def _scan(metrics: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j, metric in enumerate(metrics):
        out.setdefault(metric, j)
    return out


@dataclass(slots=True)
class Event:
    """A typed, timestamped fact (XID, checkpoint completed, job started, heartbeat, ...)."""

    ts: float
    kind: str
    labels: Labels
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class TrainingRecord:
    """What one rank of a training job reports for one step."""

    ts: float
    job: str
    rank: int
    step: int
    metrics: dict[str, float]
    labels: Labels = field(default_factory=dict)


@dataclass(slots=True)
class Batch:
    """What one sender (an agent, an SDK process, the simulator) delivers in one request."""

    source: str
    frames: list[Frame] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    training: list[TrainingRecord] = field(default_factory=list)
    batch_id: str | None = None
    #: set by the frame decoder: the binary frame the batch was decoded from, which decodes to an
    #: equal batch again. The durable store keeps it as the batch's ingest-log record instead of
    #: encoding one; the hub drops it once the batch is stored (the observers read the batch).
    #: Whoever changes a decoded batch sets it to None.
    wire: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def sample_count(self) -> int:
        return sum(f.sample_count for f in self.frames)


@dataclass(slots=True)
class Finding:
    """A detector's statement that a rule's condition holds for an entity at evaluation time."""

    rule: str
    entity: Labels
    summary: str
    value: float | None = None
    affected_gpus: int = 1
    details: dict[str, Any] = field(default_factory=dict)
    #: a tier graver than the rule's own, when the condition has grown into it (None: the rule's)
    severity: str | None = None
    #: the share of the affected GPUs' work at risk, when the detector measures it (None: the rule's)
    at_risk: float | None = None
    #: how many times the condition has grown materially worse since it began (a detector that
    #: follows a changing fault counts them); the alert layer notifies again each time it grows
    stage: int = 0

    @property
    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (self.rule, tuple(sorted(self.entity.items())))


@dataclass(slots=True)
class Alert:
    """One alert per rule and entity while its condition holds; resolved when it clears."""

    id: str
    rule: str
    severity: str
    owner: str
    entity: Labels
    started_at: float
    summary: str
    cost_per_hour: float
    resolved_at: float | None = None
    last_seen: float = 0.0
    incident: str | None = None
    value: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def firing(self) -> bool:
        return self.resolved_at is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "severity": self.severity,
            "owner": self.owner,
            "entity": dict(self.entity),
            "started_at": self.started_at,
            "resolved_at": self.resolved_at,
            "last_seen": self.last_seen,
            "summary": self.summary,
            "cost_per_hour": self.cost_per_hour,
            "incident": self.incident,
            "value": self.value,
            "details": self.details,
        }
