"""Alert labels and matchers: the vocabulary routes, silences and maintenance windows share.

An alert is matched on ``alertname``/``rule``, ``severity``/``tier``, ``owner``, ``incident`` and
its entity labels, the way Alertmanager users already write matchers (``severity="P1"``,
``node=~"node-[0-3]"``, ``rule!="loss_plateau"``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from gpuscope.model import Alert, Labels

OPS = ("=~", "!~", "!=", "=")
_MATCHER_RE = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*$')


def alert_labels(alert: Alert) -> Labels:
    """The labels an alert is routed, silenced and grouped by."""
    labels = dict(alert.entity)
    labels.update(
        alertname=alert.rule,
        rule=alert.rule,
        severity=alert.severity,
        tier=alert.severity,
        owner=alert.owner,
    )
    if alert.incident:
        labels["incident"] = alert.incident
    return labels


def fingerprint(alert: Alert) -> str:
    """A stable identity for one alert across restarts: rule, entity and the time it fired."""
    text = alert.rule + "|" + "|".join(f"{k}={v}" for k, v in sorted(alert.entity.items()))
    return hashlib.sha256(f"{text}|{alert.started_at:.3f}".encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label condition: ``name op value`` with Alertmanager's four operators."""

    name: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"matcher {self.name}: operator {self.op!r} is not one of {', '.join(OPS)}")
        if self.op in {"=~", "!~"}:
            try:
                re.compile(self.value)
            except re.error as exc:
                raise ValueError(
                    f"matcher {self.name}: bad regular expression {self.value!r}: {exc}"
                ) from None

    def matches(self, labels: Labels) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        hit = re.fullmatch(self.value, actual) is not None
        return hit if self.op == "=~" else not hit

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "op": self.op, "value": self.value}

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{self.value}"'


def parse_matcher(text: str) -> Matcher:
    """``severity=P1``, ``node=~"node-[12]"`` or ``rule!=loss_plateau``."""
    m = _MATCHER_RE.match(text)
    if not m:
        raise ValueError(f"matcher {text!r} is not NAME=VALUE, NAME!=VALUE, NAME=~REGEX or NAME!~REGEX")
    return Matcher(m.group(1), m.group(2), m.group(3))


def parse_matchers(value: Any, where: str) -> list[Matcher]:
    """Matchers from config: a mapping (equality), a list of strings, or a list of mappings."""
    if value is None:
        return []
    try:
        if isinstance(value, dict):
            return [Matcher(str(k), "=", str(v)) for k, v in value.items()]
        if isinstance(value, list):
            out: list[Matcher] = []
            for item in value:
                if isinstance(item, str):
                    out.append(parse_matcher(item))
                elif isinstance(item, dict) and {"name", "value"} <= set(item):
                    out.append(Matcher(str(item["name"]), str(item.get("op", "=")), str(item["value"])))
                else:
                    raise ValueError(f"{item!r} is neither a matcher string nor {{name, op, value}}")
            return out
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    raise ValueError(f"{where}: must be a mapping of label: value or a list of matchers")


def matches_all(matchers: list[Matcher], labels: Labels) -> bool:
    return all(m.matches(labels) for m in matchers)
