"""InfiniBand and RoCE ports from sysfs: the ``infiniband`` collector.

Reads ``<sys_root>/class/infiniband/<device>/ports/<n>/``: ``state``, ``rate``, ``counters/``
and the driver's ``hw_counters/``. ``port_rcv_data``/``port_xmit_data`` count 4-byte words
(the IB spec's octets divided by 4), so they are multiplied by 4. Per port a row of
``ib_port_*`` metrics; per node the ``node_ib_*`` totals the detectors use. A file that is
absent is simply not reported; one that is unreadable or not a number is an error for that
file only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Self

from gpuscope.collect.base import Collected, Collector, CollectorContext, CollectorError, register_collector
from gpuscope.collect.nvml import frame
from gpuscope.signals import DETAIL_METRICS, NODE_METRICS

#: counters/ file -> (metric, factor); names of the kernel's PMA attributes (torvalds/linux
#: drivers/infiniband/core/sysfs.c PORT_PMA_ATTR list at e04360a)
COUNTERS = {
    "port_rcv_data": ("ib_port_rx_bytes_total", 4),
    "port_xmit_data": ("ib_port_tx_bytes_total", 4),
    "symbol_error": ("ib_port_symbol_errors_total", 1),
    "port_rcv_errors": ("ib_port_rcv_errors_total", 1),
    "link_downed": ("ib_port_link_downed_total", 1),
    "link_error_recovery": ("ib_port_link_error_recovery_total", 1),
    "port_xmit_discards": ("ib_port_xmit_discards_total", 1),
    "port_xmit_wait": ("ib_port_xmit_wait_total", 1),
    "port_rcv_remote_physical_errors": ("ib_port_rcv_remote_physical_errors_total", 1),
    "port_rcv_switch_relay_errors": ("ib_port_rcv_switch_relay_errors_total", 1),
    "local_link_integrity_errors": ("ib_port_local_link_integrity_errors_total", 1),
    "excessive_buffer_overrun_errors": ("ib_port_excessive_buffer_overrun_errors_total", 1),
    "VL15_dropped": ("ib_port_vl15_dropped_total", 1),
    "port_xmit_constraint_errors": ("ib_port_xmit_constraint_errors_total", 1),
    "port_rcv_constraint_errors": ("ib_port_rcv_constraint_errors_total", 1),
    "port_xmit_packets": ("ib_port_tx_packets_total", 1),
    "port_rcv_packets": ("ib_port_rx_packets_total", 1),
}
#: hw_counters/ file -> metric; mlx5's names (torvalds/linux drivers/infiniband/hw/mlx5/counters.c at
#: 10d4de4: basic/out-of-sequence/retransmission q counters, cong_cnts, extended_err_cnts, roce_accl_cnts)
HW_COUNTERS = {
    "out_of_sequence": "ib_port_out_of_sequence_total",
    "packet_seq_err": "ib_port_packet_seq_errors_total",
    "local_ack_timeout_err": "ib_port_local_ack_timeout_errors_total",
    "rnr_nak_retry_err": "ib_port_rnr_nak_retry_errors_total",
    "out_of_buffer": "ib_port_out_of_buffer_total",
    "duplicate_request": "ib_port_duplicate_requests_total",
    "implied_nak_seq_err": "ib_port_implied_nak_seq_errors_total",
    "np_cnp_sent": "ib_port_cnp_sent_total",
    "rp_cnp_handled": "ib_port_cnp_handled_total",
    "rp_cnp_ignored": "ib_port_cnp_ignored_total",
    "np_ecn_marked_roce_packets": "ib_port_ecn_marked_packets_total",
    "req_transport_retries_exceeded": "ib_port_transport_retries_exceeded_total",
    "req_rnr_retries_exceeded": "ib_port_rnr_retries_exceeded_total",
    "req_cqe_error": "ib_port_req_cqe_errors_total",
    "resp_cqe_error": "ib_port_resp_cqe_errors_total",
    "req_cqe_flush_error": "ib_port_req_cqe_flush_errors_total",
    "resp_cqe_flush_error": "ib_port_resp_cqe_flush_errors_total",
    "req_remote_invalid_request": "ib_port_req_remote_invalid_requests_total",
    "req_remote_access_errors": "ib_port_req_remote_access_errors_total",
    "resp_remote_access_errors": "ib_port_resp_remote_access_errors_total",
    "resp_local_length_error": "ib_port_resp_local_length_errors_total",
    "roce_adp_retrans": "ib_port_roce_adaptive_retrans_total",
    "roce_adp_retrans_to": "ib_port_roce_adaptive_retrans_timeouts_total",
    "roce_slow_restart": "ib_port_roce_slow_restarts_total",
    "roce_slow_restart_cnps": "ib_port_roce_slow_restart_cnps_total",
    "roce_slow_restart_trans": "ib_port_roce_slow_restart_trans_total",
    "rx_icrc_encapsulated": "ib_port_rx_icrc_encapsulated_total",
}
NODE_TOTALS = {
    "ib_port_symbol_errors_total": "node_ib_symbol_errors_total",
    "ib_port_rcv_errors_total": "node_ib_rcv_errors_total",
    "ib_port_link_downed_total": "node_ib_link_downed_total",
}
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


@dataclass(slots=True)
class Port:
    device: str
    port: str
    state: str = ""
    link_layer: str = ""
    values: dict[str, float] = field(default_factory=dict)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return None


def read_ports(sys_root: str, errors: list[CollectorError]) -> list[Port]:
    """Every port under ``<sys_root>/class/infiniband``; empty when the node has none."""
    base = os.path.join(sys_root, "class", "infiniband")
    try:
        devices = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    ports: list[Port] = []
    for dev in devices:
        try:
            port_ids = sorted(os.listdir(os.path.join(base, dev, "ports")), key=lambda p: (len(p), p))
        except OSError as exc:
            errors.append(CollectorError("ib_read", f"{dev}: {exc}"))
            continue
        for pid in port_ids:
            ports.append(_read_port(os.path.join(base, dev, "ports", pid), Port(dev, pid), errors))
    return ports


def _number(path: str, errors: list[CollectorError]) -> float | None:
    try:
        text = _read(path)
    except OSError as exc:
        errors.append(CollectorError("ib_read", f"{path}: {exc}"))
        return None
    if text is None:
        return None
    try:
        return float(int(text))
    except (ValueError, OverflowError):  # OverflowError: more digits than any counter has
        errors.append(CollectorError("ib_format", f"{path}: {text[:40]!r} is not a counter"))
        return None


def _read_port(path: str, port: Port, errors: list[CollectorError]) -> Port:
    try:
        state = _read(os.path.join(path, "state")) or ""
        rate = _read(os.path.join(path, "rate")) or ""
        port.link_layer = _read(os.path.join(path, "link_layer")) or ""
    except OSError as exc:
        errors.append(CollectorError("ib_read", f"{path}: {exc}"))
        state = rate = ""
    port.state = state.split(":")[-1].strip()  # "4: ACTIVE"
    if state:
        port.values["ib_port_up"] = 1.0 if port.state == "ACTIVE" else 0.0
    if m := _RATE.match(rate):
        port.values["ib_port_rate_gbps"] = float(m.group(1))
    for name, (metric, factor) in COUNTERS.items():
        v = _number(os.path.join(path, "counters", name), errors)
        if v is not None:
            port.values[metric] = v * factor
    for name, metric in HW_COUNTERS.items():
        v = _number(os.path.join(path, "hw_counters", name), errors)
        if v is not None:
            port.values[metric] = v
    return port


@register_collector
class InfinibandCollector(Collector):
    """Per-port and per-node InfiniBand/RoCE telemetry."""

    name = "infiniband"
    default = os.path.isdir("/sys/class/infiniband")
    enabled_by = ("infiniband",)

    def __init__(self, node: str, *, proc_root: str = "/proc", sys_root: str = "/sys") -> None:
        super().__init__(node, proc_root=proc_root, sys_root=sys_root)
        self._prev: tuple[float, dict[tuple[str, str], tuple[float, float]]] | None = None

    @classmethod
    def from_context(cls, ctx: CollectorContext) -> Self:
        return cls(ctx.node, proc_root=ctx.proc_root, sys_root=ctx.sys_root)

    def collect(self, now: float) -> Collected:
        out = Collected()
        ports = read_ports(self.sys_root, out.errors)
        if not ports:
            return out
        bytes_now = {
            (p.device, p.port): (p.values["ib_port_rx_bytes_total"], p.values["ib_port_tx_bytes_total"])
            for p in ports
            if "ib_port_rx_bytes_total" in p.values and "ib_port_tx_bytes_total" in p.values
        }
        node: dict[str, float] = {
            "node_ib_ports_down": float(sum(p.values.get("ib_port_up") == 0.0 for p in ports))
        }
        for port_metric, node_metric in NODE_TOTALS.items():
            node[node_metric] = sum(p.values.get(port_metric, 0.0) for p in ports)
        if self._prev is not None and now > self._prev[0]:
            dt = now - self._prev[0]
            rx_sum = tx_sum = 0.0
            for p in ports:
                cur, before = bytes_now.get((p.device, p.port)), self._prev[1].get((p.device, p.port))
                if cur is None or before is None or cur[0] < before[0] or cur[1] < before[1]:
                    continue  # new port or counter reset: no rate this round
                p.values["ib_port_rx_bytes_per_second"] = (cur[0] - before[0]) / dt
                p.values["ib_port_tx_bytes_per_second"] = (cur[1] - before[1]) / dt
                rx_sum += p.values["ib_port_rx_bytes_per_second"]
                tx_sum += p.values["ib_port_tx_bytes_per_second"]
            node["node_ib_rx_bytes_per_second"], node["node_ib_tx_bytes_per_second"] = rx_sum, tx_sum
        self._prev = (now, bytes_now)
        rows = [({"node": self.node, "device": p.device, "port": p.port}, p.values) for p in ports]
        for f in (frame(now, DETAIL_METRICS, rows), frame(now, NODE_METRICS, [({"node": self.node}, node)])):
            if f is not None:
                out.frames.append(f)
        return out
