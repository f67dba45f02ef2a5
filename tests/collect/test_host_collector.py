"""The host collector on a fixture procfs tree: values, rates between rounds, isolated failures."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import psutil
import pytest

from gpuscope.collect.base import CollectorSet
from gpuscope.collect.host import HostCollector
from gpuscope.counters import Counters
from gpuscope.model import Frame
from gpuscope.signals import NODE_METRICS

FIXTURE = Path(__file__).parent / "fixtures" / "proc"


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    shutil.copytree(FIXTURE, root)
    return root


def values(frame: Frame) -> dict[str, float]:
    assert frame.entities == [{"node": "node-7"}]
    return {m: float(frame.values[0, j]) for j, m in enumerate(frame.metrics)}


def bump(path: Path, old: str, new: str) -> None:
    content = path.read_text()
    assert old in content
    path.write_text(content.replace(old, new, 1))


def test_first_round_reports_gauges_and_counters_but_no_rates(proc: Path) -> None:
    host = HostCollector("node-7", proc_root=str(proc), disk_path=str(proc))
    got = host.collect(100.0)
    assert got.errors == []
    (frame,) = got.frames
    v = values(frame)
    assert frame.ts == 100.0
    assert set(v) <= set(NODE_METRICS)
    assert v["node_tcp_out_segs_total"] == 594855
    assert v["node_tcp_retrans_segs_total"] == 348
    assert v["node_load1"] == 0.05
    assert v["node_memory_total_bytes"] == 24684100 * 1024
    assert 0.0 < v["node_disk_used_ratio"] < 1.0
    assert "node_cpu_percent" not in v
    assert "node_net_rx_bytes_per_second" not in v


def test_second_round_rates_from_counter_deltas(proc: Path) -> None:
    host = HostCollector("node-7", proc_root=str(proc), disk_path=str(proc))
    host.collect(100.0)
    # two seconds later: eth0 +2,000 B in / +1,000 B out; lo moves too but is left out;
    # CPU: +30 user, +70 idle ticks -> 30 % busy
    bump(proc / "net/dev", "eth0: 155114947", "eth0: 155116947")
    bump(proc / "net/dev", "237090", "238090")
    bump(proc / "net/dev", "lo:    3193", "lo:    9193")
    cpu = (proc / "stat").read_text().splitlines()[0]
    ticks = [int(x) for x in cpu.split()[1:]]
    ticks[0] += 30
    ticks[3] += 70
    bump(proc / "stat", cpu, "cpu  " + " ".join(map(str, ticks)))
    bump(proc / "net/snmp", "594855 348", "594955 358")
    v = values(host.collect(102.0).frames[0])
    assert v["node_net_rx_bytes_per_second"] == pytest.approx(1000.0)
    assert v["node_net_tx_bytes_per_second"] == pytest.approx(500.0)
    assert v["node_cpu_percent"] == pytest.approx(30.0)
    assert v["node_tcp_out_segs_total"] == 594955
    assert v["node_tcp_retrans_segs_total"] == 358


def test_counter_reset_gives_no_rate_for_that_interface(proc: Path) -> None:
    host = HostCollector("node-7", proc_root=str(proc), disk_path=str(proc))
    host.collect(0.0)
    bump(proc / "net/dev", "eth0: 155114947", "eth0: 5")  # driver reload
    v = values(host.collect(1.0).frames[0])
    # ifb0/ifb1 stayed at 0, so a rate exists and leaves the reset interface out
    assert v["node_net_rx_bytes_per_second"] == 0.0


def test_broken_snmp_is_counted_and_the_rest_still_reported(
    proc: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (proc / "net/snmp").write_text(
        "\n".join(
            line for line in (FIXTURE / "net/snmp").read_text().splitlines() if not line.startswith("Tcp")
        )
    )
    counters = Counters()
    cs = CollectorSet([HostCollector("node-7", proc_root=str(proc), disk_path=str(proc))], counters)
    for t in range(3):
        got = cs.collect(float(t))
        v = values(got.frames[0])
        assert "node_tcp_out_segs_total" not in v
        assert v["node_load1"] == 0.05
        (err,) = got.errors
        assert (err.collector, err.kind) == ("host", "snmp")
        assert "net/snmp: has no Tcp lines" in err.message
    assert counters.get("collector_errors") == 3
    assert counters.get("collector_errors.host.snmp") == 3
    assert sum("has no Tcp lines" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_missing_files_in_a_custom_root_are_errors_not_the_real_host(tmp_path: Path) -> None:
    got = HostCollector("node-7", proc_root=str(tmp_path), disk_path=str(tmp_path)).collect(0.0)
    assert {e.kind for e in got.errors} == {"stat", "loadavg", "meminfo", "net_dev", "snmp"}
    assert all(str(tmp_path) in e.message for e in got.errors)
    (frame,) = got.frames  # only the disk could be read
    assert frame.metrics == ["node_disk_used_ratio"]


def test_psutil_readings_stand_in_for_procfs() -> None:
    host = HostCollector("node-7", use_psutil=True)
    host.collect(0.0)
    # CPU times advance in clock ticks; a quiet CI container may not tick in a short sleep, so spin
    # until one has passed (bounded) rather than hoping a fixed sleep is enough.
    deadline = time.monotonic() + 5.0
    start = sum(psutil.cpu_times())
    while sum(psutil.cpu_times()) == start and time.monotonic() < deadline:
        sum(i * i for i in range(10_000))
    got = host.collect(1.0)
    assert got.errors == []
    v = values(got.frames[0])
    assert v["node_memory_total_bytes"] > v["node_memory_used_bytes"] > 0
    assert 0.0 <= v["node_cpu_percent"] <= 100.0
    assert v["node_net_rx_bytes_per_second"] >= 0.0
