"""The on-disk spool: order, replay after restart, bounds, torn and damaged records, disk errors."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from gpuscope.agent.spool import HEADER, Spool, SpoolError, frame_record
from gpuscope.counters import Counters


def drain(spool: Spool) -> list[bytes]:
    out = []
    while (rec := spool.peek()) is not None:
        out.append(rec)
        spool.ack()
    return out


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def rec(i: int, size: int = 20) -> bytes:
    return f"batch-{i:04d}-".encode().ljust(size, b"x")


def test_fifo_order_and_peek_is_idempotent(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync=False)
    assert spool.peek() is None
    for i in range(5):
        assert spool.append(rec(i))
    assert len(spool) == 5
    assert spool.pending_bytes == 100
    assert spool.peek() == spool.peek() == rec(0)
    assert drain(spool) == [rec(i) for i in range(5)]
    assert len(spool) == 0 and spool.pending_bytes == 0
    spool.close()


def test_restart_replays_only_what_was_not_acknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for i in range(6):
        spool.append(rec(i))
    spool.peek()
    spool.ack()
    spool.peek()
    spool.ack()
    spool.close()  # as if the agent stopped here

    again = Spool(tmp_path)
    assert len(again) == 4
    again.append(rec(6))  # new records go behind the replayed ones
    assert drain(again) == [rec(i) for i in range(2, 7)]
    again.close()

    third = Spool(tmp_path)
    assert len(third) == 0 and third.peek() is None  # nothing acknowledged is ever replayed
    assert segments(tmp_path) == []  # consumed segments are deleted
    third.close()


def test_empty_spool_keeps_no_consumed_bytes_on_disk(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync=False)
    for i in range(3):
        spool.append(rec(i))
    assert spool.disk_bytes == 3 * (HEADER.size + 20)
    drain(spool)
    assert spool.disk_bytes == 0 and segments(tmp_path) == []
    spool.append(rec(9))
    assert drain(spool) == [rec(9)]
    spool.close()


def test_full_spool_drops_oldest_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    counters = Counters()
    record_size = HEADER.size + 20
    # 10 records per segment, at most 40 on disk
    spool = Spool(
        tmp_path, max_bytes=40 * record_size, segment_bytes=10 * record_size, counters=counters, fsync=False
    )
    for i in range(100):
        assert spool.append(rec(i))
        assert spool.disk_bytes <= spool.max_bytes
    kept = drain(spool)
    assert kept == [rec(i) for i in range(100 - len(kept), 100)]  # the newest, in order
    assert 30 <= len(kept) <= 40
    assert counters.get("spool_dropped_batches") == 100 - len(kept)
    assert counters.get("spool_dropped_bytes") == 20 * (100 - len(kept))
    assert sum("spool: full" in r.getMessage() for r in caplog.records) == 1  # once, then counted
    spool.close()


def test_record_larger_than_the_spool_is_refused_and_counted(tmp_path: Path) -> None:
    counters = Counters()
    spool = Spool(tmp_path, max_bytes=1000, counters=counters, fsync=False)
    assert not spool.append(b"x" * 2000)
    assert counters.get("spool_dropped_batches") == 1
    assert counters.get("spool_dropped_bytes") == 2000
    assert spool.append(rec(1))
    assert drain(spool) == [rec(1)]
    spool.close()


def test_torn_tail_from_a_crash_mid_write_is_detected_counted_and_skipped(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for i in range(3):
        spool.append(rec(i))
    spool.close()
    (seg,) = segments(tmp_path)
    with open(seg, "ab") as fh:  # the crash: header and half of a payload reached the disk
        fh.write(frame_record(rec(3))[: HEADER.size + 7])

    counters = Counters()
    again = Spool(tmp_path, counters=counters)
    assert counters.get("spool_corrupt_records") == 1
    assert counters.get("spool_corrupt_bytes") == HEADER.size + 7
    again.append(rec(4))  # goes to a fresh segment, never behind the torn bytes
    assert drain(again) == [rec(0), rec(1), rec(2), rec(4)]
    again.close()


def test_damage_inside_a_segment_skips_to_the_next_valid_record(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync=False)
    for i in range(4):
        spool.append(rec(i))
    spool.close()
    (seg,) = segments(tmp_path)
    data = bytearray(seg.read_bytes())
    data[HEADER.size + 25] ^= 0xFF  # a flipped bit in the payload of record 1
    seg.write_bytes(bytes(data))

    counters = Counters()
    again = Spool(tmp_path, counters=counters, fsync=False)
    assert drain(again) == [rec(0), rec(2), rec(3)]
    assert counters.get("spool_corrupt_records") == 1
    assert counters.get("spool_corrupt_bytes") == HEADER.size + 20
    again.close()


def test_damage_after_writing_is_caught_by_the_crc_on_read(tmp_path: Path) -> None:
    counters = Counters()
    spool = Spool(tmp_path, counters=counters, fsync=False)
    for i in range(3):
        spool.append(rec(i))
    (seg,) = segments(tmp_path)
    with open(seg, "r+b") as fh:
        fh.seek(HEADER.size + 3)
        fh.write(b"?")
    assert drain(spool) == [rec(1), rec(2)]
    assert counters.get("spool_corrupt_records") == 1
    spool.close()


def test_disk_full_is_counted_and_the_spool_keeps_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counters = Counters()
    spool = Spool(tmp_path, counters=counters)
    spool.append(rec(0))
    real_fsync = os.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert not spool.append(rec(1))
    assert counters.get("spool_write_errors") == 1
    assert counters.get("spool_dropped_batches") == 1
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert spool.append(rec(2))
    assert drain(spool) == [rec(0), rec(2)]  # the failed write left nothing half-written behind
    spool.close()


def test_unwritable_device_behaves_like_a_full_disk(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("/dev/full is a Linux device")
    counters = Counters()
    spool = Spool(tmp_path, counters=counters, fsync=False)
    (tmp_path / f"{0:020d}.seg").symlink_to("/dev/full")  # the first segment it will write: ENOSPC
    assert not spool.append(rec(1))
    assert counters.get("spool_write_errors") == 1
    assert counters.get("spool_dropped_batches") == 1
    assert spool.append(rec(2))  # moved on to a new segment
    assert drain(spool) == [rec(2)]
    assert segments(tmp_path) == []
    spool.close()


def test_corrupt_cursor_replays_everything_rather_than_lose_data(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync=False)
    for i in range(3):
        spool.append(rec(i))
    spool.peek()
    spool.ack()
    spool.close()
    (tmp_path / "cursor").write_text("{not json")
    counters = Counters()
    again = Spool(tmp_path, counters=counters, fsync=False)
    assert counters.get("spool_cursor_errors") == 1
    assert drain(again) == [rec(0), rec(1), rec(2)]
    again.close()
    assert json.loads((tmp_path / "cursor").read_text())["offset"] == 0


def test_two_agents_cannot_share_a_spool(tmp_path: Path) -> None:
    spool = Spool(tmp_path, fsync=False)
    with pytest.raises(SpoolError, match="is in use by another agent"):
        Spool(tmp_path, fsync=False)
    spool.close()
    Spool(tmp_path, fsync=False).close()


def test_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SpoolError, match="cannot be used"):
        Spool(blocker / "spool")


def test_an_unreadable_segment_is_given_up_whole_and_counted(tmp_path: Path) -> None:
    counters = Counters()
    spool = Spool(tmp_path, counters=counters, fsync=False)
    for i in range(5):
        spool.append(rec(i))
    (seg,) = segments(tmp_path)
    seg.unlink()  # e.g. removed by hand, or lost to a disk error
    assert spool.peek() is None
    assert counters.get("spool_read_errors") == 1
    assert counters.get("spool_dropped_batches") == 5
    assert spool.append(rec(5))  # goes on with a new file, not into the deleted one
    spool.close()
    again = Spool(tmp_path, counters=counters, fsync=False)
    assert drain(again) == [rec(5)]
    again.close()
