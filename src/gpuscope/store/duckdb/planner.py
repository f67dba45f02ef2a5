"""Choosing, for each part of a query range, the table to read: raw rows, 1-minute or 1-hour rollups.

A long range reads rollups (few rows), a short one raw rows (full resolution). Rollups only
exist up to their watermark and raw rows only back to the retention cut, so one range can span
tiers; the planner splits it into segments, each read from the best tier that has its data, and
uses a rollup only for whole buckets inside the range.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    res: int  # bucket width in ms; 0 for raw rows
    lo: int | None  # first covered ms (None: from the beginning)
    hi: int | None  # first ms not covered (None: up to now)

    def covers(self, x: int) -> bool:
        return (self.lo is None or self.lo <= x) and (self.hi is None or x < self.hi)


def _ceil(x: int, res: int) -> int:
    return -(-x // res) * res


def _usable_end(tier: Tier, x: int, end: int) -> int:
    """How far from ``x`` the tier can serve: rollups only whole buckets before ``end``."""
    if not tier.covers(x):
        return x
    hi = end if tier.hi is None else min(end, tier.hi)
    if tier.res:
        return x if x % tier.res else hi // tier.res * tier.res
    return hi


def plan(start: int, end: int, step: int, tiers: list[Tier]) -> list[tuple[Tier, int, int]]:
    """Segments ``(tier, a, b)`` covering ``[start, end)`` (ms).

    Preference: the coarsest tier whose buckets fit in ``step``, then finer ones, then coarser
    ones (better a coarse answer than none where raw rows were already deleted).
    """
    fitting = sorted((t for t in tiers if t.res <= step), key=lambda t: -t.res)
    coarser = sorted((t for t in tiers if t.res > step), key=lambda t: t.res)
    pref = fitting + coarser
    out: list[tuple[Tier, int, int]] = []
    x = start
    while x < end:
        chosen: tuple[int, Tier, int] | None = None
        for i, tier in enumerate(pref):
            stop = _usable_end(tier, x, end)
            if stop > x:
                chosen = (i, tier, stop)
                break
        if chosen is None:
            x = _next_start(x, end, tiers)
            continue
        i, tier, stop = chosen
        for better in pref[:i]:  # switch as soon as a preferred tier becomes usable
            if better.hi is not None and better.hi <= x:
                continue
            cands = [better.lo] if better.lo is not None and better.lo > x else []
            if better.res:
                cands.append(_ceil(max(x + 1, better.lo or x), better.res))
            for c in cands:
                if x < c < stop:
                    stop = c
        if out and out[-1][0] is tier and out[-1][2] == x:
            out[-1] = (tier, out[-1][1], stop)
        else:
            out.append((tier, x, stop))
        x = stop
    return out


def _next_start(x: int, end: int, tiers: list[Tier]) -> int:
    """The next point after ``x`` where some tier could serve (its start, or a bucket edge)."""
    cands = [end]
    for t in tiers:
        if t.hi is not None and t.hi <= x:
            continue
        if t.lo is not None and t.lo > x:
            cands.append(_ceil(t.lo, t.res) if t.res else t.lo)
        elif t.res:
            cands.append(_ceil(x + 1, t.res))
    return min(cands)
