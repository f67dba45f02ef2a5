"""GPU peers that survive many outliers: the reference clock each loaded GPU is judged against.

Peers are the loaded GPUs of the same job (attribution label), with the same robust reference as
training ranks (:mod:`gpuscope.detect.ranks`): the ``ref_quantile`` quantile of their SM clocks
(the fast end, not the median), so it stays with the healthy GPUs when up to three quarters of
them slow down together. For the first ``warm`` evaluations of a job its GPUs' paces (the
reference clock over their own) are only recorded; then the GPUs are clustered into speed groups
(:func:`~gpuscope.detect.vectors.speed_groups`: mixed clocks or parts from the start) and each
is judged within its own group. A group that was slower from the start is the job's placement,
not a live fault (training jobs report it as ``slow_placement``); a GPU alone in being slow from
the start is still judged against the fast group. When GPUs join the job the groups are learned
again, but a GPU its detector holds (firing), or whose pace got worse since it was last learned,
keeps its old group: a live fault never becomes the new normal.

Every detector that compares a GPU's clock with its peers (``gpu_underperforming``,
``gpu_failure_risk``) owns one :class:`ClockPeers`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpuscope.detect.frames import BoolArray
from gpuscope.detect.vectors import IntArray, grow_codes, speed_groups
from gpuscope.model import FloatArray


@dataclass(slots=True)
class _Peers:
    """One job's GPUs as peers: their speed groups and paces when last learned."""

    #: warm-up evaluations: (GPU ids, their lag behind the job's reference clock)
    warm: list[tuple[IntArray, FloatArray]] = field(default_factory=list)
    #: GPU id -> speed group (0: fastest); None until the first warm-up ends
    group: dict[int, int] | None = None
    #: GPU id -> its pace (lag behind the reference) when the groups were last learned
    pace: dict[int, float] = field(default_factory=dict)
    relearn: bool = False


class ClockPeers:
    """Per job, its GPUs' speed groups and the fast-end reference clock of each group."""

    def __init__(
        self,
        min_peers: int = 3,
        ref_quantile: float = 0.75,
        warm: int = 60,
        split_gap: float = 0.04,
        noise_k: float = 5.0,
    ) -> None:
        self.min_peers, self.ref_quantile, self.warm = min_peers, ref_quantile, warm
        self.split_gap, self.noise_k = split_gap, noise_k
        self._jobs: dict[int, _Peers] = {}
        #: per GPU id, its speed group (-1: not learned yet; a GPU that joined is judged once it is)
        self._gid: IntArray = np.zeros(0, np.intp)
        #: per GPU id, the job (code) it was a member of when last seen (-1: none)
        self._member: IntArray = np.zeros(0, np.intp)

    def references(
        self, clock: FloatArray, job: IntArray, recent: BoolArray, held: BoolArray
    ) -> tuple[FloatArray, BoolArray]:
        """Per GPU, the reference clock of its speed group (NaN: none), and whether it can be
        judged yet. ``clock`` is NaN for GPUs not under load; ``held`` marks GPUs (by id, may be
        shorter than the table) that keep their group when the job's groups are learned again."""
        n = len(clock)
        self._gid, self._member = grow_codes(self._gid, n), grow_codes(self._member, n)
        ref = np.full(n, math.nan)
        judged: BoolArray = np.zeros(n, bool)
        finite = np.isfinite(clock)
        for code in np.unique(job[(job >= 0) & recent]).tolist():
            mine = job == code
            joined = np.flatnonzero(mine & recent & (self._member[:n] != code))
            peers = self._jobs.setdefault(code, _Peers())
            if joined.size:
                self._member[joined] = code
                self._gid[joined] = -1
                if peers.group is not None and not peers.relearn:
                    peers.relearn, peers.warm = True, []  # GPUs joined the job: learn its speeds again
            ids = np.flatnonzero(mine & finite)
            if len(ids) <= self.min_peers:
                continue
            if peers.group is None or peers.relearn:
                top = float(np.quantile(clock[ids], self.ref_quantile))
                peers.warm.append((ids, top / clock[ids] - 1.0))
                if len(peers.warm) >= self.warm:
                    self._split(peers, np.flatnonzero(self._member[:n] == code), held)
            if peers.group is None:
                continue
            groups = self._gid[ids]
            for g in np.unique(groups[groups >= 0]).tolist():
                own = ids[groups == g]
                pool = own if len(own) >= 2 else ids
                ref[own] = float(np.quantile(clock[pool], self.ref_quantile))
            # a GPU that joined is judged once the groups were learned with it
            judged[ids] = groups >= 0
        return ref, judged

    def group_ids(self, n: int) -> IntArray:
        """Per GPU id (the first ``n``), its speed group in its job (-1: not learned yet)."""
        out: IntArray = self._gid[:n].copy()
        return out

    def group_of(self, job: int, gpu: int) -> int:
        """The speed group (0: fastest) of a GPU id in a job (code), 0 while not learned."""
        known = self._jobs.get(job)
        return known.group.get(gpu, 0) if known is not None and known.group else 0

    def _split(self, peers: _Peers, members: IntArray, held: BoolArray) -> None:
        """End of a warm-up: cluster the job's GPUs by pace; held or worsened GPUs keep their group."""
        seen: dict[int, list[float]] = {}
        for ids, lags in peers.warm:
            for i, x in zip(ids.tolist(), lags.tolist(), strict=True):
                seen.setdefault(i, []).append(x)
        peers.warm = []
        paces = {i: float(np.median(xs)) for i, xs in seen.items()}
        noise = [float(np.median(np.abs(np.array(xs) - paces[i]))) for i, xs in seen.items()]
        gap = max(self.split_gap, self.noise_k * float(np.median(noise))) if noise else self.split_gap
        old, old_pace = peers.group or {}, peers.pace
        kept = {
            i
            for i, p in paces.items()
            if i in old and ((i < len(held) and held[i]) or p - old_pace[i] >= gap)
        }
        learn = {i: p for i, p in paces.items() if i not in kept}
        group = speed_groups(learn, gap) if len(learn) >= 4 else dict.fromkeys(learn, 0)
        group.update({i: old.get(i, 0) for i in kept})
        group.update({i: 0 for i in members.tolist() if i not in group})  # idle so far: the fast group
        peers.group = group
        self._gid[np.fromiter(group, np.intp, len(group))] = np.fromiter(group.values(), np.intp, len(group))
        peers.pace = {**old_pace, **learn}
        peers.relearn = False
