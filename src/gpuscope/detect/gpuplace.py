"""A GPU slower than its speed group from its start: a ``slow_placement`` of one GPU, not a live fault.

:class:`~gpuscope.detect.gpupace.OwnPace` takes a part that runs a few per cent slower from the
start as its own normal, so ``gpu_underperforming`` stays quiet on it; the job still runs at that
GPU's pace (a synchronous job waits for its slowest GPU). This is judged once, when the GPU's pace
is learned: its lag is the median learned pace of its job's speed group less its own, and it is a
placement when that lag is at least ``min_lag`` and ``spread_k`` times the group's robust spread
(1.4826 x the MAD of the paces, the normal sigma); the median and the MAD are not moved by the slow
GPU itself. ``min_lag`` (4 %) sits above the tail of one model's part-to-part spread: with parts
1 % apart (sigma), a healthy part at 2.5 sigma plus its wander while its pace is learned lags by up
to 3.5 %. ``spread_k`` (2.5) keeps a group whose parts spread wider from reporting its ordinary
tail; it is not larger because the MAD of 16 paces alone misjudges the sigma by up to 1.6x, and a
larger factor then hides a 5 % part in a group 1 % apart. Only an offset from the start counts:
the mean of the GPU's first ``early`` readings must lag by half the bar too (a GPU that slowed down
while its pace was learned has a live fault, not a placement). The verdict holds, without being
judged again, until the GPU leaves the job or its speed group (its pace is then learned again), so
it is one alert that resolves when the job ends.

A lag as large as the pace's ``max_pace`` (10 %) or more is no slower bin but a faulty part
(:meth:`GpuPlacement.broken`): it costs the job what the same slowdown arising later costs, and
the operator's action is the same (drain or replace the GPU, or move the job), so the clock
detector raises it as ``gpu_underperforming`` (P2), once, and no placement. A part that far behind
is judged so from its first ``early`` readings already, and the verdict holds: judged only when its
pace was learned (300 readings, 50 minutes where evaluations come 10 s apart), a 1.15x part was
first judged against its pace held at the bound, where the fast path fires and clears, and then
raised again, two P2s for one part. Before that, such a part was both a P3 placement and, once the
evidence for the rest of its lag past the pace's bound built up, a P2 (a part 1.15x slower after about
560 s; 1.11-1.12x never).
"""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.frames import BoolArray
from gpuscope.detect.gpupace import OwnPace
from gpuscope.detect.vectors import IntArray, grow
from gpuscope.model import FloatArray

#: 1 / Phi^-1(0.75): the MAD of a normal sample times this is its sigma
_MAD_SIGMA = 1.4826


class GpuPlacement:
    """Per GPU id: its lag behind its speed group when its pace was learned (NaN: no placement)."""

    def __init__(self, min_lag: float = 0.04, spread_k: float = 2.5, min_group: int = 4) -> None:
        self.min_lag, self.spread_k, self.min_group = min_lag, spread_k, min_group
        #: per GPU, its lag (log ratio of its group's median pace to its own) while it is placed
        self.lag: FloatArray = np.zeros(0)
        #: per GPU, its lag as reported (from :attr:`OwnPace.level`, unclipped: the cost it causes)
        self.shown: FloatArray = np.zeros(0)
        #: per GPU, judged a faulty part from its first ``early`` readings (the verdict holds)
        self.faulty: BoolArray = np.zeros(0, bool)
        self._job: FloatArray = np.zeros(0)
        self._group: FloatArray = np.zeros(0)

    def update(
        self, pace: OwnPace, newly: BoolArray, job: IntArray, group: IntArray, first: BoolArray | None = None
    ) -> BoolArray:
        """Judge the GPUs whose pace was ``newly`` learned, and those whose ``first`` readings just
        gave their pace for a faulty part; drop those that left their job or group. Returns the GPUs
        that are a slow placement (faulty parts among them: :meth:`broken`)."""
        n = len(job)
        self.lag, self.shown = grow(self.lag, n), grow(self.shown, n)
        faulty = np.zeros(max(n, len(self.faulty)), bool)
        faulty[: len(self.faulty)] = self.faulty
        self.faulty = faulty
        self._job, self._group = grow(self._job, n, -1.0), grow(self._group, n, -1.0)
        lag = self.lag[:n]
        left = (self._job[:n] != job) | (self._group[:n] != group)
        lag[left] = math.nan
        self.faulty[:n][left] = False
        if first is not None:
            self._judge(pace, first, job, group, early=True)
        self._judge(pace, newly, job, group, early=False)
        out: BoolArray = np.isfinite(lag)
        return out

    def _judge(self, pace: OwnPace, newly: BoolArray, job: IntArray, group: IntArray, early: bool) -> None:
        """Judge the ``newly`` learned GPUs (``early``: newly known, for a faulty part only)."""
        n = len(job)
        lag = self.lag[:n]
        faulty = self.faulty[:n]
        known = pace.count[:n] >= pace.early
        for j, g in {(int(a), int(b)) for a, b in zip(job[newly], group[newly], strict=True)}:
            if j < 0 or g < 0:
                continue
            peers = known & (job == j) & (group == g)
            if int(peers.sum()) < self.min_group:
                continue
            paces = pace.pace[:n][peers]
            middle = float(np.median(paces))
            spread = _MAD_SIGMA * float(np.median(np.abs(paces - middle)))
            bar = max(self.min_lag, self.spread_k * spread)
            ids = np.flatnonzero(newly & (job == j) & (group == g))
            behind = middle - pace.pace[:n][ids]
            start = middle - pace.first[:n][ids]
            placed = (behind >= bar) & (start >= bar / 2.0)
            if early:
                # past the pace's bound from its first readings: a faulty part from then on, one
                # verdict (judged only when its pace is learned, it was first judged against its pace
                # held at the bound, where the fast path fires and clears, then raised again)
                placed &= behind >= pace.max_pace
                faulty[ids[placed]] = True
            # a faulty part stays one, whatever its learned pace says; its lag is the learned one
            placed |= faulty[ids]
            lag[ids[placed]] = behind[placed]
            # the judging above uses the pace, clipped at 15 % around the group's reference so no
            # outlier moves it; that clip cut the lag of a part past 1.15x (a 1.2x part read 13.9 %,
            # not 16.7 %), and its cost with it
            level = pace.level[:n]
            self.shown[ids[placed]] = float(np.median(level[peers])) - level[ids[placed]]
            self._job[ids], self._group[ids] = j, g

    def broken(self, pace: OwnPace, n: int) -> BoolArray:
        """Of the placed GPUs, those whose lag is past what a part's own pace may be (``max_pace``):
        a faulty part from the start, a live fault rather than a placement."""
        lag = self.lag[:n]
        out: BoolArray = np.isfinite(lag) & ((lag >= pace.max_pace) | self.faulty[:n])
        return out
