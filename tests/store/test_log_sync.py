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


def _log(directory: Path, **kw: float) -> IngestLog:
    log = IngestLog(directory, Counters(), reserve_bytes=0, **kw)  # type: ignore[arg-type]
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


def test_a_record_written_without_waiting_is_reported_once_synced_by_the_logs_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path / "log")
    threads = _watch_syncs(monkeypatch)
    reported: list[tuple[int, OSError | None, int, str]] = []
    done = threading.Event()
    seqs = [log.write(b"record %d" % k, lambda _seq: None) for k in range(3)]
    assert seqs == [1, 2, 3]
    for seq in seqs:

        def report(error: OSError | None, seq: int = seq) -> None:
            reported.append((seq, error, log.synced, threading.current_thread().name))
            if len(reported) == len(seqs):
                done.set()

        log.when_synced(seq, report)
    assert done.wait(10)
    # each writer hears only once its record is on disk, from the thread that synced it
    assert [(seq, error) for seq, error, _, _ in reported] == [(1, None), (2, None), (3, None)]
    assert all(synced >= seq for seq, _, synced, _ in reported)
    assert {name for *_, name in reported} <= {"gpuscope-log-sync"} and threads[0] == "gpuscope-log-sync"
    # a record already synced is reported at once, on the caller's thread
    at_once: list[OSError | None] = []
    log.when_synced(3, at_once.append)
    assert at_once == [None]
    log.close()
    reopened = IngestLog(tmp_path / "log", Counters(), reserve_bytes=0)
    assert [seq for seq, _ in reopened.recover(0)] == [1, 2, 3]


def test_a_failed_sync_is_reported_to_every_writer_waiting_and_refuses_later_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path / "log")

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    errors: list[OSError | None] = []
    done = threading.Event()
    for k in range(2):
        seq = log.write(b"lost %d" % k, lambda _seq: None)
        log.when_synced(seq, lambda error: (errors.append(error), len(errors) == 2 and done.set()))
    assert done.wait(10)
    assert all(isinstance(e, LogFailed) and "could not be synced" in str(e) for e in errors)
    with pytest.raises(LogFailed, match="failed earlier"):
        log.write(b"later", lambda _seq: None)
    monkeypatch.undo()
    log.close()


def test_a_callback_that_raises_is_counted_and_later_records_still_sync(tmp_path: Path) -> None:
    log = _log(tmp_path / "log")

    def broken(error: OSError | None) -> None:
        raise RuntimeError("the writer's loop is gone")

    log.when_synced(log.write(b"first", lambda _seq: None), broken)
    heard = threading.Event()
    log.when_synced(log.write(b"second", lambda _seq: None), lambda error: heard.set())
    assert heard.wait(10)
    assert log.append(b"third", lambda _seq: None) == 3
    assert log.counters.get("store.log_callback_errors") == 1
    log.close()


def test_records_written_within_the_sync_window_share_one_sync_and_are_reported_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path / "log", sync_window_s=60.0)
    threads = _watch_syncs(monkeypatch)
    reported: list[tuple[int, OSError | None, int]] = []
    first, rest = threading.Event(), threading.Event()

    def report(seq: int) -> Callable[[OSError | None], None]:
        def heard(error: OSError | None) -> None:
            reported.append((seq, error, log.synced))
            if seq == 1:
                first.set()
            elif len(reported) == 4:
                rest.set()

        return heard

    # a lone record after a quiet window is synced at once
    log.when_synced(log.write(b"lone", lambda _seq: None), report(1))
    assert first.wait(10) and len(threads) == 1
    # the next ones wait for the window to end (here: the close), then share one sync
    for k in range(3):
        seq = log.write(b"record %d" % k, lambda _seq: None)
        log.when_synced(seq, report(seq))
    assert not rest.wait(0.5)
    assert [seq for seq, _, _ in reported] == [1] and len(threads) == 1
    log.close()
    assert rest.is_set()
    assert [(seq, error) for seq, error, _ in reported] == [(1, None), (2, None), (3, None), (4, None)]
    assert all(synced >= seq for seq, _, synced in reported)  # each heard only once on disk
    assert len(threads) == 2  # one sync for the lone record, one for the three in the window
    assert log.counters.get("store.log_syncs") == 2
    reopened = IngestLog(tmp_path / "log", Counters(), reserve_bytes=0)
    assert [seq for seq, _ in reopened.recover(0)] == [1, 2, 3, 4]


def _one_at_a_time(log: IngestLog, n: int) -> None:
    """One writer: each record written once the last was reported synced (a spool's replay)."""
    for k in range(n):
        heard = threading.Event()
        log.when_synced(log.write(b"batch %d" % k, lambda _seq: None), lambda _e, h=heard: h.set())
        assert heard.wait(10)


def test_one_writer_at_a_time_is_not_held_to_a_batch_a_window(tmp_path: Path) -> None:
    log = _log(tmp_path / "log", sync_window_s=0.2, sync_probe_s=60.0)
    _one_at_a_time(log, 10)
    # the first record synced at once, the second waited out one window that held it alone, and
    # the other eight synced at once
    assert log.counters.get("store.log_windows") == 1
    assert log.counters.get("store.log_windows_ungrouped") == 1
    assert log.counters.get("store.log_syncs") == 10
    log.close()


def test_a_window_that_grouped_is_kept_through_a_lone_record_or_two(tmp_path: Path) -> None:
    log = _log(tmp_path / "log", sync_window_s=0.2, sync_probe_s=60.0)
    _one_at_a_time(log, 1)
    done = threading.Event()
    seqs = [log.write(b"together %d" % k, lambda _seq: None) for k in range(3)]
    for seq in seqs:
        log.when_synced(seq, lambda error, last=seq == seqs[-1]: last and done.set())
    assert done.wait(10)
    assert log.counters.get("store.log_windows") == 1  # the three shared one window's sync
    # agents at random times leave a window with one record now and then: two in a row keep the
    # window, the third stops it, and later records sync at once
    _one_at_a_time(log, 6)
    assert log.counters.get("store.log_windows") == 4
    assert log.counters.get("store.log_windows_ungrouped") == 1
    log.close()
