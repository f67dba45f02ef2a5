"""dcgm-exporter pages shaped like upstream's: every default counter, DCGM 4.6 canonical names,
per-pod and per-job copies of a GPU's series, units, label template and XIDs.

Upstream files (names and label template copied from them):
- NVIDIA/dcgm-exporter etc/default-counters.csv, internal/pkg/rendermetrics/render_metrics.go,
  internal/pkg/transformation/{const.go,hpc.go,kubernetes.go}, internal/pkg/collector/xid_collector.go
  at d5e5f510a1b6b393f39a43293ccd9dc985defc79
- NVIDIA/DCGM dcgmlib/dcgm_fields.h at 72fa3feaa67d716a75323a8f47c34ff3ee73f824 (DCGM 4.6.0)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from gpuscope.collect.dcgm import DcgmCollector, map_samples
from gpuscope.collect.promtext import parse_exposition
from support import QuietHandler, loopback_http

UUID = "GPU-5f1c9f1a-2b7e-4c55-9a43-3e7d1c0b9e21"
#: render_metrics.go gpuMetricsFormat: gpu, UUID, pci_bus_id, device, modelName, hostname, then
#: label-type counters (DCGM_FI_DRIVER_VERSION) and attributes
TEMPLATE = (
    'gpu="5",UUID="{uuid}",pci_bus_id="00000000:9B:00.0",device="nvidia5",modelName="NVIDIA H100 80GB HBM3",'
    'hostname="n1",DCGM_FI_DRIVER_VERSION="570.124.06"'
)

#: every sample field enabled in default-counters.csv at d5e5f51, with a plausible value
DEFAULT_ENABLED = {
    "DCGM_FI_DEV_SM_CLOCK": 1980,
    "DCGM_FI_DEV_MEM_CLOCK": 2619,
    "DCGM_FI_DEV_MEMORY_TEMP": 41,
    "DCGM_FI_DEV_GPU_TEMP": 38,
    "DCGM_FI_DEV_POWER_USAGE": 412.5,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123456789,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3,
    "DCGM_FI_DEV_GPU_UTIL": 97,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 41,
    "DCGM_FI_DEV_ENC_UTIL": 0,
    "DCGM_FI_DEV_DEC_UTIL": 0,
    "DCGM_FI_DEV_XID_ERRORS": 0,
    "DCGM_FI_DEV_FB_FREE": 1024,
    "DCGM_FI_DEV_FB_USED": 79000,
    "DCGM_FI_DEV_FB_RESERVED": 535,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 1000,
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.93,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.41,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.55,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1.5e9,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 2.5e9,
}
#: dcgm_fields.h "renamed per DCGM Field Naming Standard": legacy -> canonical
CANONICAL = {
    "DCGM_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
    "DCGM_FI_DEV_GPU_UTIL": "DCGM_FI_DEV_GPU_UTIL_RATIO",
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
}


def page(fields: dict[str, float], extra: str = "", uuid: str = UUID) -> str:
    labels = TEMPLATE.format(uuid=uuid) + extra
    return "\n".join(f"{name}{{{labels}}} {value}" for name, value in fields.items()) + "\n"


def gpu_values(text: str) -> dict[str, float]:
    reading = map_samples(parse_exposition(text), "n1")
    assert len(reading.gpus) == 1
    return next(iter(reading.gpus.values())).values


def test_every_default_counter_but_the_vgpu_licence_is_mapped() -> None:
    reading = map_samples(parse_exposition(page(DEFAULT_ENABLED)), "n1")
    g = reading.gpus[("5", UUID, "")]
    assert reading.unmapped == 1  # DCGM_FI_DEV_VGPU_LICENSE_STATUS: licensing, not telemetry
    v = g.values
    assert v["gpu_gr_engine_active_ratio"] == pytest.approx(0.93)
    assert v["gpu_nvlink_data_bytes_total"] == 1000 * 1024  # KiB (NVML THROUGHPUT_DATA fields)
    assert v["gpu_utilization_percent"] == 97 and v["gpu_memory_used_bytes"] == 79000 * 2**20
    assert v["gpu_energy_joules_total"] == pytest.approx(123456.789)
    assert v["gpu_encoder_utilization_percent"] == 0 and v["gpu_remapped_rows_correctable"] == 2
    assert g.info == {"pci_bus_id": "0000:9b:00", "model": "NVIDIA H100 80GB HBM3", "driver": "570.124.06"}
    assert g.labels == {"node": "n1", "gpu": "5", "uuid": UUID}


def test_dcgm_4_6_canonical_names_read_the_same() -> None:
    legacy = gpu_values(page(DEFAULT_ENABLED))
    renamed = {CANONICAL.get(k, k): v for k, v in DEFAULT_ENABLED.items()}
    assert gpu_values(page(renamed)) == legacy


def test_violation_times_are_nanoseconds() -> None:
    # dcgm_fields.h: "Power Violation time in ns", "Thermal Violation time in ns"
    v = gpu_values(
        page({"DCGM_FI_DEV_POWER_VIOLATION": 2_000_000_000, "DCGM_FI_DEV_THERMAL_VIOLATION": 500_000_000})
    )
    assert v["gpu_violation_power_seconds_total"] == pytest.approx(2.0)
    assert v["gpu_violation_thermal_seconds_total"] == pytest.approx(0.5)


def test_clock_event_duration_fields_of_dcgm_4() -> None:
    v = gpu_values(
        page(
            {
                "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS": 1e9,
                "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS": 2e9,
                "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS": 3e9,
                "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS": 4e9,
            }
        )
    )
    assert v["gpu_violation_power_seconds_total"] == pytest.approx(1.0)
    assert v["gpu_violation_thermal_seconds_total"] == pytest.approx(2.0)
    assert v["gpu_violation_hw_thermal_seconds_total"] == pytest.approx(3.0)
    assert v["gpu_violation_hw_power_brake_seconds_total"] == pytest.approx(4.0)
    # the name gpuscope once read does not exist in dcgm_fields.h
    reading = map_samples(
        parse_exposition(page({"DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERMAL_NS": 1e9})), "n1"
    )
    assert reading.unmapped == 1 and not reading.gpus


@pytest.mark.parametrize("instant_first", [True, False])
def test_averaged_power_wins_over_the_instant_reading_in_any_order(instant_first: bool) -> None:
    fields = {"DCGM_FI_DEV_POWER_USAGE": 400.0, "DCGM_FI_DEV_POWER_USAGE_INSTANT": 655.0}
    if instant_first:
        fields = dict(reversed(list(fields.items())))
    fields |= {"DCGM_FI_DEV_POWER_MGMT_LIMIT": 700.0, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 600.0}
    v = gpu_values(page(fields))
    assert v["gpu_power_watts"] == 400.0 and v["gpu_power_limit_watts"] == 600.0


def test_mig_instance_utilization_comes_from_the_graphics_engine() -> None:
    text = page(
        {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.8, "DCGM_FI_DEV_FB_USED": 100},
        ',GPU_I_PROFILE="1g.10gb",GPU_I_ID="3"',
    )
    reading = map_samples(parse_exposition(text), "n1")
    g = reading.gpus[("5", UUID, "3")]
    assert g.labels["mig"] == "3" and g.values["gpu_utilization_percent"] == pytest.approx(80.0)


def test_time_sliced_gpu_keeps_device_values_and_turns_pods_into_owners() -> None:
    # kubernetes.go with per-process metrics: the device-level series, then one copy per pod whose
    # GPU_UTIL / FB_USED carry the pod's share (process_metrics.go); other fields repeat the device
    device = page(
        {
            "DCGM_FI_DEV_GPU_UTIL": 90,
            "DCGM_FI_DEV_FB_USED": 8000,
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 7,
        }
    )
    pods = ""
    for pod, uid, util, fb in (
        ("train-a", "11111111-1111-1111-1111-111111111111", 60, 6000),
        ("train-b", "22222222-2222-2222-2222-222222222222", 30, 2000),
    ):
        pods += page(
            {
                "DCGM_FI_DEV_GPU_UTIL": util,
                "DCGM_FI_DEV_FB_USED": fb,
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 7,
            },
            f',pod="{pod}",namespace="ml",container="main",pod_uid="{uid}"',
        )
    for text in (device + pods, pods + device):
        c = DcgmCollector("n1", fetch=lambda text=text: text)  # type: ignore[misc]
        got = c.collect(1.0)
        gpu_frame, owner_frame = got.frames
        row = dict(zip(gpu_frame.metrics, gpu_frame.values[0], strict=True))
        assert row["gpu_utilization_percent"] == 90
        assert row["gpu_memory_used_bytes"] == 8000 * 2**20
        assert row["gpu_nvlink_crc_errors_total"] == 7
        assert "pod" not in gpu_frame.entities[0]  # two owners: none of them is the GPU's
        owners = {
            e["pod"]: dict(zip(owner_frame.metrics, owner_frame.values[i], strict=True))
            for i, e in enumerate(owner_frame.entities)
        }
        assert owners["ml/train-a"]["gpu_owner_utilization_percent"] == 60
        assert owners["ml/train-b"]["gpu_owner_memory_used_bytes"] == 2000 * 2**20
        assert all(v["gpu_owner_allocated"] == 1 for v in owners.values())
        assert {e["owner"] for e in owner_frame.entities} == {
            "11111111-1111-1111-1111-111111111111",
            "22222222-2222-2222-2222-222222222222",
        }
        assert all(e["namespace"] == "ml" and e["uuid"] == UUID for e in owner_frame.entities)


def test_slurm_hpc_job_copies_are_attribution_not_double_counts() -> None:
    # hpc.go: with a job mapping, each series is copied once per job with hpc_job set, no original
    fields = {"DCGM_FI_DEV_GPU_UTIL": 88, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 4}
    one = gpu_values(page(fields, ',hpc_job="1234"'))
    assert one["gpu_nvlink_crc_errors_total"] == 4
    reading = map_samples(parse_exposition(page(fields, ',hpc_job="1234"')), "n1")
    assert next(iter(reading.gpus.values())).labels["job"] == "1234"
    text = page(fields, ',hpc_job="1234"') + page(fields, ',hpc_job="1240"')
    reading = map_samples(parse_exposition(text), "n1")
    g = next(iter(reading.gpus.values()))
    assert g.values["gpu_nvlink_crc_errors_total"] == 4 and g.values["gpu_utilization_percent"] == 88
    assert "job" not in g.labels and set(g.owners) == {"1234", "1240"}


def test_an_xid_present_at_start_is_reported_once_with_its_pci_address() -> None:
    text = [page({"DCGM_FI_DEV_XID_ERRORS": 79}, ',err_code="79",err_msg="GPU has fallen off the bus"')]
    c = DcgmCollector("n1", fetch=lambda: text[0])
    got = c.collect(1.0).events
    assert [(e.data["code"], e.data["at_start"], e.data["pci"]) for e in got] == [(79, True, "0000:9b:00")]
    assert got[0].data["message"] == "GPU has fallen off the bus"
    assert c.collect(2.0).events == []


def test_a_repeated_xid_code_is_seen_through_the_exporter_count() -> None:
    # xid_collector.go: DCGM_EXP_XID_ERRORS_COUNT{xid="<code>"} counts XIDs in the exporter's window
    text = [page({"DCGM_FI_DEV_XID_ERRORS": 79}) + page({"DCGM_EXP_XID_ERRORS_COUNT": 1}, ',xid="79"')]
    c = DcgmCollector("n1", fetch=lambda: text[0])
    assert [e.data["code"] for e in c.collect(1.0).events] == [79]
    assert c.collect(2.0).events == []
    text[0] = page({"DCGM_FI_DEV_XID_ERRORS": 79}) + page({"DCGM_EXP_XID_ERRORS_COUNT": 3}, ',xid="79"')
    got = c.collect(3.0).events
    assert [e.data["code"] for e in got] == [79, 79] and not any("at_start" in e.data for e in got)


class _Page(QuietHandler):
    body = page(DEFAULT_ENABLED).encode()

    def do_GET(self) -> None:
        self.reply(200, self.body)


@pytest.fixture
def exporter() -> Iterator[str]:
    with loopback_http(_Page) as url:
        yield f"{url}/metrics"


def test_agent_with_collector_dcgm_and_a_url_runs_in_a_fresh_process(exporter: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    argv = [sys.executable, "-m", "gpuscope.cli", "agent", "--collector", "dcgm", "--dcgm-url", exporter]
    proc = subprocess.run(
        [*argv, "--once", "--json", "--node", "n1", "--rate-window", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = orjson.loads(proc.stdout)
    assert out["sources"] == ["dcgm"]
    row = out["entities"][f"node=n1,gpu=5,uuid={UUID}"]
    assert row["gpu_gr_engine_active_ratio"] == pytest.approx(0.93) and row["gpu_power_watts"] == 412.5
