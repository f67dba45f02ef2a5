"""The NVML collector over the fake NVML: every field, every fault state, error isolation."""

from __future__ import annotations

import time
from pathlib import Path

import pynvml  # type: ignore[import-untyped]
import pytest

from gpuscope.collect.base import Collected, CollectorSet
from gpuscope.collect.fake_nvml import (
    GPM_SM,
    GPM_TENSOR,
    HW_THERMAL,
    SW_POWER,
    SW_THERMAL,
    FakeMig,
    FakeNvml,
    FakeProcess,
)
from gpuscope.collect.nvml import NvmlCollector, decode_reasons
from gpuscope.collect.nvml_api import NvmlSession, NvmlUnavailable
from gpuscope.model import Frame


def gpu_frame(got: Collected) -> Frame:
    return next(f for f in got.frames if "gpu_temp_celsius" in f.metrics)


def row(got: Collected, gpu: str, **extra: str) -> dict[str, float]:
    for f in got.frames:
        for i, labels in enumerate(f.entities):
            same = labels.get("gpu") == gpu and all(labels.get(k) == v for k, v in extra.items())
            if same and set(extra) >= {k for k in ("link", "pid", "mig") if k in labels}:
                values = {m: float(f.values[i, j]) for j, m in enumerate(f.metrics)}
                return {m: v for m, v in values.items() if v == v}  # NaN: not reported
    raise AssertionError(f"no row for gpu {gpu} {extra}")


def busy(fake: FakeNvml, i: int) -> None:
    g = fake.gpus[i]
    g.util_gpu, g.util_mem, g.used, g.temp, g.mem_temp = 98, 41, 70 * 2**30, 64, 71
    g.power_mw, g.energy_mj, g.sm_clock, g.reasons = 612_345, 9_000_000, 1980, 0
    g.pcie_tx_kbps, g.pcie_rx_kbps = 3_000_000, 2_000_000
    assert g.gpm is not None
    g.gpm[GPM_SM], g.gpm[GPM_TENSOR] = 71.5, 40.0


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml.healthy(8)


@pytest.fixture
def nvml(fake: FakeNvml) -> NvmlCollector:
    c = NvmlCollector("node-1", lib=fake, slow_every=1, watch_events=True)
    yield c
    c.close()


def test_fake_mirrors_pynvml_types_and_error_codes(fake: FakeNvml) -> None:
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2), pynvml.c_nvmlMemory_v2_t)
    assert isinstance(fake.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)
    assert isinstance(fake.nvmlDeviceGetViolationStatus(h, 0), pynvml.c_nvmlViolationTime_t)
    assert fake.nvmlDeviceGetPciInfo(h).busId == "00000000:18:00.0"  # pynvml decodes char arrays
    fake.gpus[0].unsupported.add("nvmlDeviceGetRemappedRows")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetRemappedRows(h)
    fake.lose(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost) as lost:
        fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(1))
    assert lost.value.value == pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(fake.nvmlEventSetCreate(), 1)


def test_every_gpu_field_in_nvml_units_becomes_ours(fake: FakeNvml, nvml: NvmlCollector) -> None:
    busy(fake, 2)
    g = fake.gpus[2]
    g.violation_ns = {0: 3_000_000_000, 1: 500_000_000}
    g.retired = {0: [0x1000, 0x2000], 1: [0x3000]}
    g.retired_pending = True
    g.remapped = (4, 1, 1, 0)
    g.pcie_replay = 17
    nvml.collect(100.0)
    for link in g.links:
        link.tx_kib, link.rx_kib = 1_000, 500
    got = nvml.collect(102.0)
    assert got.errors == []
    r = row(got, "2")
    assert r["gpu_utilization_percent"] == 98 and r["gpu_memory_utilization_percent"] == 41
    assert r["gpu_memory_used_bytes"] == 70 * 2**30
    assert r["gpu_memory_reserved_bytes"] == g.reserved
    assert r["gpu_memory_free_bytes"] == g.total - g.reserved - g.used
    assert r["gpu_memory_total_bytes"] == g.total
    assert (r["gpu_temp_celsius"], r["gpu_memory_temp_celsius"]) == (64, 71)
    assert r["gpu_power_watts"] == pytest.approx(612.345) and r["gpu_power_limit_watts"] == 700
    assert r["gpu_energy_joules_total"] == 9000
    assert (r["gpu_sm_clock_mhz"], r["gpu_memory_clock_mhz"]) == (1980, 2619)
    assert r["gpu_violation_power_seconds_total"] == 3.0 and r["gpu_violation_thermal_seconds_total"] == 0.5
    assert (r["gpu_retired_pages_sbe"], r["gpu_retired_pages_dbe"], r["gpu_retired_pages_pending"]) == (
        2,
        1,
        1,
    )
    assert [r[f"gpu_remapped_rows_{k}"] for k in ("correctable", "uncorrectable", "pending", "failure")] == [
        4,
        1,
        1,
        0,
    ]
    assert r["gpu_pcie_tx_bytes_per_second"] == 3_000_000 * 1024 and r["gpu_pcie_replay_total"] == 17
    assert r["gpu_nvlink_tx_bytes_per_second"] == pytest.approx(18 * 1000 * 1024 / 2)
    assert r["gpu_nvlink_rx_bytes_per_second"] == pytest.approx(18 * 500 * 1024 / 2)
    assert r["gpu_nvlink_links_down"] == 0
    assert r["gpu_sm_active_ratio"] == pytest.approx(0.715) and r["gpu_tensor_active_ratio"] == 0.4
    link = row(got, "2", link="5")
    assert link["gpu_nvlink_link_up"] == 1 and link["gpu_nvlink_link_tx_bytes_per_second"] == 512_000
    assert gpu_frame(got).entities[2] == {"node": "node-1", "gpu": "2", "uuid": g.uuid}


