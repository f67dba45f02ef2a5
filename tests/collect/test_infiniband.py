"""InfiniBand/RoCE from a real H100 node's /sys/class/infiniband tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuscope.collect.infiniband import COUNTERS, HW_COUNTERS, InfinibandCollector
from gpuscope.model import Frame

FIXTURE = Path(__file__).parent / "fixtures" / "sys"


def rows(frames: list[Frame]) -> dict[str, dict[str, float]]:
    out = {}
    for f in frames:
        for i, labels in enumerate(f.entities):
            key = f"{labels.get('device', 'node')}/{labels.get('port', '')}"
            out[key] = {
                m: float(f.values[i, j]) for j, m in enumerate(f.metrics) if f.values[i, j] == f.values[i, j]
            }
    return out


def test_the_h100_tree_parses_to_the_values_in_its_files() -> None:
    got = InfinibandCollector("gpu-node", sys_root=str(FIXTURE)).collect(1.0)
    assert got.errors == []
    r = rows(got.frames)
    p = r["mlx5_0/1"]
    assert p["ib_port_up"] == 1 and p["ib_port_rate_gbps"] == 400
    assert p["ib_port_rx_bytes_total"] == 230539874932483 * 4  # 4-byte words
    assert p["ib_port_tx_bytes_total"] == 230442669431839 * 4
    assert p["ib_port_rcv_errors_total"] == 14 and p["ib_port_symbol_errors_total"] == 0
    assert p["ib_port_link_downed_total"] == 0 and p["ib_port_xmit_wait_total"] == 2489603687
    assert r["mlx5_1/1"]["ib_port_link_downed_total"] == 255
    assert r["mlx5_bond_0/1"]["ib_port_rate_gbps"] == 200
    for name in ("ib_port_out_of_sequence_total", "ib_port_local_ack_timeout_errors_total"):
        assert name in p
    node = r["node/"]
    assert node["node_ib_ports_down"] == 0
    assert node["node_ib_rcv_errors_total"] == 42 and node["node_ib_link_downed_total"] == 255
    assert "node_ib_rx_bytes_per_second" not in node  # a rate needs two rounds


def test_rates_down_ports_and_broken_files(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE, root)
    c = InfinibandCollector("n", sys_root=str(root))
    c.collect(10.0)
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters" / "port_rcv_data").write_text(str(230539874932483 + 250_000_000))
    (port / "state").write_text("1: DOWN\n")
    (port / "counters" / "symbol_error").write_text("garbage\n")
    got = c.collect(12.0)
    r = rows(got.frames)
    assert r["mlx5_0/1"]["ib_port_rx_bytes_per_second"] == pytest.approx(500_000_000)
    assert r["node/"]["node_ib_rx_bytes_per_second"] == pytest.approx(500_000_000)
    assert r["mlx5_0/1"]["ib_port_up"] == 0 and r["node/"]["node_ib_ports_down"] == 1
    assert "ib_port_symbol_errors_total" not in r["mlx5_0/1"]
    assert [e.kind for e in got.errors] == ["ib_format"] and "symbol_error" in got.errors[0].message


def test_a_node_without_infiniband_reports_nothing(tmp_path: Path) -> None:
    got = InfinibandCollector("n", sys_root=str(tmp_path)).collect(1.0)
    assert got.frames == [] and got.errors == []


def test_link_integrity_remote_physical_and_buffer_overrun_from_the_real_tree() -> None:
    # names: torvalds/linux drivers/infiniband/core/sysfs.c PORT_PMA_ATTR list (e04360a)
    r = rows(InfinibandCollector("gpu-node", sys_root=str(FIXTURE)).collect(1.0).frames)
    port = FIXTURE / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    p = r["mlx5_0/1"]
    for name, metric in (
        ("excessive_buffer_overrun_errors", "ib_port_excessive_buffer_overrun_errors_total"),
        ("local_link_integrity_errors", "ib_port_local_link_integrity_errors_total"),
        ("port_rcv_remote_physical_errors", "ib_port_rcv_remote_physical_errors_total"),
        ("port_rcv_switch_relay_errors", "ib_port_rcv_switch_relay_errors_total"),
        ("VL15_dropped", "ib_port_vl15_dropped_total"),
        ("port_xmit_packets", "ib_port_tx_packets_total"),
    ):
        assert p[metric] == int((port / name).read_text())
    assert p["ib_port_excessive_buffer_overrun_errors_total"] == 15


def test_every_counter_file_of_the_real_tree_is_read() -> None:
    port = FIXTURE / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    unread_pma = {f.name for f in (port / "counters").iterdir()} - set(COUNTERS)
    unread_hw = {f.name for f in (port / "hw_counters").iterdir()} - set(HW_COUNTERS)
    # per-kind packet counts and a counter of the counters themselves
    assert unread_pma == {
        "unicast_rcv_packets",
        "unicast_xmit_packets",
        "multicast_rcv_packets",
        "multicast_xmit_packets",
    }
    # the counters' refresh period and RDMA request activity, not faults
    assert unread_hw == {
        "lifespan",
        "rx_read_requests",
        "rx_write_requests",
        "rx_atomic_requests",
        "rx_dct_connect",
    }


def test_roce_congestion_and_transport_retries(tmp_path: Path) -> None:
    # mlx5 cong_cnts and extended_err_cnts (drivers/infiniband/hw/mlx5/counters.c) live beside the
    # q counters in hw_counters/ of a RoCE port
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE, root)
    hw = root / "class" / "infiniband" / "mlx5_bond_0" / "ports" / "1" / "hw_counters"
    counts = {
        "np_cnp_sent": 1200,
        "rp_cnp_handled": 3400,
        "rp_cnp_ignored": 0,
        "np_ecn_marked_roce_packets": 1250,
        "req_transport_retries_exceeded": 2,
        "req_rnr_retries_exceeded": 1,
    }
    for name, v in counts.items():
        (hw / name).write_text(f"{v}\n")
    p = rows(InfinibandCollector("n", sys_root=str(root)).collect(1.0).frames)["mlx5_bond_0/1"]
    assert p["ib_port_cnp_sent_total"] == 1200 and p["ib_port_cnp_handled_total"] == 3400
    assert p["ib_port_cnp_ignored_total"] == 0 and p["ib_port_ecn_marked_packets_total"] == 1250
    assert p["ib_port_transport_retries_exceeded_total"] == 2 and p["ib_port_rnr_retries_exceeded_total"] == 1
