"""Per-node host telemetry (CPU, memory, disk, Ethernet/TCP, InfiniBand), vectorised over nodes.

Levels follow AcmeTrace's node CDFs: host CPU 1-5 % idle, 15-45 % while GPUs train; host
memory 5-30 % of a 2 TiB DGX-class host. TCP retransmits stay near 1e-4 of segments sent and
InfiniBand error counters near zero until a fault raises them.
"""

from __future__ import annotations

import numpy as np

from gpuscope.model import FloatArray
from gpuscope.signals import NODE_METRICS

NODE_COLUMNS: tuple[str, ...] = tuple(NODE_METRICS)
NCOL = {name: j for j, name in enumerate(NODE_COLUMNS)}

HOST_MEMORY = 2048 * 1024**3
HOST_CORES = 224
MSS = 1448.0
RETRANS_BASE = 1e-4
IB_ERROR_BASE = 1e-6


class NodeFleet:
    """Every node of the cluster; workloads fill the demand arrays, faults the modifiers."""

    def __init__(self, nodes: tuple[str, ...], rng: np.random.Generator) -> None:
        self.names = nodes
        self.rng = rng
        n = self.n = len(nodes)
        self.up = np.ones(n, dtype=bool)
        self.base_mem = rng.uniform(0.04, 0.08, n) * HOST_MEMORY
        self.disk = rng.uniform(0.2, 0.55, n)
        # tcp_out, tcp_retrans, ib_symbol, ib_rcv, ib_link_downed
        self.counters = np.zeros((n, 5))
        self.counters[:, 0] = rng.uniform(1e9, 5e10, n).round()
        self.counters[:, 1] = (self.counters[:, 0] * RETRANS_BASE).round()
        self.reset_demand()
        self.reset_mods()

    def reset_demand(self) -> None:
        n = self.n
        self.busy_gpus = np.zeros(n)
        self.ib_bw = np.zeros(n)
        self.storage_tx = np.zeros(n)
        self.host_mem = np.zeros(n)

    def reset_mods(self) -> None:
        n = self.n
        self.retrans_ratio = np.zeros(n)
        self.ib_error_rate = np.zeros(n)
        self.down = np.zeros(n, dtype=bool)

    def reboot(self, k: int) -> None:
        """A node came back: the kernel's and the HCA's counters start again from zero."""
        self.counters[k] = 0.0

    def sample(self, dt: float) -> FloatArray:
        rng, n = self.rng, self.n
        z = rng.standard_normal((n, 4))
        cpu = np.clip(2.0 + 2.6 * self.busy_gpus + 1.5 * z[:, 0] + 0.3 * self.busy_gpus * z[:, 1], 0.3, 100.0)
        eth_rx = 4e6 + 5e7 * self.busy_gpus * (1.0 + 0.1 * np.abs(z[:, 2]))
        eth_tx = 3e6 + self.storage_tx + 2e6 * self.busy_gpus
        segs = (eth_tx / MSS + 1500.0) * dt
        ratio = RETRANS_BASE + self.retrans_ratio
        ib_err = IB_ERROR_BASE + self.ib_error_rate
        lam = np.stack(
            [segs * ratio, 0.5 * ib_err * dt, 0.5 * ib_err * dt, self.ib_error_rate * dt / 300.0], axis=1
        )
        inc = rng.poisson(lam).astype(float)
        self.counters[:, 0] += np.round(segs)
        self.counters[:, 1:5] += inc
        self.disk = np.minimum(self.disk + self.storage_tx * dt * 1e-16, 0.95)
        ib = self.ib_bw * (1.0 + 0.04 * z[:, 3])

        out = np.empty((n, len(NODE_COLUMNS)))
        c = NCOL
        out[:, c["node_cpu_percent"]] = np.round(cpu, 1)
        out[:, c["node_load1"]] = np.round(cpu / 100.0 * HOST_CORES * 0.9 + 0.5, 2)
        out[:, c["node_memory_used_bytes"]] = self.base_mem + self.host_mem
        out[:, c["node_memory_total_bytes"]] = HOST_MEMORY
        out[:, c["node_disk_used_ratio"]] = np.round(self.disk, 4)
        out[:, c["node_net_rx_bytes_per_second"]] = eth_rx
        out[:, c["node_net_tx_bytes_per_second"]] = eth_tx
        out[:, c["node_tcp_out_segs_total"]] = self.counters[:, 0]
        out[:, c["node_tcp_retrans_segs_total"]] = self.counters[:, 1]
        out[:, c["node_ib_rx_bytes_per_second"]] = ib
        out[:, c["node_ib_tx_bytes_per_second"]] = ib
        out[:, c["node_ib_symbol_errors_total"]] = self.counters[:, 2]
        out[:, c["node_ib_rcv_errors_total"]] = self.counters[:, 3]
        out[:, c["node_ib_link_downed_total"]] = self.counters[:, 4]
        out[:, c["node_ib_ports_down"]] = 0.0
        return out
