"""InfiniBand/RoCE from a real H100 node's /sys/class/infiniband tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuscope.collect.infiniband import InfinibandCollector
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
