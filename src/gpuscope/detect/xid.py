"""XID errors: ``gpu_xid_fatal`` (needs a reset or reboot) and ``gpu_xid_app`` (the application's fault).

An XID is a one-off event, but its consequence lasts: the alert stays active for ``hold``
seconds after the last XID of its class on that GPU, or until the GPU is seen answering again
after a reset. A reset is recognised from the data: the GPU reappears after a gap in its
reports longer than its node's usual period allows, or its volatile ECC counters go back down.
Codes that are neither fatal nor known application codes are treated as application-class
(a P3 ticket, not a page), unless listed in :data:`gpuscope.signals.FATAL_XIDS`, which follows
NVIDIA's XID catalog; each finding carries NVIDIA's immediate action for its code. XID 154 names
its recovery action in its message ("GPU recovery action changed from 0x0 (None) to 0x2 (Node
Reboot Required)"); a 154 whose new action is "None" asks for nothing and is not paged. A code
new to the GPU while its class's alert is open is a stage of worsening (another cause, told
again); a repeat of a code already told only counts.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any

from gpuscope.counters import Counters
from gpuscope.detect.base import Detector, register
from gpuscope.detect.baseline import IntervalEstimator
from gpuscope.detect.frames import FrameView, GpuKey, view
from gpuscope.detect.refusals import event_gpu, refuse
from gpuscope.model import Event, Finding, Frame
from gpuscope.rules import GPU_XID_APP as APP
from gpuscope.rules import GPU_XID_FATAL as FATAL
from gpuscope.signals import APP_XIDS, FATAL_XIDS, NVIDIA_FATAL_ACTIONS, XID_ACTION

log = logging.getLogger(__name__)


#: Short meanings for the summary when the event carries no message (NVIDIA XID catalog).
MEANINGS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after a previous error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    46: "GPU stopped responding (timeout)",
    109: "context switch timeout",
    110: "security fault",
    136: "NVLink link training failed",
    140: "ECC error escaped containment",
    143: "GPU initialisation failed",
    154: "GPU recovery action changed",
    155: "NVLink software-defined error",
    156: "resource retirement event",
    158: "GPU fatal timeout",
    160: "channel retirement event",
}
#: the new recovery action in XID 154's message: "... changed from 0x0 (None) to 0x2 (Node Reboot Required)"
_RECOVERY_ACTION = re.compile(r"\bto\s+0x[0-9a-fA-F]+\s+\(([^)]+)\)")


def recovery_action(message: str) -> str | None:
    """XID 154's new recovery action, as the driver names it (None, GPU Reset Required, ...)."""
    m = _RECOVERY_ACTION.search(message)
    return m.group(1).strip() if m else None


def rule_for(code: int | None, message: str) -> str:
    """``gpu_xid_fatal`` or ``gpu_xid_app`` for one XID."""
    if code == 154 and recovery_action(message) == "None":
        return APP
    return FATAL if code in FATAL_XIDS else APP


_VOLATILE = ("gpu_ecc_sbe_volatile_total", "gpu_ecc_dbe_volatile_total")


