"""GPU-seconds per state and cause, kept as rollups: per-minute buckets for the recent past, folded
into per-hour buckets (without the GPU index) once older, and dropped past the retention.

A bucket is a dict of ``[seconds, lost]`` lists while frames count into it; once past
:data:`CLOSE_AFTER_S` it is closed into :class:`Cells` (its slots in a tuple, its figures in one
float64 array: about 24 bytes a cell instead of about 200), and opened again should a late frame
or a recount reach it. The figures are the same floats either way.

The hub persists them through the store (:meth:`Ledger.unsaved` once a minute: the minute cells
changed since; the store folds its own minute cells into hours the same way) and reads them back at
start (:meth:`Ledger.load`), so history survives a restart and hubs sharing a store share it."""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpuscope.productivity.states import CAUSES, DEGRADED, STATES, WASTE_STATES, owner_of, state_of
from gpuscope.store.base import GpuTime

GROUPINGS: tuple[str, ...] = ("fleet", "node", "job", "team", "service")
MINUTE = 60.0
HOUR = 3600.0
#: minute buckets older than this fold into hour buckets
MINUTES_KEPT_S = 2 * HOUR
#: a minute bucket this old (an hour bucket this long after its last minute folded in) is closed:
#: frames count into the last minute or two, and a recount reaches back one stall at most
CLOSE_AFTER_S = 5 * MINUTE
RETENTION_S = 31 * 24 * HOUR


@dataclass(frozen=True, slots=True)
class Slot:
    """Who a GPU-second belongs to and why it is in its state (``gpu`` is '' once rolled up)."""

    node: str
    gpu: str
    job: str
    team: str
    service: str
    cause: str
    #: the hash a frozen dataclass would compute on every use, computed once: a slot is looked up
    #: in the minute buckets and the dirty set for every GPU of every frame
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_hash", hash((self.node, self.gpu, self.job, self.team, self.service, self.cause))
        )

    def __hash__(self) -> int:
        return self._hash

    def group(self, by: str) -> str:
        if by == "fleet":
            return "fleet"
        return str(getattr(self, by))


Bucket = dict[Slot, list[float]]  # [seconds, lost seconds]


class Cells:
    """A closed bucket: what a :data:`Bucket` holds, its slots in a tuple and their figures in one
    array (``[seconds, lost]`` of slot ``i`` at ``2i``, ``2i + 1``)."""

    __slots__ = ("figures", "slots")

    def __init__(self, bucket: Bucket, same: dict[Slot, Slot] | None = None) -> None:
        #: ``same``: slots already held elsewhere, reused for equal ones (one object, not one per hour)
        self.slots = tuple(bucket) if same is None else tuple(same.get(s, s) for s in bucket)
        self.figures = array("d", [x for cell in bucket.values() for x in cell])

    def __len__(self) -> int:
        return len(self.slots)

    def items(self) -> Iterator[tuple[Slot, tuple[float, float]]]:
        figures = self.figures
        for i, slot in enumerate(self.slots):
            yield slot, (figures[2 * i], figures[2 * i + 1])

    def opened(self) -> Bucket:
        figures = self.figures
        return {slot: [figures[2 * i], figures[2 * i + 1]] for i, slot in enumerate(self.slots)}


def _new_bucket() -> Bucket:
    return defaultdict(lambda: [0.0, 0.0])


def _open(buckets: dict[int, Bucket | Cells], key: int) -> Bucket:
    """The bucket at ``key`` to count into: made when missing, opened when closed."""
    bucket = buckets.get(key)
    if bucket is None or isinstance(bucket, Cells):
        opened = buckets[key] = _new_bucket()
        if bucket is not None:
            opened.update(bucket.opened())
        return opened
    return bucket


#: causes whose seconds carry no lost share (only degraded seconds are partly lost)
_LOSSLESS = frozenset(c for c, spec in CAUSES.items() if spec.state != DEGRADED)


