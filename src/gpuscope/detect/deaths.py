"""How a job's ranks died, in order: which rank failed first, and why.

Every rank of a training job may send last words (a ``job_failed`` event labelled with its rank:
an exception, a terminating signal, or a failure its code reported). When one rank fails, the
launcher terminates the others, and their peers' collectives fail, so a dying job sends several
of them within a second or two, in no reliable order of arrival. The root is the earliest rank
whose own cause ended it (an exception, a reported failure, or silence: a rank that stopped
heartbeating before anyone's last words and never said why was killed outright: SIGKILL, the
out-of-memory killer, a lost node). Ranks that were only terminated by a signal are the root
only when nothing else is known. A node's agent reports when a rank's process ended
(``process_exited``), with its signal or exit code where the kernel told it: that names a
SIGKILLed rank and the moment it died, which its silence only bounds. Timestamps are the
ranks' own (the time of death, not of arrival), so the order holds when the reports arrive shuffled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpuscope.detect.jobs import place_text

#: last words whose cause is outside the rank (the launcher or an operator stopped it)
EXTERNAL = frozenset({"signal"})
#: signals a launcher or operator stops a rank with; any other kill (SIGKILL: the out-of-memory
#: killer, a scheduler's hard stop) or a non-zero exit is the rank's own end
STOP_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
#: causes of deaths the node's agent saw (a process that ended without last words)
AGENT_SEEN = frozenset({"killed", "exit", "gone"})


@dataclass(frozen=True, slots=True)
class Death:
    rank: int
    ts: float  # the rank's own time of death (its last heartbeat when it died silently)
    reason: str
    cause: str  # exception, signal, requested, silent, ...
    node: str
    gpu: str
    exit_code: int | None = None  # as the node's agent saw the process end
    signal: str | None = None

    def where(self) -> str:
        if not self.node:
            return ""
        if not self.gpu and self.cause in AGENT_SEEN:
            return f" ({self.node})"  # the agent does not know the rank's GPU, nor that it had none
        return f" ({place_text(self.node, self.gpu)})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "ts": self.ts,
            "reason": self.reason,
            "cause": self.cause,
            "node": self.node,
            "gpu": self.gpu,
            "exit_code": self.exit_code,
            "signal": self.signal,
        }


def exit_death(rank: int, ts: float, node: str, gpu: str, data: dict[str, Any]) -> Death | None:
    """A rank's death from its agent's ``process_exited`` event; None for a clean exit (code 0)."""
    code, sig = data.get("exit_code"), data.get("signal")
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    sig = str(sig) if sig else None
    if sig is None and code == 0:
        return None
    pid = data.get("pid")
    seen = f" (pid {pid}, seen by the node's agent)" if pid is not None else " (seen by the node's agent)"
    if sig is not None:
        reason, cause = f"killed by {sig}{seen}", "signal" if sig in STOP_SIGNALS else "killed"
    elif code is not None:
        reason, cause = f"exited with code {code}{seen}", "exit"
    else:
        reason, cause = f"its process ended, exit status unknown{seen}", "gone"
    return Death(rank, ts, reason, cause, node, gpu, code, sig)


@dataclass(slots=True)
class JobDeaths:
    """Last words and heartbeats of one job's ranks."""

    words: dict[int, Death] = field(default_factory=dict)
    exits: dict[int, Death] = field(default_factory=dict)  # from the agents (process_exited)
    clean: set[int] = field(default_factory=set)  # ranks whose process exited with code 0
    beats: dict[int, tuple[float, str, str]] = field(default_factory=dict)  # rank -> (ts, node, gpu)
    heard_at: float = math.nan  # hub time the first last words were evaluated

    def beat(self, rank: int, ts: float, node: str, gpu: str) -> None:
        old = self.beats.get(rank)
        if old is None or ts >= old[0]:
            self.beats[rank] = (ts, node, gpu)

    def spoke(self, death: Death) -> None:
        old = self.words.get(death.rank)
        if old is None or death.ts < old.ts:
            self.words[death.rank] = death

    def exited(self, death: Death) -> None:
        old = self.exits.get(death.rank)
        if old is None or death.ts < old.ts:
            self.exits[death.rank] = death

    def order(self, silent_window: float) -> list[Death]:
        """Every rank known to have died, earliest first: its last words, else its process's exit
        with the status its agent saw, else its silence when its last heartbeat came before the
        first last words (within ``silent_window`` seconds), else its process's exit seen without
        a status (when its process was noticed gone: later than it died)."""
        deaths = list(self.words.values())
        if deaths:
            first = min(d.ts for d in deaths)
            for rank, death in self.exits.items():
                if rank not in self.words and (death.signal is not None or death.exit_code is not None):
                    deaths.append(death)
            said = {d.rank for d in deaths}
            for rank, (ts, node, gpu) in self.beats.items():
                if rank not in said and rank not in self.clean and first - silent_window <= ts <= first:
                    deaths.append(
                        Death(
                            rank,
                            ts,
                            f"stopped without last words {first - ts:.1f} s before the first report "
                            "(SIGKILL, the out-of-memory killer or a lost node)",
                            "silent",
                            node,
                            gpu,
                        )
                    )
            said = {d.rank for d in deaths}
            deaths += [d for rank, d in self.exits.items() if rank not in said]
        return sorted(deaths, key=lambda d: (d.ts, d.rank))

    def root(self, silent_window: float) -> tuple[Death | None, list[Death]]:
        """(the first rank to fail by its own cause, else the first at all; every death in order)."""
        order = self.order(silent_window)
        own = [d for d in order if d.cause not in EXTERNAL]
        return (own[0] if own else order[0] if order else None), order


def summary(job: str, root: Death, order: list[Death]) -> str:
    text = f"Job {job} failed: rank {root.rank}{root.where()} {_verb(root)}"
    rest = [d for d in order if d is not root]
    if rest:
        causes = sorted({_short(d.reason) for d in rest})
        ranks = ", ".join(str(d.rank) for d in rest)
        text += f"; then rank(s) {ranks} ({'; '.join(causes)})"
    return text


def _verb(death: Death) -> str:
    if death.cause == "silent":
        return death.reason
    return f"died first: {death.reason}" if death.cause in AGENT_SEEN else f"failed first: {death.reason}"


def _short(reason: str, limit: int = 100) -> str:
    line = reason.strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"
