"""Scoring injected slowdowns against the alerts of the rule that should find them (the sweeps'
common scoring: ``eval_gpu_slow.py``, ``eval_training_sweep.py``).

An episode is one entity (a GPU, a rank) slowed from ``start`` to ``end``. It is found when an
alert of that entity starts between its start and ``grace`` seconds after its end; its time to
detect runs from its start to the first such alert. Every alert that no episode explains is false,
and ``most`` is the most alerts one episode raised (1: one page for one slowdown).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

#: (entity, start, end)
Episode = tuple[Hashable, float, float]


@dataclass(slots=True)
class Tally:
    found: int = 0
    episodes: int = 0
    alerts: int = 0
    false: int = 0
    most: int = 0
    ttd: list[float] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.found += other.found
        self.episodes += other.episodes
        self.alerts += other.alerts
        self.false += other.false
        self.most = max(self.most, other.most)
        self.ttd += other.ttd


def tally(starts: Sequence[tuple[Hashable, float]], episodes: Sequence[Episode], grace: float) -> Tally:
    """Score alerts, given as (entity, start time), against ``episodes``."""
    out = Tally(alerts=len(starts))
    explained: set[int] = set()
    for entity, start, end in episodes:
        mine = [i for i, (e, s) in enumerate(starts) if e == entity and start <= s <= end + grace]
        out.episodes += 1
        out.most = max(out.most, len(mine))
        explained.update(mine)
        if mine:
            out.found += 1
            out.ttd.append(min(starts[i][1] for i in mine) - start)
    out.false = len(starts) - len(explained)
    return out