class Ledger:
    def __init__(self) -> None:
        self.minutes: dict[int, Bucket | Cells] = {}
        self.hours: dict[int, Bucket | Cells] = {}
        self.latest = -math.inf
        #: minute cells changed since :meth:`unsaved` last ran
        self._dirty: set[tuple[int, Slot]] = set()
        #: figures of changed minute cells folded into hours before they were saved
        self._folded_unsaved: list[GpuTime] = []

    def add(self, start: float, end: float, slot: Slot, lost_fraction: float = 0.0) -> None:
        """Count ``(start, end]`` of one GPU in ``slot`` (split at minute boundaries)."""
        # one frame's interval: almost always within one minute
        if start < end and end <= ((minute := math.floor(start / MINUTE)) + 1) * MINUTE:
            bucket = self.minutes.get(minute)
            if bucket is None or isinstance(bucket, Cells):
                bucket = _open(self.minutes, minute)
            cell = bucket[slot]
            cell[0] += end - start
            cell[1] += (end - start) * lost_fraction
            self._dirty.add((minute, slot))
            self.latest = max(self.latest, end)
            return
        t = start
        while t < end:
            minute = math.floor(t / MINUTE)
            upto = min(end, (minute + 1) * MINUTE)
            cell = _open(self.minutes, minute)[slot]
            cell[0] += upto - t
            cell[1] += (upto - t) * lost_fraction
            self._dirty.add((minute, slot))
            t = upto
        self.latest = max(self.latest, end)

    def move(self, start: float, end: float, old: Slot, new: Slot) -> float:
        """Recount what ``old`` holds of ``(start, end]`` as ``new`` (a state learned late, such as
        a stall known only some seconds after the last step); only minute buckets can be amended.
        Returns the seconds moved."""
        moved = 0.0
        for minute in range(math.floor(start / MINUTE), math.floor(end / MINUTE) + 1):
            if minute not in self.minutes:
                continue
            bucket = _open(self.minutes, minute)
            cell = bucket.get(old)
            if cell is None or cell[0] <= 0:
                continue
            overlap = min(end, (minute + 1) * MINUTE) - max(start, minute * MINUTE)
            secs = min(max(overlap, 0.0), cell[0])
            share = secs / cell[0]
            lost = cell[1] * share
            cell[0] -= secs
            cell[1] -= lost
            target = bucket[new]
            target[0] += secs
            target[1] += 0.0 if new.cause in _LOSSLESS else lost
            self._dirty.update(((minute, old), (minute, new)))
            moved += secs
        return moved

    def fold(self, now: float) -> None:
        """Roll minute buckets older than :data:`MINUTES_KEPT_S` into hours; apply the retention;
        close the buckets past :data:`CLOSE_AFTER_S`."""
        for minute in [m for m in self.minutes if (m + 1) * MINUTE < now - MINUTES_KEPT_S]:
            hour = _open(self.hours, math.floor(minute * MINUTE / HOUR))
            for slot, (secs, lost) in self.minutes.pop(minute).items():
                if (minute, slot) in self._dirty:
                    self._dirty.discard((minute, slot))
                    self._folded_unsaved.append(_cell(minute, slot, secs, lost))
                cell = hour[Slot(slot.node, "", slot.job, slot.team, slot.service, slot.cause)]
                cell[0] += secs
                cell[1] += lost
        for hour_key in [h for h in self.hours if (h + 1) * HOUR < now - RETENTION_S]:
            del self.hours[hour_key]
        self._close(now)

    def _close(self, now: float) -> None:
        for m, bucket in self.minutes.items():
            if not isinstance(bucket, Cells) and (m + 1) * MINUTE < now - CLOSE_AFTER_S:
                self.minutes[m] = Cells(bucket)
        for h in sorted(self.hours):
            bucket = self.hours[h]
            if not isinstance(bucket, Cells) and (h + 1) * HOUR < now - MINUTES_KEPT_S - CLOSE_AFTER_S:
                # an hour's slots are mostly the hour before's (the same node, job and cause)
                before = self.hours.get(h - 1)
                same = {s: s for s in before.slots} if isinstance(before, Cells) else None
                self.hours[h] = Cells(bucket, same)

    def unsaved(self) -> list[GpuTime]:
        """The minute cells changed since the last call, with their figures now (to be saved)."""
        out, self._folded_unsaved = self._folded_unsaved, []
        for minute, slot in self._dirty:
            secs, lost = _open(self.minutes, minute)[slot]
            out.append(_cell(minute, slot, secs, lost))
        self._dirty.clear()
        return out

    def not_saved(self, cells: list[GpuTime]) -> None:
        """Cells :meth:`unsaved` gave out that could not be saved: they are given out again."""
        for c in cells:
            minute = math.floor(c.bucket / MINUTE)
            slot = Slot(c.node, c.gpu, c.job, c.team, c.service, c.cause)
            if minute in self.minutes and slot in _open(self.minutes, minute):
                self._dirty.add((minute, slot))  # still here: its figures then, whatever they are
            else:
                self._folded_unsaved.append(c)

    def load(self, cells: list[GpuTime]) -> None:
        """Take in stored cells (at start, before anything is counted: they replace what this
        ledger has for them, so loading twice counts nothing twice)."""
        for c in cells:
            slot = Slot(c.node, c.gpu, c.job, c.team, c.service, c.cause)
            buckets = self.hours if c.res == int(HOUR) else self.minutes
            _open(buckets, math.floor(c.bucket / c.res))[slot] = [c.seconds, c.lost]

    def _buckets(self, start: float, end: float) -> list[Bucket | Cells]:
        """Buckets overlapping ``[start, end)``: whole buckets (rollup resolution)."""
        out = [b for m, b in self.minutes.items() if m * MINUTE < end and (m + 1) * MINUTE > start]
        out += [b for h, b in self.hours.items() if h * HOUR < end and (h + 1) * HOUR > start]
        return out

    def summary(self, by: str, start: float, end: float, price_per_gpu_hour: float) -> list[dict[str, Any]]:
        """GPU-hours and dollars per state and cause for each group, largest waste first."""
        if by not in GROUPINGS:
            raise ValueError(f"by must be one of {', '.join(GROUPINGS)}")
        totals: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
        for bucket in self._buckets(start, end):
            for slot, (secs, lost) in bucket.items():
                group = slot.group(by)
                if not group:
                    continue
                cell = totals[group][slot.cause]
                cell[0] += secs
                cell[1] += lost
        rows = [_group_row(group, causes, price_per_gpu_hour) for group, causes in totals.items()]
        rows.sort(key=lambda r: (-r["waste"]["gpu_hours"], r["group"]))
        return rows


