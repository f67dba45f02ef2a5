"""Grouping alerts into incidents through the entity graph and time, root cause first.

One fault raises alerts on several layers (a lost GPU, the rank that ran on it, the job that
stalled). Alerts are linked when they share a node, a GPU, a job or a service: a rank alert names
its job, node and GPU; a job alert may list the nodes it runs on in ``details["links"]`` (a list of
label sets). An alert joins every incident it links to that started at most ``window`` seconds
before it (several such incidents merge into the oldest), unless that incident had already ended
(every member resolved) more than ``reopen_within`` seconds earlier: a new fault in the same place
after the last one was fixed is a new incident. Nor does it join an incident whose root cause has
resolved unless it touches the root's own places (a fault elsewhere is not that root's knock-on),
and when it links to incidents whose root still fires it joins only those. The root cause is the
alert on the lowest layer (GPU < node < rank < job < service), the gravest tier, the earliest. A
GPU's alert that names the job it serves is on the GPU layer: a GPU slower than its speed group
from the start (``slow_placement`` of that GPU) is the cause of its ranks' placement, which names
the job only. A standing condition (a placement: :func:`gpuscope.rules.standing`) is no live
fault, so it is the root only when no live fault shares its incident: a job that stalls beside
its slow GPU has the stall, not the placement, as the thing to act on.

Two alerts of a condition that has held since the job started (a placement, or a GPU that has been
a faulty part from its start: ``details["since_start"]``) join by what they name, however far apart
they fire: the same job and a GPU both name (the ranks' placement lists the GPUs its slow ranks run
on as its links). A slow GPU's pace is learned from its first 300 clean readings, 50 minutes where
the hub evaluates every 10 s, and ranks that join late or lag little are grouped late, so the time
window alone made one slow part two incidents. Only such alerts join this way: a
live fault elsewhere, or later on that GPU, still starts (and roots) its own incident.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuscope.model import Alert, Labels
from gpuscope.rules import standing

LAYERS = ("gpu", "node", "rank", "job", "service", "other")


def layer(entity: Labels) -> int:
    """Position of an entity in the graph, lowest (the hardware) first."""
    if "service" in entity:
        return 4
    if "rank" in entity:
        return 2
    if "gpu" in entity:
        return 0  # a GPU's alert may name the job it serves (a slow part): it is still about the GPU
    if "job" in entity:
        return 3
    if "node" in entity:
        return 1
    return 5


def link_keys(entity: Labels, links: Any = None) -> set[str]:
    """The graph vertices an alert touches: its own labels and those of its declared links."""
    label_sets: list[Labels] = [entity]
    if isinstance(links, list):
        label_sets.extend(x for x in links if isinstance(x, dict))
    keys: set[str] = set()
    for labels in label_sets:
        node = labels.get("node")
        if node:
            keys.add(f"node:{node}")
            gpu = labels.get("gpu")
            if gpu:
                keys.add(f"gpu:{node}/{gpu}")
        for kind in ("job", "service"):
            value = labels.get(kind)
            if value:
                keys.add(f"{kind}:{value}")
    return keys


def since_start(alert: Alert) -> bool:
    """Has the alert's condition held since its job started (a placement, a part faulty from its
    start)? Such alerts of one job and GPU are one cause whenever they fire."""
    return standing(alert.rule) or alert.details.get("since_start") is True


def named_gpus(alert: Alert) -> set[str]:
    """The GPU vertices an alert names itself (its labels and links, not the places of its job)."""
    return {k for k in link_keys(alert.entity, alert.details.get("links")) if k.startswith("gpu:")}


def job_of(alert: Alert) -> str | None:
    """The job an alert names: a label, or (a GPU's alert) its details."""
    job = alert.entity.get("job", alert.details.get("job"))
    return job if isinstance(job, str) and job else None


def describe(entity: Labels) -> str:
    """A short human name for an entity: ``node-1 GPU 3``, ``job llm rank 5``."""
    if "service" in entity:
        return f"service {entity['service']}"
    if "rank" in entity:
        return f"job {entity.get('job', '?')} rank {entity['rank']}"
    if "gpu" in entity:
        return f"{entity.get('node', '?')} GPU {entity['gpu']}"
    if "job" in entity:
        return f"job {entity['job']}"
    if "node" in entity:
        return f"node {entity['node']}"
    return ", ".join(f"{k}={v}" for k, v in sorted(entity.items())) or "cluster"


def _number(alert_id: str) -> int:
    tail = alert_id.rpartition("-")[2]
    return int(tail) if tail.isdecimal() else 0


@dataclass(slots=True)
class Incident:
    id: str
    root: str  # id of the root-cause alert
    members: list[str]  # alert ids, in the order they joined
    started_at: float
    resolved_at: float | None
    title: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "root": self.root,
            "members": list(self.members),
            "started_at": self.started_at,
            "resolved_at": self.resolved_at,
            "title": self.title,
        }


