from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpuscope.store.remote.local import PORTS_FROM, ephemeral_low, free_port


def test_ephemeral_range_is_read_from_proc_or_defaults(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_low(ranges) == 40_000
    assert ephemeral_low(tmp_path / "missing") == 32_768
    ranges.write_text("garbage")
    assert ephemeral_low(ranges) == 32_768


def test_ports_are_drawn_below_the_source_ports_of_outgoing_connections() -> None:
    low = ephemeral_low()
    ports = {free_port() for _ in range(50)}
    assert all(PORTS_FROM <= p < low for p in ports)
    assert len(ports) > 40  # drawn at random: parallel workers rarely draw the same
    port = ports.pop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free when told


def test_a_taken_range_is_an_error_naming_it() -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", PORTS_FROM))
        except OSError:
            pytest.skip(f"port {PORTS_FROM} is in use here")
        s.listen()
        with pytest.raises(RuntimeError, match=f"between {PORTS_FROM} and {PORTS_FROM + 1}"):
            free_port(limit=PORTS_FROM + 1)
