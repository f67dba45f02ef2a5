"""The ingest log's group sync: a lone append syncs on its own thread, every append returns only
once its record is on disk, and rotation, close and a failed sync still work."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuscope.counters import Counters
from gpuscope.store.ingest_log import IngestLog, LogFailed


def _log(directory: Path, **kw: int) -> IngestLog:
    log = IngestLog(directory, Counters(), reserve_bytes=0, **kw)
    list(log.recover(0))
    log.start()
    return log


def _watch_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The real ``fdatasync``, noting which thread ran each one."""
    real: Callable[[int], None] = os.fdatasync
    threads: list[str] = []

    def fdatasync(fd: int) -> None:
        threads.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return threads


def test_a_lone_append_syncs_on_the_appending_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _log(tmp_path / "log")
    threads = _watch_syncs(monkeypatch)
    seen: list[int] = []
    for k in range(3):
        assert log.append(b"record %d" % k, seen.append) == k + 1
        assert log.synced == k + 1  # on disk when append returns
    assert seen == [1, 2, 3]
    # no hand-off to a sync thread and back: the request's own thread ran each sync
    assert threads == [threading.current_thread().name] * 3
    log.close()
    reopened = IngestLog(tmp_path / "log", Counters(), reserve_bytes=0)
    assert [seq for seq, _ in reopened.recover(0)] == [1, 2, 3]


def test_concurrent_appends_each_return_synced_while_segments_rotate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path / "log", segment_bytes=4096)
    threads = _watch_syncs(monkeypatch)
    returned: list[tuple[int, int]] = []
    lock = threading.Lock()

    def sender(k: int) -> None:
        for j in range(40):
            seq = log.append(b"x" * 100 + b"%d-%d" % (k, j), lambda _seq: None)
            with lock:
                returned.append((seq, log.synced))
            if j % 10 == 9:
                log.release(seq)  # segments rotate meanwhile

    workers = [threading.Thread(target=sender, args=(k,)) for k in range(16)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sorted(seq for seq, _ in returned) == list(range(1, 641))
    assert all(synced >= seq for seq, synced in returned)
    assert len(threads) <= 640  # never more syncs than appends
    log.close()
    assert log.synced == 640


def test_records_written_after_a_release_are_kept_across_a_rotation(tmp_path: Path) -> None:
    log = _log(tmp_path / "log", segment_bytes=64)
    for _ in range(5):
        log.append(b"y" * 80, lambda _seq: None)
    log.release(3)
    for _ in range(3):
        log.append(b"z" * 80, lambda _seq: None)
    log.close()
    reopened = IngestLog(tmp_path / "log", Counters(), reserve_bytes=0)
    assert [seq for seq, _ in reopened.recover(3)] == [4, 5, 6, 7, 8]


def test_a_failed_sync_refuses_this_and_every_later_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path / "log")
    log.append(b"kept", lambda _seq: None)

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(LogFailed, match="could not be synced"):
        log.append(b"lost", lambda _seq: None)
    with pytest.raises(LogFailed, match="failed earlier"):
        log.append(b"later", lambda _seq: None)
    assert log.counters.get("store.log_sync_failures") == 1
    monkeypatch.undo()
    log.close()
