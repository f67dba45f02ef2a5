"""The route tree of the config file (DESIGN §5): which receiver gets an alert, grouped how, how often.

Semantics follow Alertmanager so its users need nothing new: routes are tried in order and the first
that matches takes the alert (unless it says ``continue: true``); a route's children refine it and
inherit its receiver and timings; ``match`` is label equality, ``matchers`` the four operators.
Grouping defaults to the incident, so one fault reaches a person as one notification thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuscope.alert.durations import parse_duration
from gpuscope.alert.labels import Matcher, matches_all, parse_matchers
from gpuscope.model import Labels

ROUTE_KEYS = {
    "receiver",
    "match",
    "match_re",
    "matchers",
    "group_by",
    "group_wait",
    "group_interval",
    "repeat_interval",
    "continue",
    "routes",
}


@dataclass(frozen=True, slots=True)
class Timing:
    group_wait: float = 0.0
    group_interval: float = 30.0
    repeat_interval: float = 4 * 3600.0


@dataclass(slots=True)
class Route:
    receiver: str
    matchers: list[Matcher] = field(default_factory=list)
    group_by: tuple[str, ...] = ("incident",)
    timing: Timing = field(default_factory=Timing)
    cont: bool = False
    routes: list[Route] = field(default_factory=list)
    path: str = "routes"

    def matches(self, labels: Labels) -> bool:
        return matches_all(self.matchers, labels)

    def group_key(self, labels: Labels) -> str:
        """Which notification group an alert joins under this route (``...``: every label)."""
        names = sorted(labels) if "..." in self.group_by else self.group_by
        return self.path + "{" + ",".join(f"{n}={labels.get(n, '')}" for n in names) + "}"


def find_routes(routes: list[Route], labels: Labels) -> list[Route]:
    """The routes that take an alert: depth first, first match wins unless ``continue``."""
    out: list[Route] = []
    for route in routes:
        if not route.matches(labels):
            continue
        deeper = find_routes(route.routes, labels)
        out.extend(deeper or [route])
        if not route.cont:
            break
    return out


def _timing(raw: dict[str, Any], parent: Timing, where: str) -> Timing:
    return Timing(
        group_wait=parse_duration(raw.get("group_wait", parent.group_wait), f"{where}.group_wait"),
        group_interval=parse_duration(
            raw.get("group_interval", parent.group_interval), f"{where}.group_interval"
        ),
        repeat_interval=parse_duration(
            raw.get("repeat_interval", parent.repeat_interval), f"{where}.repeat_interval"
        ),
    )


def parse_route(raw: Any, where: str, receivers: set[str], parent: Route | None = None) -> Route:
    """One route (and its children) from config, checked against the known receiver names."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be a mapping")
    unknown = set(raw) - ROUTE_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    receiver = raw.get("receiver", parent.receiver if parent else None)
    if not isinstance(receiver, str) or receiver not in receivers:
        known = ", ".join(sorted(receivers)) or "none defined"
        raise ValueError(f"{where}.receiver: {receiver!r} is not a defined receiver ({known})")
    matchers = parse_matchers(raw.get("match"), f"{where}.match")
    for name, regex in (raw.get("match_re") or {}).items():
        matchers.extend(parse_matchers([f"{name}=~{regex}"], f"{where}.match_re"))
    matchers.extend(parse_matchers(raw.get("matchers"), f"{where}.matchers"))
    group_by = raw.get("group_by", list(parent.group_by) if parent else ["incident"])
    if not isinstance(group_by, list) or not all(isinstance(g, str) for g in group_by):
        raise ValueError(f"{where}.group_by: must be a list of label names")
    cont = raw.get("continue", False)
    if not isinstance(cont, bool):
        raise ValueError(f"{where}.continue: must be true or false")
    route = Route(
        receiver=receiver,
        matchers=matchers,
        group_by=tuple(group_by),
        timing=_timing(raw, parent.timing if parent else Timing(), where),
        cont=cont,
        path=where,
    )
    children = raw.get("routes", [])
    if not isinstance(children, list):
        raise ValueError(f"{where}.routes: must be a list")
    route.routes = [parse_route(c, f"{where}.routes[{i}]", receivers, route) for i, c in enumerate(children)]
    return route


def parse_routes(raw: Any, receivers: set[str]) -> list[Route]:
    """The top-level ``routes`` list; no routes means every alert goes to every receiver."""
    if raw is None:
        return [Route(receiver=r, cont=True, path=f"routes[default:{r}]") for r in sorted(receivers)]
    if not isinstance(raw, list):
        raise ValueError("routes: must be a list of routes")
    return [parse_route(r, f"routes[{i}]", receivers) for i, r in enumerate(raw)]
