"""The simulator's seam into the fake NVML: simulated telemetry comes back out of the real collector."""

from __future__ import annotations

import time

import numpy as np
import pytest

from gpuscope.collect.fake_nvml import FakeNvml
from gpuscope.collect.nvml import NvmlCollector
from gpuscope.collect.sim_nvml import apply_event, apply_frame
from gpuscope.model import Event, Frame

SIMULATED = {
    "gpu_utilization_percent": 99.0,
    "gpu_memory_utilization_percent": 37.0,
    "gpu_memory_used_bytes": 71 * 2**30,
    "gpu_temp_celsius": 66.0,
    "gpu_power_watts": 633.25,
    "gpu_energy_joules_total": 123456.0,
    "gpu_sm_clock_mhz": 1755.0,
    "gpu_clock_event_reasons": 4.0,
    "gpu_ecc_sbe_volatile_total": 3.0,
    "gpu_ecc_dbe_volatile_total": 1.0,
    "gpu_pcie_tx_bytes_per_second": 3 * 2**30,
    "gpu_pcie_replay_total": 9.0,
    "gpu_nvlink_crc_errors_total": 40.0,
    "gpu_nvlink_links_down": 2.0,
    "gpu_sm_active_ratio": 0.625,
}


def test_a_simulated_row_reads_back_through_the_real_collector() -> None:
    fake = FakeNvml.healthy(4)
    c = NvmlCollector("node-2", lib=fake, slow_every=1, watch_events=False)
    sim = Frame(
        0.0,
        list(SIMULATED),
        [{"node": "node-2", "gpu": "1"}],
        np.array([list(SIMULATED.values())], dtype=np.float64),
    )
    assert apply_frame(fake, sim) == 1
    c.collect(1.0)
    got = c.collect(2.0)
    f = next(f for f in got.frames if "gpu_temp_celsius" in f.metrics)
    back = {m: float(f.values[1, j]) for j, m in enumerate(f.metrics)}
    for metric, value in SIMULATED.items():
        assert back[metric] == pytest.approx(value), metric
    assert back["gpu_throttle_sw_power"] == 1
    c.close()


def test_simulated_xid_and_lost_gpu_events_drive_the_fake() -> None:
    fake = FakeNvml.healthy(2)
    c = NvmlCollector("n", lib=fake, watch_events=True)
    c.collect(1.0)
    assert apply_event(fake, Event(2.0, "xid", {"node": "n", "gpu": "0"}, {"code": 94}))
    assert apply_event(fake, Event(2.0, "gpu_lost", {"node": "n", "gpu": "1"}))
    assert not apply_event(fake, Event(2.0, "heartbeat", {"node": "n", "gpu": "1"}))
    kinds: list[tuple[str, str]] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(kinds) < 2:
        kinds += [(e.kind, e.labels["gpu"]) for e in c.collect(3.0).events]
        time.sleep(0.02)
    assert sorted(kinds) == [("gpu_lost", "1"), ("xid", "0")]
    c.close()
