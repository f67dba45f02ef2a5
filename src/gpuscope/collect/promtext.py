"""A strict reader of the Prometheus text exposition format (0.0.4), for scraped sources.

Returns samples as ``(name, labels, value)``; a malformed line raises :class:`ExpositionError`
naming the line, so a broken exporter is reported rather than half-read. Timestamps after the
value are accepted and ignored (the agent stamps its own rounds).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class ExpositionError(ValueError):
    def __init__(self, line_no: int, message: str) -> None:
        super().__init__(f"line {line_no}: {message}")
        self.line_no = line_no


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _unescape(text: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], text)


def _value(token: str, line_no: int) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if token in special:
        return special[token]
    try:
        return float(token)
    except ValueError:
        raise ExpositionError(line_no, f"{token!r} is not a sample value") from None


def parse_exposition(text: str) -> list[Sample]:
    """Every sample in ``text``; comments and ``# HELP``/``# TYPE`` lines are skipped."""
    out: list[Sample] = []
    # lines end at \n only: splitlines() would also split a label value at \x0b, \x1c or \u2028
    for no, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _NAME.match(line)
        if m is None:
            raise ExpositionError(no, f"expected a metric name, found {line[:40]!r}")
        name, pos = m.group(0), m.end()
        labels: dict[str, str] = {}
        if pos < len(line) and line[pos] == "{":
            pos += 1
            if line[pos : pos + 1] == "}":
                pos += 1
            while pos < len(line) and line[pos - 1] != "}":
                lm = _LABEL.match(line, pos)
                if lm is None:
                    raise ExpositionError(no, f"malformed labels of {name}")
                labels[lm.group(1)] = _unescape(lm.group(2))
                pos = lm.end()
                if lm.group(3) == "," and line[pos : pos + 1] == "}":  # a trailing comma is allowed
                    pos += 1
        rest = line[pos:].split()
        if not rest or len(rest) > 2:
            raise ExpositionError(no, f"{name} needs a value (and at most a timestamp)")
        out.append(Sample(name, labels, _value(rest[0], no)))
    return out
