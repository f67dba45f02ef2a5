"""Reading an ingest worker's log behind it: only what is synced, in order, each record once,
across its segments, past a torn record the owner has not cut off yet."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuscope.counters import Counters
from gpuscope.store import log_tail
from gpuscope.store.ingest_log import IngestLog
from gpuscope.store.log_tail import LogTail


def _nothing(seq: int) -> None:
    pass


def test_the_reader_takes_synced_records_once_in_order_across_segments(tmp_path: Path) -> None:
    log = IngestLog(tmp_path, Counters(), segment_bytes=64, reserve_bytes=0)
    list(log.recover(0))
    log.start()
    tail = LogTail(tmp_path, 0)
    for k in range(1, 4):
        log.append(f"record {k}".encode(), _nothing)
    log.write(b"written, not synced", _nothing)
    # the fourth record may be torn or renumbered by the owner's next run: not taken before its sync
    assert tail.read(synced=3) == [(1, b"record 1"), (2, b"record 2"), (3, b"record 3")]
    assert tail.read(synced=3) == []
    log.release(3)  # the store holds 1-3: the owner syncs the rest and opens a fresh segment
    deadline = time.monotonic() + 10
    while log.segments() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.segments() == 2
    log.append(b"record 5", _nothing)  # in the fresh segment
    assert tail.read(synced=log.synced) == [(4, b"written, not synced"), (5, b"record 5")]
    log.close()


def test_a_reader_resumes_after_the_stored_position_and_skips_a_torn_tail(tmp_path: Path) -> None:
    log = IngestLog(tmp_path, Counters(), reserve_bytes=0)
    list(log.recover(0))
    log.start()
    for k in range(1, 6):
        log.append(f"record {k}".encode(), _nothing)
    log.close()
    segment = sorted(tmp_path.glob("*.seg"))[-1]
    with open(segment, "ab") as f:
        f.write(b"\x05\x00\x00\x00torn")  # a crash in the middle of a write
    tail = LogTail(tmp_path, 3)  # the store holds 1-3
    assert tail.read(synced=5) == [(4, b"record 4"), (5, b"record 5")]
    assert tail.read(synced=6) == []  # the torn record is never handed out


def test_a_reader_takes_every_record_through_reads_smaller_than_the_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a segment is read a chunk at a time: records cut by a chunk's end, and a record larger
    # than a chunk, come whole, in order, each once; a resumed reader skips what the store holds
    monkeypatch.setattr(log_tail, "CHUNK", 100)
    log = IngestLog(tmp_path, Counters(), reserve_bytes=0)
    list(log.recover(0))
    log.start()
    payloads = [bytes([k]) * (7 * k if k != 5 else 450) for k in range(1, 13)]
    for p in payloads:
        log.append(p, _nothing)
    tail = LogTail(tmp_path, 0)
    assert tail.read(synced=12, limit=5) == list(enumerate(payloads[:5], start=1))
    assert tail.read(synced=12) == list(enumerate(payloads[5:], start=6))
    assert tail.read(synced=12) == []
    resumed = LogTail(tmp_path, 9)  # the store holds 1-9: what it skips spans several chunks
    assert resumed.read(synced=12) == list(enumerate(payloads[9:], start=10))
    for p in (b"late 13", b"late 14"):  # the open segment grows behind the readers
        log.append(p, _nothing)
    assert tail.read(synced=14) == [(13, b"late 13"), (14, b"late 14")]
    assert resumed.read(synced=13) == [(13, b"late 13")]
    tail.close()
    resumed.close()
    log.close()
