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
    ) -> None:
        self.early, self.learn, self.tau, self.max_pace = early, learn, tau, max_pace
        self.drift, self.bar, self.recent, self.clip = drift, bar, recent, clip
        self.noise_k, self.noise0, self.stale = noise_k, noise0, stale
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

    def drifts(self, n: int) -> FloatArray:
        """Per GPU, the shortfall that counts as evidence: ``drift``, or ``noise_k`` times its own
        quiet wander where that is larger (a GPU whose pace wanders more needs a larger effect)."""
        self._grow(n)
        out: FloatArray = np.maximum(self.drift, self.noise_k * np.sqrt(self.square[:n]))
        return out

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
            self.firing[:n][moved] = False
            self._job[:n][moved] = job[moved]
            self._group[:n][moved] = group[moved]
        x = np.log(np.where(clean, ratio, 1.0))
        learning = clean & (self.count[:n] < self.learn)
        count = self.count[:n]
        pace = self.pace[:n]
        count[learning] += 1.0
        first = np.clip(x, -self.clip, self.clip)
        pace[learning] += (first[learning] - pace[learning]) / count[learning]
        level = self.level[:n]
        near = np.clip(x, level - self.clip, level + self.clip)
        level[learning] += (near[learning] - level[learning]) / count[learning]
        start = learning & (count == self.early)
        self.first[:n][start] = pace[start]
        judged = clean & ~learning
        short = np.clip(self.own(n) - x, -self.clip, self.clip)
        evidence = self.evidence[:n]
        shortfall = self.shortfall[:n]
        a = 1.0 - math.exp(-dt / self.recent)
        shortfall[judged] += a * (short[judged] - shortfall[judged])
        drift = self.drifts(n)
        evidence[judged] = np.maximum(0.0, evidence[judged] + (short[judged] - drift[judged]) * dt)
        firing = self.firing[:n]
        quiet = judged & ~firing & (evidence == 0.0)
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