def parse_code(value: Any) -> int | None:
    """An XID code from event data (an int or a decimal string), None when malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value)
    return None


@dataclass(slots=True)
class _Xid:
    first_ts: float
    last_ts: float
    code: int | None
    message: str
    count: int = 1
    codes: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Gpu:
    last_seen: float
    xids: dict[str, _Xid] = field(default_factory=dict)
    volatile: float | None = None  # volatile ECC total at the last report: a drop means a reset


@register
class XidDetector(Detector):
    rules = (FATAL, APP)

    def __init__(
        self, hold: float = 600.0, reset_gap_factor: float = 3.0, reset_gap_floor: float = 3.0
    ) -> None:
        self.hold = hold
        self.reset_gap_factor = reset_gap_factor
        self.reset_gap_floor = reset_gap_floor
        self.counters = Counters()
        self._gpus: dict[GpuKey, _Gpu] = {}
        self._nodes: dict[str, IntervalEstimator] = {}

    def on_event(self, event: Event) -> None:
        if event.kind != "xid":
            return
        key = event_gpu(self.counters, event, "xid_events_without_gpu")
        if key is None:
            return
        node, gpu = key
        raw = event.data.get("code")
        code = parse_code(raw)
        if code is None:
            refuse(
                self.counters,
                "xid_events_bad_code",
                "xid event at %s on %s/%s: data.code %r is not an integer (treated as an application XID)",
                event.ts,
                node,
                gpu,
                raw,
            )
        message = event.data.get("message")
        text = message if isinstance(message, str) and message else MEANINGS.get(code or -1, "unknown XID")
        rule = rule_for(code, text)
        state = self._gpus.get((node, gpu))
        if state is None:
            state = self._gpus[(node, gpu)] = _Gpu(last_seen=event.ts)
        xid = state.xids.get(rule)
        if xid is None:
            state.xids[rule] = xid = _Xid(event.ts, event.ts, code, text)
        else:
            xid.count += 1
            if event.ts >= xid.last_ts:
                xid.last_ts, xid.code, xid.message = event.ts, code, text
        if code is not None:
            xid.codes.add(code)

    def reads(self, frame: FrameView) -> bool:
        return bool(frame.nodes)

    def on_frame(self, frame: Frame) -> None:
        v = view(frame)
        nodes = self._nodes
        for node in v.nodes:
            clock = nodes.get(node)
            if clock is None:
                clock = nodes[node] = IntervalEstimator()
            clock.push(frame.ts)
        if not self._gpus:
            return
        alive = v.gpu_alive()
        volatile = [c for c in (v.gpu_column(m) for m in _VOLATILE) if c is not None]
        for i, key in enumerate(v.gpu_keys):
            state = self._gpus.get(key)
            if state is None or not alive[i]:
                continue
            total = math.fsum(float(c[i]) for c in volatile if not math.isnan(c[i])) if volatile else None
            gap = frame.ts - state.last_seen
            counters_reset = total is not None and state.volatile is not None and total < state.volatile
            if gap > self._reset_gap(key[0]) or counters_reset:
                self._reset(key, state, frame.ts)
            state.last_seen = max(state.last_seen, frame.ts)
            state.volatile = total if total is not None else state.volatile

    def _reset_gap(self, node: str) -> float:
        clock = self._nodes.get(node)
        interval = clock.interval if clock is not None else None
        return max(self.reset_gap_factor * (interval or 1.0), self.reset_gap_floor)

    def _reset(self, key: GpuKey, state: _Gpu, ts: float) -> None:
        cleared = [rule for rule, xid in state.xids.items() if xid.last_ts < ts]
        for rule in cleared:
            del state.xids[rule]
        if cleared:
            self.counters.inc("xid_cleared_by_reset", len(cleared))
            log.info("GPU %s/%s answers again after a reset at %s: clearing %s", *key, ts, cleared)

    def evaluate(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for key, state in list(self._gpus.items()):
            for rule, xid in list(state.xids.items()):
                if now - xid.last_ts >= self.hold:
                    del state.xids[rule]
                else:
                    out.append(self._finding(rule, key, xid))
            if not state.xids:
                del self._gpus[key]
        return out

    @staticmethod
    def _finding(rule: str, key: GpuKey, xid: _Xid) -> Finding:
        node, gpu = key
        code = "?" if xid.code is None else str(xid.code)
        summary = f"XID {code} on {node} GPU {gpu}: {xid.message}"
        action = XID_ACTION.get(xid.code) if xid.code is not None else None
        if xid.code == 154:
            action = recovery_action(xid.message) or action
        if action:
            summary += f" (NVIDIA action: {action})"
        if xid.count > 1:
            summary += f" ({xid.count} XIDs of this class since {xid.first_ts:.0f})"
        known = xid.code in FATAL_XIDS or xid.code in APP_XIDS or xid.code in XID_ACTION
        return Finding(
            rule,
            {"node": node, "gpu": gpu},
            summary,
            value=None if xid.code is None else float(xid.code),
            # another code on the GPU while its alert is open is another cause: told again
            stage=max(len(xid.codes) - 1, 0),
            details={
                "code": xid.code,
                "codes": sorted(xid.codes),
                "count": xid.count,
                "message": xid.message,
                "first_ts": xid.first_ts,
                "last_ts": xid.last_ts,
                "known_code": known,
                "nvidia_action": action,
                "nvidia_fatal": XID_ACTION.get(xid.code or -1) in NVIDIA_FATAL_ACTIONS,
            },
        )
