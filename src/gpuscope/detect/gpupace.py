"""Each GPU's own pace against its peers, and the evidence that it has slowed down from it.

Parts of one model do not run at one clock: sustained clocks differ by a per cent or two from part
to part, and a job may run on two bins or clock limits (two stable speeds). A fixed bar on the ratio
to the peers' reference (``gpu_underperforming``'s fast path, 0.96) must sit below all of that, so
a 1.03-1.05x slowdown hides in it. Here each GPU learns its own pace, the log of its clock over its
speed group's reference (:class:`~gpuscope.detect.peers.ClockPeers`), first as the mean of its first
``learn`` clean readings (in use from the ``early``-th on, so a part slower from the start is its own
normal, not a live fault, as the issue's "slow placement" asks), then slowly (``tau``) while nothing
is building up; a pace is kept within ``max_pace`` of the reference, so a GPU far off from the start
is still judged against its group.

The evidence is a one-sided CUSUM of the shortfall from the own pace, less ``drift`` (half the
smallest slowdown worth a page): a slowdown of ``d`` gathers ``d - drift`` per second, so a small
one needs long evidence and a large one little (``bar`` log-seconds: 1.05x in about 90 s, 1.03x in
about 200 s), while healthy noise drifts back to zero. It fires when the evidence holds its bar and
the recent shortfall (an EWMA over ``recent`` seconds) is past ``drift``; it clears, and spends the
evidence, when the recent shortfall is back under half of ``drift``. While evidence builds up or an
alert fires the pace is not learned, so a live fault never becomes the GPU's normal.

Both bars scale with the noise of one reading (:meth:`OwnPace.sigma`), measured from a GPU's first
readings on: the spread of the reading-to-reading change of the GPUs of its speed group (the median
of its size, so a GPU that slows down, or most of the group at once, moves it only for the one
reading of its step). ``drift`` is at least ``noise_k`` times what that noise leaves in the recent
shortfall, and :meth:`OwnPace.reading_bar` puts the fast path's bar at ``reading_k`` sigmas of one
reading where that is past its fixed one; an outlier, cut off when a pace is learned or judged, is
past ``clip`` or four sigmas. With readings 10 % apart (a throughput proxy, or clocks read through a
noisy exporter), the fixed bars made healthy GPUs a P2 43-44 times in 2 hours at one evaluation
every 10 s: a third of the readings sat 4 % under the pace, the quiet wander the evidence's bar was
scaled by starts at ``noise0`` and took an hour to learn, and a pace learned from readings cut at
15 % around the group's reference read a point fast.
"""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.frames import BoolArray
from gpuscope.detect.vectors import IntArray, grow
from gpuscope.model import FloatArray


