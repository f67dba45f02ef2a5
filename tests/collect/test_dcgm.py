"""dcgm-exporter as a source: the real DataDog fixture, DCGM 4 renames, label spellings, XIDs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.collect.dcgm import DcgmCollector, map_samples
from gpuscope.collect.promtext import ExpositionError, parse_exposition

FIXTURE = (Path(__file__).parent / "fixtures" / "dcgm-metrics.txt").read_text()
T4_OLD = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"
T4_NEW = "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"


def values(collector: DcgmCollector, now: float = 1.0) -> dict[str, dict[str, float]]:
    got = collector.collect(now)
    f = got.frames[0]
    return {
        labels.get("uuid", ""): {
            m: float(f.values[i, j]) for j, m in enumerate(f.metrics) if f.values[i, j] == f.values[i, j]
        }
        for i, labels in enumerate(f.entities)
    }


def test_the_fixture_parses_to_the_values_in_the_file() -> None:
    c = DcgmCollector("node-0", fetch=lambda: FIXTURE)
    by_uuid = values(c)
    old = by_uuid[T4_OLD]
    assert old["gpu_sm_clock_mhz"] == 300 and old["gpu_memory_clock_mhz"] == 405
    assert old["gpu_temp_celsius"] == 25 and old["gpu_power_watts"] == pytest.approx(8.969)
    assert old["gpu_energy_joules_total"] == pytest.approx(128996.013)
    assert old["gpu_pcie_replay_total"] == 0 and old["gpu_utilization_percent"] == 0
    assert old["gpu_memory_free_bytes"] == 15109 * 2**20 and old["gpu_memory_used_bytes"] == 0
    new = by_uuid[T4_NEW]
    assert new["gpu_power_limit_watts"] == 70 and new["gpu_memory_total_bytes"] == 15109 * 2**20
    assert new["gpu_memory_reserved_bytes"] == 15109 * 2**20
    assert new["gpu_clock_event_reasons"] == 1 and new["gpu_throttle_sw_power"] == 0
    assert by_uuid["GPU-abc"]["gpu_dram_active_ratio"] == pytest.approx(0.000003)


def test_labels_pods_and_unplaced_samples() -> None:
    reading = map_samples(parse_exposition(FIXTURE), "node-0")
    a10g = next(g for g in reading.gpus.values() if g.labels.get("uuid") == "GPU-abc")
    assert a10g.labels == {
        "node": "node-0",
        "gpu": "0",
        "uuid": "GPU-abc",
        "pod": "ray-llm/ray-1111111",
        "container": "ray-worker",
        "namespace": "ray-llm",
    }
    assert a10g.hostname == "ip-11111"
    assert reading.unplaced == 10  # mapped fields among the fixture's label-less dummy samples
    assert reading.unmapped == 9  # fan, FP pipes, pstate, licence, ...


def test_dcgm4_names_and_lowercase_labels() -> None:
    text = "\n".join(
        [
            'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="1",uuid="GPU-x",hostname="h1"} 96',
            'DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS{gpu="1",uuid="GPU-x",hostname="h1"} 25e8',
            'DCGM_FI_DEV_THERMAL_VIOLATION{gpu="2",UUID="GPU-y",Hostname="h1"} 1500000000',
            'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{gpu="1",uuid="GPU-x",hostname="h1"} 4',
            'DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{gpu="1",uuid="GPU-x",hostname="h1",} 3',
        ]
    )
    reading = map_samples(parse_exposition(text), "n")
    x = reading.gpus[("1", "GPU-x", "")]
    assert x.hostname == "h1"
    assert x.values["gpu_clock_event_reasons"] == 96
    assert x.values["gpu_throttle_sw_thermal"] == x.values["gpu_throttle_hw_thermal"] == 1
    assert x.values["gpu_violation_thermal_seconds_total"] == 2.5
    assert x.values["gpu_nvlink_crc_errors_total"] == 7
    y = reading.gpus[("2", "GPU-y", "")]
    assert y.hostname == "h1" and y.values["gpu_violation_thermal_seconds_total"] == 1.5


def test_a_new_last_xid_becomes_an_event() -> None:
    page = ['DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-z"} 0']
    c = DcgmCollector("n", fetch=lambda: page[0])
    assert c.collect(1.0).events == []
    page[0] = 'DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-z"} 79'
    got = c.collect(2.0)
    assert [(e.kind, e.data["code"], e.labels["gpu"]) for e in got.events] == [("xid", 79, "3")]
    assert c.collect(3.0).events == []


def test_a_broken_page_is_an_error_naming_the_line() -> None:
    c = DcgmCollector("n", url="http://x/metrics", fetch=lambda: 'ok 1\nDCGM_FI_DEV_GPU_UTIL{gpu="0" 5\n')
    got = c.collect(1.0)
    assert got.frames == [] and got.errors[0].kind == "dcgm_format" and "line 2" in got.errors[0].message
    with pytest.raises(ExpositionError, match="line 1"):
        parse_exposition("metric_without_value\n")