def test_first_round_has_no_gpm_or_nvlink_rates_yet(nvml: NvmlCollector) -> None:
    r = row(nvml.collect(1.0), "0")
    assert "gpu_sm_active_ratio" not in r and "gpu_nvlink_tx_bytes_per_second" not in r
    assert "gpu_temp_celsius" in r


def test_throttle_reasons_are_decoded_into_flags(fake: FakeNvml, nvml: NvmlCollector) -> None:
    fake.throttle(1, SW_THERMAL | HW_THERMAL)
    fake.throttle(4, SW_POWER, sm_clock=1410)
    got = nvml.collect(1.0)
    thermal, power = row(got, "1"), row(got, "4")
    assert thermal["gpu_throttle_sw_thermal"] == thermal["gpu_throttle_hw_thermal"] == 1
    assert thermal["gpu_throttle_sw_power"] == 0 and thermal["gpu_clock_event_reasons"] == 0x60
    assert power["gpu_throttle_sw_power"] == 1 and power["gpu_sm_clock_mhz"] == 1410
    assert decode_reasons(0x60) == ["sw_thermal_slowdown", "hw_thermal_slowdown"]


def test_ecc_errors_reach_counters_and_a_dbe_event(fake: FakeNvml, nvml: NvmlCollector) -> None:
    nvml.collect(1.0)  # registers the event set
    fake.ecc_errors(3, corrected=12, uncorrected=2)
    fake.gpus[3].links[7].crc_flit, fake.gpus[3].links[7].crc_data, fake.gpus[3].links[2].replay = 5, 1, 3
    fake.gpus[3].links[9].active = False
    deadline = time.monotonic() + 5
    events: list[str] = []
    r: dict[str, float] = {}
    while time.monotonic() < deadline and "ecc_dbe" not in events:
        got = nvml.collect(2.0)
        events += [e.kind for e in got.events]
        r = r or row(got, "3")
        time.sleep(0.02)
    assert "ecc_dbe" in events
    assert (r["gpu_ecc_sbe_volatile_total"], r["gpu_ecc_dbe_volatile_total"]) == (12, 2)
    assert (r["gpu_ecc_sbe_aggregate_total"], r["gpu_ecc_dbe_aggregate_total"]) == (12, 2)
    assert r["gpu_nvlink_crc_errors_total"] == 6 and r["gpu_nvlink_replay_errors_total"] == 3
    assert r["gpu_nvlink_links_down"] == 1


def test_xid_arrives_through_the_event_thread(fake: FakeNvml, nvml: NvmlCollector) -> None:
    nvml.collect(1.0)
    assert nvml.watcher is not None and nvml.watcher.registered == 8
    fake.xid(6, 79)
    deadline = time.monotonic() + 5
    xids = []
    while time.monotonic() < deadline and not xids:
        time.sleep(0.02)
        xids = [e for e in nvml.collect(2.0).events if e.kind == "xid"]
    assert xids[0].data["code"] == 79 and xids[0].labels["gpu"] == "6"
    assert xids[0].labels["uuid"] == fake.gpus[6].uuid


def test_a_lost_gpu_is_one_event_and_the_others_go_on(fake: FakeNvml, nvml: NvmlCollector) -> None:
    nvml.collect(1.0)
    fake.lose(5)
    got = nvml.collect(2.0)
    lost = [e for e in got.events if e.kind == "gpu_lost"]
    assert len(lost) == 1 and lost[0].labels["gpu"] == "5" and lost[0].data["code"] == 15
    assert [e["gpu"] for e in gpu_frame(got).entities] == ["0", "1", "2", "3", "4", "6", "7"]
    again = nvml.collect(3.0)
    assert not [e for e in again.events if e.kind == "gpu_lost"]


