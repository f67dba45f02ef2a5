"""A node's network goes bad: ``network_degraded``.

Three signs, each on the node's own counters: the TCP retransmit ratio over about the last
``tau`` seconds is ``factor`` times its long-run ratio and at least ``min_ratio``; InfiniBand symbol
and receive errors climb (``min_ib`` in the window, well above the node's own rate); a port or
link goes down. Counter drops are reboots and restart the comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuscope.detect.base import Detector, register
from gpuscope.detect.frames import FrameView, view
from gpuscope.model import Finding, Frame
from gpuscope.rules import NETWORK_DEGRADED as RULE

_COUNTERS = (
    "node_tcp_out_segs_total",
    "node_tcp_retrans_segs_total",
    "node_ib_symbol_errors_total",
    "node_ib_rcv_errors_total",
    "node_ib_link_downed_total",
)
_READ = (*_COUNTERS, "node_ib_ports_down")
LONG_TAU = 6 * 3600.0


@dataclass(slots=True)
class _Node:
    ts: float = math.nan
    prev: dict[str, float] = field(default_factory=dict)
    segs: float = 0.0
    retrans: float = 0.0
    ib: float = 0.0
    link_downs: float = 0.0
    base_ratio: float = math.nan
    base_ib: float = 0.0
    ports0: float = math.nan
    ports: float = 0.0
    firing: bool = False


@register
class NetworkDetector(Detector):
    rules = (RULE,)

    def __init__(
        self, tau: float = 60.0, factor: float = 10.0, min_ratio: float = 0.005, min_ib: float = 5.0
    ) -> None:
        self.tau, self.factor, self.min_ratio, self.min_ib = tau, factor, min_ratio, min_ib
        self._nodes: dict[str, _Node] = {}

    def reads(self, frame: FrameView) -> bool:
        return bool(frame.node_rows)

    def on_frame(self, frame: Frame) -> None:
        v = view(frame)
        if not v.node_rows:
            return
        cols = [(m, v.position(m)) for m in _READ]
        for name, row in v.node_rows.items():
            node = self._nodes.get(name)
            if node is None:
                node = self._nodes[name] = _Node()
            values: list[float] = frame.values[row].tolist()  # one conversion, not one per metric
            self._update(node, frame.ts, {m: (math.nan if j is None else values[j]) for m, j in cols})

    def _update(self, node: _Node, ts: float, values: dict[str, float]) -> None:
        dt = ts - node.ts if math.isfinite(node.ts) else math.nan
        if not dt > 0:
            if not math.isfinite(node.ts):
                node.ts = ts
                node.prev = {m: x for m, x in values.items() if math.isfinite(x)}
            return
        delta: dict[str, float] = {}
        for m in _COUNTERS:
            x, p = values[m], node.prev.get(m, math.nan)
            delta[m] = x - p if math.isfinite(x) and math.isfinite(p) and x >= p else 0.0
            if math.isfinite(x):
                node.prev[m] = x
        decay = math.exp(-dt / self.tau)
        node.segs = node.segs * decay + delta["node_tcp_out_segs_total"]
        node.retrans = node.retrans * decay + delta["node_tcp_retrans_segs_total"]
        ib_new = delta["node_ib_symbol_errors_total"] + delta["node_ib_rcv_errors_total"]
        node.ib = node.ib * decay + ib_new
        node.link_downs = node.link_downs * decay + delta["node_ib_link_downed_total"]
        ports = values["node_ib_ports_down"]
        if math.isfinite(ports):
            if not math.isfinite(node.ports0):
                node.ports0 = ports
            node.ports = ports - node.ports0
        node.ts = ts
        node.firing = self._bad(node)
        if not node.firing:
            a = 1.0 - math.exp(-dt / LONG_TAU)
            seg = delta["node_tcp_out_segs_total"]
            if seg > 0:
                ratio = delta["node_tcp_retrans_segs_total"] / seg
                node.base_ratio = (
                    ratio
                    if not math.isfinite(node.base_ratio)
                    else node.base_ratio + a * (ratio - node.base_ratio)
                )
            node.base_ib += a * (ib_new / dt - node.base_ib)

    def _ratio(self, node: _Node) -> float:
        return node.retrans / node.segs if node.segs >= 100 else 0.0

    def _bad(self, node: _Node) -> bool:
        base = node.base_ratio if math.isfinite(node.base_ratio) else 0.0
        tcp = self._ratio(node) >= max(self.min_ratio, self.factor * base)
        ib = node.ib >= self.min_ib and node.ib / self.tau >= self.factor * max(node.base_ib, 1e-3)
        return tcp or ib or node.link_downs >= 0.5 or node.ports > 0

    def evaluate(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for name, node in self._nodes.items():
            if not node.firing or now - node.ts > 5 * self.tau:
                continue
            parts = []
            ratio = self._ratio(node)
            if ratio >= self.min_ratio:
                parts.append(f"TCP retransmits at {ratio:.1%} of segments")
            if node.ib >= self.min_ib:
                parts.append(f"{node.ib:.0f} InfiniBand symbol/receive errors in about {self.tau:.0f} s")
            if node.link_downs >= 0.5 or node.ports > 0:
                parts.append("an InfiniBand link or port went down")
            out.append(
                Finding(
                    RULE,
                    {"node": name},
                    f"Network of {name} degraded: " + "; ".join(parts or ["error rates above baseline"]),
                    value=ratio,
                    details={
                        "tcp_retrans_ratio": ratio,
                        "ib_errors_in_window": node.ib,
                        "ib_ports_down": node.ports,
                    },
                )
            )
        return out
