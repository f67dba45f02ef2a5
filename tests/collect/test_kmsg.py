"""Kernel-log XIDs: the real dmesg capture with XID 119, other codes, PCI address to GPU index."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuscope.collect.kmsg import KernelLogCollector, gpu_map, normalise_pci, parse_xid_line

FIXTURES = Path(__file__).parent / "fixtures"
HGX_BUSES = ["18", "2a", "3a", "5d", "9b", "ba", "ca", "db"]


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A /proc/driver/nvidia/gpus tree of an 8-GPU board (as the driver writes it)."""
    root = tmp_path / "proc"
    for i, bus in enumerate(HGX_BUSES):
        d = root / "driver" / "nvidia" / "gpus" / f"0000:{bus}:00.0"
        d.mkdir(parents=True)
        (d / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\n"
            f"GPU UUID: \t GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd\n"
            f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDevice Minor: \t {i}\n"
        )
    return root


def test_the_real_dmesg_capture_gives_five_xid_119_on_gpu_4(proc: Path) -> None:
    c = KernelLogCollector("node-3", proc_root=str(proc), path=str(FIXTURES / "dmesg-with-xid-119.log"))
    got = c.collect(50.0)
    c.close()
    assert [e.data["code"] for e in got.events] == [119] * 5
    first = got.events[0]
    assert first.kind == "xid"
    assert first.labels == {"node": "node-3", "gpu": "4", "uuid": "GPU-00000004-aaaa-bbbb-cccc-dddddddddddd"}
    assert first.data["pci"] == "0000:9b:00" and first.data["pid"] == "2024380"
    assert first.data["process"] == "nvidia-smi"
    assert first.data["message"].startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP!")
    assert {e.data["process"] for e in got.events} == {"nvidia-smi", "cache_mgr_main", "gpud"}
    assert got.errors == []


@pytest.mark.parametrize(
    ("line", "code", "pci", "message"),
    [
        (
            "[ 1234.567890] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, "
            "GPU has fallen off the bus.",
            79,
            "0000:18:00",
            "GPU has fallen off the bus.",
        ),
        (
            "3,1201,93481234,-;NVRM: Xid (PCI:0000:2a:00): 48, pid='<unknown>', name=<unknown>, "
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
            "partition 6, subpartition 0.",
            48,
            "0000:2a:00",
            "An uncorrectable double bit error (DBE)",
        ),
        (
            "[Mon Mar  3 10:00:00 2025] NVRM: Xid (PCI:0000:DB:00): 13, pid=99, name=train.py, "
            "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Illegal Instruction Encoding",
            13,
            "0000:db:00",
            "Graphics SM Warp Exception",
        ),
        ("NVRM: Xid (PCI:0000:5d:00): 94, Contained ECC error.", 94, "0000:5d:00", "Contained ECC error."),
    ],
)
def test_driver_line_formats(line: str, code: int, pci: str, message: str) -> None:
    xid = parse_xid_line(line)
    assert xid is not None
    assert (xid.code, xid.pci) == (code, pci) and xid.message.startswith(message)


def test_lines_without_an_xid_are_ignored() -> None:
    text = (FIXTURES / "kmsg.1.log").read_text()
    assert [parse_xid_line(line) for line in text.splitlines()] == [None] * len(text.splitlines())
    assert parse_xid_line("NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d") is None


def test_pci_addresses_normalise_and_map_in_bus_order(proc: Path) -> None:
    assert normalise_pci("00000000:9B:00.0") == "0000:9b:00" == normalise_pci("0000:9b:00")
    with pytest.raises(ValueError, match="not a PCI address"):
        normalise_pci("9b:00")
    assert gpu_map(str(proc))["0000:db:00"] == (7, "GPU-00000007-aaaa-bbbb-cccc-dddddddddddd")
    assert gpu_map(str(proc / "nowhere")) == {}


def test_a_growing_log_is_read_incrementally_and_unknown_gpus_are_reported(
    proc: Path, tmp_path: Path
) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    c = KernelLogCollector("n", proc_root=str(proc), path=str(log))
    assert c.collect(1.0).events == []
    with open(log, "a") as fh:
        fh.write("[ 10.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.\n")
        fh.write("[ 11.0] NVRM: Xid (PCI:0000:ee:00): 120, pid=1, name=x, GSP err")  # line not yet complete
    got = c.collect(2.0)
    assert [(e.data["code"], e.labels["gpu"]) for e in got.events] == [(79, "0")]
    with open(log, "a") as fh:
        fh.write("or\n")
    got = c.collect(3.0)
    assert [e.data["code"] for e in got.events] == [120] and "gpu" not in got.events[0].labels
    assert [e.kind for e in got.errors] == ["kmsg_unknown_gpu"]
    c.close()


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg is not readable here")
def test_dev_kmsg_opens_at_its_end_without_blocking(proc: Path) -> None:
    c = KernelLogCollector("n", proc_root=str(proc))
    got = c.collect(1.0)  # history before the agent started is not replayed
    assert got.events == []
    c.close()