@dataclass(slots=True)
class _Group:
    id: str
    seq: int
    members: list[Alert] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)
    #: the GPU vertices its members named when they joined (its entries in ``_by_gpu``)
    gpus: set[str] = field(default_factory=set)

    @property
    def started_at(self) -> float:
        return min(a.started_at for a in self.members)

    def ended_before(self, ts: float) -> bool:
        """Were all members resolved, the last one before ``ts``?"""
        return all(a.resolved_at is not None and a.resolved_at < ts for a in self.members)

    def root_over_elsewhere(self, ts: float, keys: set[str]) -> bool:
        """Had the root cause resolved by ``ts``, and does an alert touching ``keys`` share none of
        the root's own places? Then it is a new fault, whatever knock-on alerts still fire here."""
        root = self.root()
        if root.resolved_at is None or root.resolved_at > ts:
            return False
        return not keys & link_keys(root.entity, root.details.get("links"))

    def root(self) -> Alert:
        # Live faults before standing conditions; then lowest layer first; on one layer the graver
        # fault (P1 before P2) is the likelier cause.
        return min(
            self.members,
            key=lambda a: (standing(a.rule), layer(a.entity), a.severity, a.started_at, _number(a.id)),
        )

    def snapshot(self) -> Incident:
        root = self.root()
        title = f"{root.rule} on {describe(root.entity)}"
        if len(self.members) > 1:
            title += f" (+{len(self.members) - 1} related)"
        firing = any(a.resolved_at is None for a in self.members)
        resolved = None if firing else max(a.resolved_at or 0.0 for a in self.members)
        return Incident(self.id, root.id, [a.id for a in self.members], self.started_at, resolved, title)


class IncidentTracker:
    """Assigns each fired alert to an incident (setting ``Alert.incident``)."""

    def __init__(self, window: float = 600.0, reopen_within: float = 120.0) -> None:
        if window < 0 or reopen_within < 0:
            raise ValueError(
                f"incident window and reopen time must not be negative, got {window}, {reopen_within}"
            )
        self.window = window
        self.reopen_within = reopen_within
        self._groups: dict[str, _Group] = {}
        self._by_key: dict[str, set[str]] = {}
        #: GPU vertex -> incidents with a member naming it, whatever their age (see :meth:`_same_cause`)
        self._by_gpu: dict[str, set[str]] = {}
        self._seq = 0

    def add(self, alert: Alert, places: list[Labels] | None = None) -> str:
        """File a newly fired alert; returns its incident id. ``places`` are where a job or service
        alert runs (:mod:`gpuscope.alert.topology`), linking it to hardware alerts there."""
        links = alert.details.get("links")
        keys = link_keys(alert.entity, [*(links if isinstance(links, list) else []), *(places or [])])
        joined: set[str] = set()
        for key in keys:
            ids = self._by_key.get(key)
            if not ids:
                continue
            for gid in list(ids):
                group = self._groups[gid]
                if alert.started_at - group.started_at > self.window:
                    ids.discard(gid)  # too old to take new members through this vertex
                elif group.root_over_elsewhere(alert.started_at, keys):
                    continue
                elif not group.ended_before(alert.started_at - self.reopen_within):
                    joined.add(gid)
        joined |= self._same_cause(alert)
        live = {g for g in joined if self._groups[g].root().resolved_at is None}
        if live:  # incidents whose root cause still fires are likelier causes; ended roots stay apart
            joined = live
        if joined:
            group = min((self._groups[g] for g in joined), key=lambda g: g.seq)
            for gid in joined - {group.id}:
                self._merge(group, self._groups.pop(gid))
        else:
            self._seq += 1
            group = self._groups[f"inc-{self._seq}"] = _Group(f"inc-{self._seq}", self._seq)
        group.members.append(alert)
        self._index(group, keys)
        self._index_gpus(group, named_gpus(alert))
        alert.incident = group.id
        return group.id

    def _same_cause(self, alert: Alert) -> set[str]:
        """Incidents, of any age, with a firing member that has held since the job started, as
        ``alert`` has, in the same job and naming a GPU it names: one slow part seen twice."""
        job = job_of(alert)
        if job is None or not since_start(alert):
            return set()
        out: set[str] = set()
        for key in named_gpus(alert):
            for gid in self._by_gpu.get(key, ()):
                if any(
                    since_start(m)
                    and (m.resolved_at is None or m.resolved_at > alert.started_at)
                    and job_of(m) == job
                    and key in named_gpus(m)
                    for m in self._groups[gid].members
                ):
                    out.add(gid)
        return out

    def _merge(self, into: _Group, other: _Group) -> None:
        for alert in other.members:
            alert.incident = into.id
        into.members.extend(other.members)
        for key in other.keys:
            self._by_key[key].discard(other.id)
        self._index(into, other.keys)
        for key in other.gpus:
            self._by_gpu[key].discard(other.id)
        self._index_gpus(into, other.gpus)

    def _index_gpus(self, group: _Group, gpus: set[str]) -> None:
        group.gpus |= gpus
        for key in gpus:
            self._by_gpu.setdefault(key, set()).add(group.id)

    def _index(self, group: _Group, keys: set[str]) -> None:
        group.keys |= keys
        for key in keys:
            self._by_key.setdefault(key, set()).add(group.id)

    def forget(self, ended_before: float, alerts: int) -> list[Alert]:
        """Forget the oldest incidents whose every alert had resolved before ``ended_before``, until
        at least ``alerts`` of their alerts are gone; returns the alerts forgotten. Pass a time at
        least ``reopen_within`` ago: no alert firing from then on could join such an incident."""
        gone: list[Alert] = []
        for group in sorted(self._groups.values(), key=lambda g: g.seq):
            if len(gone) >= alerts:
                break
            if not group.ended_before(ended_before):
                continue
            del self._groups[group.id]
            for key in group.keys:
                ids = self._by_key.get(key)
                if ids is not None:
                    ids.discard(group.id)
                    if not ids:
                        del self._by_key[key]
            for key in group.gpus:
                ids = self._by_gpu.get(key)
                if ids is not None:
                    ids.discard(group.id)
                    if not ids:
                        del self._by_gpu[key]
            gone.extend(group.members)
        return gone

    def incidents(self) -> list[Incident]:
        """Every incident, oldest first, as of now."""
        return [g.snapshot() for g in sorted(self._groups.values(), key=lambda g: g.seq)]

    def get(self, incident_id: str) -> Incident | None:
        group = self._groups.get(incident_id)
        return None if group is None else group.snapshot()