class OwnPace:
    """Per GPU id: its learned pace against its group's reference and the evidence of a slowdown."""

    def __init__(
        self,
        early: int = 30,
        learn: int = 300,
        tau: float = 1800.0,
        max_pace: float = 0.10,
        drift: float = 0.015,
        bar: float = 3.0,
        recent: float = 120.0,
        clip: float = 0.15,
        noise_k: float = 4.5,
        noise0: float = 0.005,
        stale: float = 120.0,
        reading_k: float = 2.0,
    ) -> None:
        self.early, self.learn, self.tau, self.max_pace = early, learn, tau, max_pace
        self.drift, self.bar, self.recent, self.clip = drift, bar, recent, clip
        self.noise_k, self.noise0, self.stale, self.reading_k = noise_k, noise0, stale, reading_k
        #: per GPU, the variance of one reading (from its group's reading-to-reading changes)
        self.noise: FloatArray = np.zeros(0)
        #: per GPU, how many readings measured it (the first ``early`` weigh in equally)
        self.measured: FloatArray = np.zeros(0)
        #: per GPU, its last clean reading (NaN: none, or the last was not clean)
        self.prev: FloatArray = np.zeros(0)
        #: the share of the recent shortfall one evaluation moves (its variance: that of a reading
        #: times ``a / (2 - a)``)
        self._a = 1.0 - math.exp(-1.0 / recent)
        #: per GPU, when it was last judged (a firing GPU unjudged for ``stale`` seconds stops firing)
        self.seen: FloatArray = np.zeros(0)
        #: per GPU, the mean square of its recent shortfall while quiet (its wander at that scale)
        self.square: FloatArray = np.zeros(0)
        self.pace: FloatArray = np.zeros(0)
        #: per GPU, the mean of its first ``early`` clean readings (NaN until then): its pace at the start
        self.first: FloatArray = np.zeros(0)
        self.count: FloatArray = np.zeros(0)
        #: per GPU, the mean of its readings while its pace is learned, each clipped at ``clip`` around
        #: that mean so far instead of around its group's reference: an outlier is cut as for the pace,
        #: but a part more than ``clip`` off its group reads its whole lag (reported, never judged)
        self.level: FloatArray = np.zeros(0)
        self.evidence: FloatArray = np.zeros(0)
        self.shortfall: FloatArray = np.zeros(0)
        self.firing: BoolArray = np.zeros(0, bool)
        #: per GPU id, the (job code, speed group) its pace was learned in
        self._job: FloatArray = np.zeros(0)
        self._group: FloatArray = np.zeros(0)
        self.last: float | None = None

    def _grow(self, n: int) -> None:
        if len(self.pace) >= n:
            return
        self.pace, self.count = grow(self.pace, n, 0.0), grow(self.count, n, 0.0)
        self.level = grow(self.level, n, 0.0)
        self.first = grow(self.first, n)
        self.evidence, self.shortfall = grow(self.evidence, n, 0.0), grow(self.shortfall, n, 0.0)
        self._job, self._group = grow(self._job, n, -1.0), grow(self._group, n, -1.0)
        self.square = grow(self.square, n, self.noise0**2)
        self.noise = grow(self.noise, n, self.noise0**2)
        self.measured, self.prev = grow(self.measured, n, 0.0), grow(self.prev, n)
        self.seen = grow(self.seen, n, -math.inf)
        firing = np.zeros(len(self.pace), bool)
        firing[: len(self.firing)] = self.firing
        self.firing = firing

    def learned(self, n: int) -> BoolArray:
        """GPUs whose pace is learned (their ratio is judged from it)."""
        self._grow(n)
        out: BoolArray = self.count[:n] >= self.learn
        return out

    def known(self, n: int) -> BoolArray:
        """GPUs whose first ``early`` readings are in: their pace is known well enough to judge."""
        self._grow(n)
        out: BoolArray = self.count[:n] >= self.early
        return out

    def own(self, n: int) -> FloatArray:
        """Per GPU, its pace (log ratio to its group's reference) as judged: 0 for its first
        ``early`` readings, then the mean so far (a part slower from the start is no fault)."""
        return np.where(self.known(n), np.clip(self.pace[:n], -self.max_pace, self.max_pace), 0.0)

    def sigma(self, n: int) -> FloatArray:
        """Per GPU, the noise of one of its readings (log sigma), as its speed group's readings show."""
        self._grow(n)
        out: FloatArray = np.sqrt(self.noise[:n])
        return out

    def reading_bar(self, n: int, fixed: float) -> FloatArray:
        """Per GPU, the shortfall of one reading under its pace (log) that the fast path counts:
        ``fixed``, or ``reading_k`` sigmas of one reading where that is larger."""
        out: FloatArray = np.maximum(fixed, self.reading_k * self.sigma(n))
        return out

    def drifts(self, n: int) -> FloatArray:
        """Per GPU, the shortfall that counts as evidence: ``drift``, or ``noise_k`` times its own
        quiet wander, or times what the noise of its readings leaves in the recent shortfall, where
        either is larger (a GPU whose pace wanders more needs a larger effect)."""
        self._grow(n)
        wander = np.sqrt(np.maximum(self.square[:n], self.noise[:n] * self._a / (2.0 - self._a)))
        out: FloatArray = np.maximum(self.drift, self.noise_k * wander)
        return out

    def _measure(self, x: FloatArray, clean: BoolArray, job: IntArray, group: IntArray) -> None:
        """Fold each speed group's reading-to-reading change into its GPUs' noise: the median of its
        size over the group (a step of a few GPUs is no noise, nor an outlier), as a normal sigma."""
        n = len(x)
        prev = self.prev[:n]
        step = np.abs(x - prev)
        ok = clean & np.isfinite(step) & (job >= 0) & (group >= 0)
        prev[:] = np.where(clean, x, math.nan)
        ids = np.flatnonzero(ok)
        if ids.size == 0:
            return
        # one sort by (job, group, change): a float key of the group's code and the change below 4
        # (a log change past 4 is an outlier, its order among outliers is no matter); a lexsort of
        # the three took 2 ms of an evaluation over 8,192 GPUs
        code = job[ids] * (int(group.max()) + 1.0) + group[ids]
        ids = ids[np.argsort(code * 4.0 + np.minimum(step[ids], 3.9))]
        code = np.sort(code)  # the codes in the order of ``ids``: the sort above orders by them first
        starts = np.flatnonzero(np.concatenate(([True], code[1:] != code[:-1])))
        sizes = np.diff(np.append(starts, len(code)))
        middle = (step[ids[starts + (sizes - 1) // 2]] + step[ids[starts + sizes // 2]]) / 2.0
        # the change of two readings has twice a reading's variance; 1.4826 x the median is a sigma
        var = (1.4826 * middle) ** 2 / 2.0
        enough = sizes >= 3
        per = np.repeat(np.where(enough, var, math.nan), sizes)
        got = ids[np.isfinite(per)]
        measured = self.measured[:n]
        measured[got] += 1.0
        w = 1.0 / np.minimum(measured[got], float(self.early))
        noise = self.noise[:n]
        noise[got] += w * (per[np.isfinite(per)] - noise[got])

    def update(
        self, now: float, ratio: FloatArray, clean: BoolArray, job: IntArray, group: IntArray
    ) -> BoolArray:
        """Fold one evaluation in: ``ratio`` is each GPU's clock over its group's reference, ``clean``
        the GPUs judged now (loaded, grouped, no throttle reason). Returns who is firing."""
        n = len(ratio)
        self._grow(n)
        dt = 1.0 if self.last is None else min(max(now - self.last, 0.0), 5.0)
        self.last = now
        moved = clean & ((self._job[:n] != job) | (self._group[:n] != group))
        if moved.any():  # a GPU in a new job or speed group: its pace is learned again
            self.count[:n][moved] = 0.0
            self.pace[:n][moved] = 0.0
            self.level[:n][moved] = 0.0
            self.first[:n][moved] = math.nan
            self.evidence[:n][moved] = 0.0
            self.shortfall[:n][moved] = 0.0
            self.square[:n][moved] = self.noise0**2
            self.noise[:n][moved] = self.noise0**2
            self.measured[:n][moved] = 0.0
            self.prev[:n][moved] = math.nan
            self.firing[:n][moved] = False
            self._job[:n][moved] = job[moved]
            self._group[:n][moved] = group[moved]
        x = np.log(np.where(clean, ratio, 1.0))
        learning = clean & (self.count[:n] < self.learn)
        count = self.count[:n]
        pace = self.pace[:n]
        count[learning] += 1.0
        self._measure(x, clean, job, group)
        # an outlier is past ``clip`` or four sigmas of one reading: with readings 10 % apart a cut at
        # 15 % around the reference cut the slow tail of a part 5 % behind it more than the fast one,
        # so its pace read fast by a point and its healthy readings looked short
        wide = np.maximum(self.clip, 4.0 * self.sigma(n))
        first = np.clip(x, -wide, wide)
        pace[learning] += (first[learning] - pace[learning]) / count[learning]
        level = self.level[:n]
        near = np.clip(x, level - self.clip, level + self.clip)
        level[learning] += (near[learning] - level[learning]) / count[learning]
        start = learning & (count == self.early)
        self.first[:n][start] = pace[start]
        judged = clean & ~learning
        short = np.clip(self.own(n) - x, -wide, wide)
        evidence = self.evidence[:n]
        shortfall = self.shortfall[:n]
        a = 1.0 - math.exp(-dt / self.recent)
        self._a = a
        shortfall[judged] += a * (short[judged] - shortfall[judged])
        drift = self.drifts(n)
        # quiet by the evidence before this reading: judged after it, a reading was learned only if
        # it was not short, and with readings 10 % apart the pace crept up to the fast ones
        calm = evidence == 0.0
        evidence[judged] = np.maximum(0.0, evidence[judged] + (short[judged] - drift[judged]) * dt)
        firing = self.firing[:n]
        quiet = judged & ~firing & calm
        slow = 1.0 - math.exp(-dt / self.tau)
        pace[quiet] += slow * (x[quiet] - pace[quiet])
        square = self.square[:n]
        square[quiet] += slow * (shortfall[quiet] ** 2 - square[quiet])
        fire = judged & ~firing & (evidence >= self.bar) & (shortfall >= drift)
        clear = judged & firing & (shortfall < drift / 2.0)
        seen = self.seen[:n]
        seen[clean] = now
        # a checkpoint or a pause leaves a firing GPU unjudged: it keeps firing through it, not after
        clear |= firing & (now - seen > self.stale)
        firing[fire] = True
        firing[clear] = False
        evidence[clear] = 0.0
        return firing.copy()
