"""The procfs parsers on real captured files and on broken variants of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.collect.procfs import (
    ProcFormatError,
    parse_loadavg,
    parse_meminfo,
    parse_net_dev,
    parse_snmp,
    parse_stat_cpu,
    tcp_segments,
)

PROC = Path(__file__).parent / "fixtures" / "proc"


def text(rel: str) -> str:
    return (PROC / rel).read_text()


def test_snmp_real_fixture_every_protocol_and_tcp_counters() -> None:
    snmp = parse_snmp(text("net/snmp"))
    assert list(snmp) == ["Ip", "Icmp", "IcmpMsg", "Tcp", "Udp", "UdpLite"]
    assert snmp["Tcp"]["OutSegs"] == 594855
    assert snmp["Tcp"]["RetransSegs"] == 348
    assert snmp["Tcp"]["MaxConn"] == -1  # negative values are part of the real format
    assert snmp["IcmpMsg"] == {"InType3": 45, "OutType3": 50}
    assert len(snmp["Icmp"]) == 27
    assert tcp_segments(snmp) == (594855, 348)


def test_snmp_without_tcp_lines_is_a_clear_error() -> None:
    lines = [line for line in text("net/snmp").splitlines() if not line.startswith("Tcp:")]
    snmp = parse_snmp("\n".join(lines))
    with pytest.raises(ProcFormatError, match="net/snmp: has no Tcp lines"):
        tcp_segments(snmp)


def test_snmp_mismatched_columns_names_the_line_and_counts() -> None:
    broken = text("net/snmp").replace("1038 0\n", "1038\n")  # Tcp value line one short
    with pytest.raises(ProcFormatError, match=r"line 8: Tcp has 15 field names but 14 values"):
        parse_snmp(broken, "/x/net/snmp")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("Tcp: InSegs OutSegs\n", "header of Tcp has no value line"),
        ("Tcp: InSegs OutSegs\nUdp: 1 2\n", "line 2: expected the values of Tcp"),
        ("Tcp: InSegs OutSegs\nTcp: 1 lots\n", "Tcp.OutSegs: 'lots' is not an integer"),
        ("garbage without colon\n", "line 1: expected '<Protocol>: <field names>'"),
        ("Tcp: A\nTcp: 1\nTcp: A\nTcp: 2\n", "protocol Tcp appears twice"),
        ("Tcp: InSegs RetransSegs\nTcp: 1 2\n", "Tcp lines lack OutSegs"),
    ],
)
def test_snmp_broken_variants(body: str, message: str) -> None:
    with pytest.raises(ProcFormatError, match=message):
        tcp_segments(parse_snmp(body))


def test_stat_cpu_busy_and_total_from_the_aggregate_line() -> None:
    cpu = parse_stat_cpu(text("stat"))
    fields = [int(v) for v in text("stat").splitlines()[0].split()[1:9]]
    assert cpu.total == sum(fields)
    assert cpu.busy == sum(fields) - fields[3] - fields[4]
    with pytest.raises(ProcFormatError, match="no aggregate 'cpu' line"):
        parse_stat_cpu("cpu0 1 2 3 4\n")
    with pytest.raises(ProcFormatError, match="cpu line has 3 fields"):
        parse_stat_cpu("cpu 1 2 3\n")


def test_meminfo_used_is_total_minus_available() -> None:
    used, total = parse_meminfo(text("meminfo"))
    assert total == 24684100 * 1024
    assert used == (24684100 - 24409628) * 1024
    old_kernel = "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 250 kB\n"
    assert parse_meminfo(old_kernel) == (600 * 1024, 1000 * 1024)
    with pytest.raises(ProcFormatError, match="no MemTotal"):
        parse_meminfo("MemFree: 1 kB\n")


def test_loadavg_and_net_dev() -> None:
    assert parse_loadavg(text("loadavg")) == 0.05
    with pytest.raises(ProcFormatError, match="is empty"):
        parse_loadavg("")
    dev = parse_net_dev(text("net/dev"))
    assert dev["eth0"] == (155114947, 237090)
    assert dev["lo"] == (3193, 3193)
    assert set(dev) == {"lo", "ifb0", "ifb1", "eth0"}
    with pytest.raises(ProcFormatError, match="lacks the two header lines"):
        parse_net_dev("eth0: 1 2 3\n")
    with pytest.raises(ProcFormatError, match=r"line 3: expected '<iface>: <16 counters>'"):
        parse_net_dev("\n".join([*text("net/dev").splitlines()[:2], "eth0: 1 2 3"]))