def _cell(minute: int, slot: Slot, secs: float, lost: float) -> GpuTime:
    s = slot
    return GpuTime(int(MINUTE), minute * MINUTE, s.node, s.gpu, s.job, s.team, s.service, s.cause, secs, lost)


def _money(gpu_hours: float, price: float) -> dict[str, float]:
    return {"gpu_hours": round(gpu_hours, 4), "dollars": round(gpu_hours * price, 2)}


def _group_row(group: str, causes: dict[str, list[float]], price: float) -> dict[str, Any]:
    states: dict[str, dict[str, Any]] = {
        s: {**_money(0.0, price), "lost_gpu_hours": 0.0, "causes": {}} for s in STATES
    }
    waste = 0.0
    total = 0.0
    for cause, (secs, lost) in sorted(causes.items()):
        state = state_of(cause)
        hours, lost_h = secs / HOUR, lost / HOUR
        row = states[state]
        row["gpu_hours"] = round(row["gpu_hours"] + hours, 4)
        row["dollars"] = round(row["gpu_hours"] * price, 2)
        row["lost_gpu_hours"] = round(row["lost_gpu_hours"] + lost_h, 4)
        wasted = hours if state in WASTE_STATES else lost_h
        row["causes"][cause] = {
            **_money(hours, price),
            "owner": owner_of(cause),
            "waste_gpu_hours": round(wasted, 4),
            "waste_dollars": round(wasted * price, 2),
        }
        total += hours
        waste += wasted
    return {"group": group, **_money(total, price), "states": states, "waste": _money(waste, price)}
