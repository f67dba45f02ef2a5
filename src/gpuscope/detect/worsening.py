"""How far a held condition has grown worse since its alert was told: its stages of worsening.

A detector that follows a changing fault (a second cause on top of the first) gives its finding
the stage (:attr:`~gpuscope.model.Finding.stage`); the alert layer tells the alert again each time
the stage grows. A stage is a material growth that lasts: the condition's level (a ratio, 1 being
no slowdown) at least ``factor`` times the level the alert was last told, for ``sustain`` seconds.
A level that eases back under that, even for one judgement, starts the wait again, so a level
hovering at the bar is not a stage each time it crosses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class Worsening:
    """The stages of one held condition (a new condition starts a new one)."""

    #: the level the alert was last told (as it fired, or at its last stage)
    told: float = math.nan
    #: since when the level has stayed ``factor`` above ``told`` (None: it has not)
    since: float | None = None
    stage: int = 0

    def follow(self, level: float, ts: float, factor: float, sustain: float) -> int:
        """The stage after the level at ``ts`` (the first level followed is the one told)."""
        if not math.isfinite(level):
            return self.stage
        if not math.isfinite(self.told):
            self.told = level
        elif level >= self.told * factor:
            self.since = ts if self.since is None else self.since
            if ts - self.since >= sustain:
                self.stage, self.told, self.since = self.stage + 1, level, None
        else:
            self.since = None
        return self.stage