def test_unsupported_field_never_drops_the_rest_and_is_not_asked_again(fake: FakeNvml) -> None:
    fake.gpus[0].unsupported |= {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors"}
    fake.gpus[0].gpm = None
    asked: list[int] = []
    real = fake.nvmlDeviceGetRemappedRows

    def counting(handle: object) -> tuple[int, int, int, int]:
        asked.append(1)
        return real(handle)  # type: ignore[no-any-return]

    fake.nvmlDeviceGetRemappedRows = counting  # type: ignore[method-assign]
    c = NvmlCollector("n", lib=fake, slow_every=1, watch_events=False)
    c.collect(1.0)
    assert len(asked) == 8
    got = c.collect(2.0)
    assert len(asked) == 15  # GPU 0 is not asked again
    r = row(got, "0")
    assert "gpu_remapped_rows_failure" not in r and "gpu_ecc_dbe_volatile_total" not in r
    assert "gpu_sm_active_ratio" not in r
    assert r["gpu_temp_celsius"] == 32 and row(got, "1")["gpu_remapped_rows_failure"] == 0
    assert got.errors == []
    c.close()


def test_other_nvml_failures_are_errors_of_that_field_only(fake: FakeNvml) -> None:
    def broken(handle: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_IRQ_ISSUE)

    c = NvmlCollector("n", lib=fake, slow_every=1, watch_events=False)
    c.collect(1.0)
    fake.nvmlDeviceGetPowerUsage = broken  # type: ignore[method-assign]
    got = c.collect(2.0)
    assert {e.kind for e in got.errors} == {"nvml_power"}
    assert len(got.errors) == 8 and "Interrupt Request Issue" in got.errors[0].message
    assert row(got, "0")["gpu_temp_celsius"] == 32 and "gpu_power_watts" not in row(got, "0")
    c.close()


def test_slow_counters_are_read_every_nth_round(fake: FakeNvml) -> None:
    c = NvmlCollector("n", lib=fake, slow_every=3, watch_events=False)
    has = ["gpu_ecc_dbe_volatile_total" in row(c.collect(float(t)), "0") for t in range(6)]
    assert has == [True, False, False, True, False, False]
    c.close()


def test_processes_attribute_the_gpu_to_their_job(fake: FakeNvml, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "environ").write_bytes(b"PATH=/bin\0SLURM_JOB_ID=88123\0RANK=3\0")
    (proc / "4242" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_88123/step_0\n")
    (proc / "77").mkdir()
    (proc / "77" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_aaaa_bbbb_cccc_0123456789ab"
        ".slice/cri-containerd-3f4e5d6c7b8a9f0e1d2c3b4a59687766554433221100ffeeddccbbaa99887766.scope\n"
    )
    fake.gpus[0].processes = [FakeProcess(4242, 60 * 2**30), FakeProcess(99999, 2**30)]
    fake.gpus[1].processes = [FakeProcess(77, 10 * 2**30)]
    c = NvmlCollector("n", proc_root=str(proc), lib=fake, watch_events=False)
    got = c.collect(1.0)
    g0 = gpu_frame(got).entities[0]
    assert g0["job"] == "88123"
    g1 = gpu_frame(got).entities[1]
    assert g1["pod"] == "1b2c3d4e-aaaa-bbbb-cccc-0123456789ab" and g1["container"] == "3f4e5d6c7b8a"
    p = row(got, "0", pid="4242")
    assert p == {"gpu_process_memory_used_bytes": 60 * 2**30}
    labels = next(e for f in got.frames for e in f.entities if e.get("pid") == "4242")
    assert labels["rank"] == "3" and labels["job"] == "88123"
    assert row(got, "0", pid="99999")["gpu_process_memory_used_bytes"] == 2**30  # gone: no owner
    c.close()


def test_mig_instances_are_entities_of_their_own(fake: FakeNvml) -> None:
    fake = FakeNvml.healthy(1)
    fake.gpus[0].mig = [
        FakeMig(1, 0, "MIG-aaaa", total=20 * 2**30, used=5 * 2**30, gpm={GPM_SM: 50.0}),
        FakeMig(2, 0, "MIG-bbbb", total=20 * 2**30, used=1 * 2**30, gpm={GPM_SM: 10.0}),
    ]
    fake = FakeNvml(fake.gpus)
    c = NvmlCollector("n", lib=fake, watch_events=False)
    c.collect(1.0)
    got = c.collect(2.0)
    a = row(got, "0", mig="1.0")
    assert a["gpu_memory_used_bytes"] == 5 * 2**30 and a["gpu_sm_active_ratio"] == 0.5
    assert row(got, "0", mig="2.0")["gpu_memory_free_bytes"] == 19 * 2**30
    labels = [e for f in got.frames for e in f.entities if "mig" in e]
    assert {e["uuid"] for e in labels} == {"MIG-aaaa", "MIG-bbbb"}
    c.close()


def test_no_driver_is_a_clear_error_counted_by_the_collector_set() -> None:
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    with pytest.raises(NvmlUnavailable, match="NVML Shared Library Not Found"):
        NvmlSession(NoDriver([])).open()
    cs = CollectorSet([NvmlCollector("n", lib=NoDriver([]))])
    got = cs.collect(1.0)
    assert got.errors[0].kind == "NvmlUnavailable"
    assert cs.counters.get("collector_errors.nvml") == 1


def test_nvml_is_initialised_once_and_shut_down_on_close(fake: FakeNvml) -> None:
    c = NvmlCollector("n", lib=fake)
    for t in range(3):
        c.collect(float(t))
    assert fake.initialised == 1
    c.close()
    assert fake.initialised == 0
