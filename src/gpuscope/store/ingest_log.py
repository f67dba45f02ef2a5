"""The ingest log: an append-only, checksummed record log with group fsync.

A store acknowledges a batch once its record is in the log and synced; rows reach the database
later, in bulk (one transaction per tick instead of one per request). The appender that finds no
sync running runs ``fdatasync`` itself, for every record written so far; records written while a
sync runs wait for it and are covered by the next one, so many concurrent appends cost one sync,
and a lone append (agents spread over the second rarely overlap) costs no hand-off to another
thread and back. A background thread opens fresh segments, syncs what is left at close, and syncs
for writers that do not wait (:meth:`IngestLog.write`, then :meth:`IngestLog.when_synced`: the
hub's event loop writes a record and is called back once it is synced, with no thread of its own
waiting). That thread starts such a sync at most once per ``sync_window_s`` (group commit): agents
spread over the second rarely overlap a sync, so without the window each of their requests paid an
``fdatasync`` of its own; with it, the records written within the window share one, and each
writer still hears only once its record is on disk. A lone record after a quiet window is synced
at once, and so is every record while windows hold one record each (one writer replaying its spool
a batch at a time would otherwise go at one batch a window); a window is tried again each
``sync_probe_s``.

Layout: a directory of segment files named by the sequence number of their first record. A
record is ``<payload length u32><crc32 u32><seq u64><payload>``, the CRC over seq and payload. The
store records in its own transaction the last sequence number it holds (``release``); segments
wholly at or below it are deleted. On open, records after it are handed back for replay. A torn
record (a crash in the middle of a write) is dropped, counted, and cut off the file; it cannot
have been acknowledged, because acknowledgement waits for the sync after the whole write.

A small ``reserve`` file holds disk space back: when the disk fills, the store frees it to move
what is acknowledged into the database, so reads still see every acknowledged batch.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from gpuscope.counters import Counters

#: called once a record is synced (None) or its sync failed (the error)
Synced = Callable[[OSError | None], None]

log = logging.getLogger(__name__)

#: the log's thread starts a sync for waiting writers at most this often: records written within
#: the window share one ``fdatasync`` (agents spread over the second rarely overlap a sync of their
#: own, so without it each request paid one). A lone record after a quiet window syncs at once.
SYNC_WINDOW_S = 0.050
#: a window that grouped nothing (one writer sending a batch at a time, each after the last was
#: acknowledged: a spool's replay) only slowed that writer to one batch a window; the log then syncs
#: at once and tries the window again this long after
SYNC_PROBE_S = 1.0
#: windows in a row that each held one record before the log stops waiting them out (agents at
#: random times leave a window with one record now and then: 4 % of windows at 64 agents a second)
SYNC_SINGLES = 3

_HEAD = struct.Struct("<IIQ")
_SEQ = struct.Struct("<Q")
SUFFIX = ".seg"


class LogFailed(OSError):
    """An earlier sync failed: nothing more is acknowledged until the store is reopened."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: zlib hands the interpreter lock to another thread around a CRC of more than 5 KiB (CPython's
#: zlibmodule.c): an agent's record (5-6 KiB) went through that hand-over on the event loop, for
#: a computation of about a microsecond; in pieces of this size it stays on the loop
_CRC_PIECE = 5 * 1024


def record_crc(seq: int, payload: bytes) -> int:
    crc = zlib.crc32(_SEQ.pack(seq))
    if len(payload) <= _CRC_PIECE:
        return zlib.crc32(payload, crc)
    view = memoryview(payload)
    for at in range(0, len(payload), _CRC_PIECE):
        crc = zlib.crc32(view[at : at + _CRC_PIECE], crc)
    return crc


class IngestLog:
    def __init__(
        self,
        directory: Path,
        counters: Counters,
        *,
        segment_bytes: int = 32 << 20,
        reserve_bytes: int = 1 << 20,
        sync_window_s: float = SYNC_WINDOW_S,
        sync_probe_s: float = SYNC_PROBE_S,
    ) -> None:
        self.dir = directory
        self.counters = counters
        self.segment_bytes = segment_bytes
        self.reserve_bytes = reserve_bytes
        self.sync_window_s = sync_window_s
        self.sync_probe_s = sync_probe_s
        self.dir.mkdir(parents=True, exist_ok=True)
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # appenders wait on it for their record's sync
        self._work = threading.Condition(lock)  # the segment thread waits on it for rotation or close
        self._fd = -1
        self._size = 0  # bytes in the current segment
        self._written = 0  # last sequence number written
        self._synced = 0  # every record up to here is on disk
        self._first_unreleased = 1
        self._failed: OSError | None = None
        self._closing = False
        self._rotate = False
        self._syncing = False  # an fdatasync runs (the lock is released meanwhile)
        self._last_sync = 0.0  # monotonic start of the last sync
        self._pacing = False  # the log's thread waits out the window before its next sync
        self._grouping = False  # the last window waited out grouped two records or more
        self._probe_at = 0.0  # monotonic time from which a window is tried again
        self._waited = False  # the next sync of the log's thread ends a window waited out
        self._singles = 0  # windows in a row that held one record
        self._thread: threading.Thread | None = None
        #: (sequence number, callback) of records whose writers are called back once synced
        self._callbacks: list[tuple[int, Synced]] = []
        self._due: list[tuple[Synced, OSError | None]] = []  # called outside the lock
        self._current = self.dir / f"0{SUFFIX}"
        self._reserved = False

    # ------------------------------------------------------------------ opening

    def _segments(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.dir.iterdir():
            if p.suffix == SUFFIX and p.stem.isdigit():
                out.append((int(p.stem), p))
        return sorted(out)

    def recover(self, after: int) -> Iterator[tuple[int, bytes]]:
        """Every whole record with a sequence number above ``after``, in order; then the log is
        ready for appends (:meth:`start`). Torn or corrupt records are cut off and counted."""
        last = after
        for _, path in self._segments():
            data = path.read_bytes()
            pos = 0
            while pos < len(data):
                if pos + _HEAD.size > len(data):
                    break
                n, crc, seq = _HEAD.unpack_from(data, pos)
                end = pos + _HEAD.size + n
                if end > len(data) or record_crc(seq, data[pos + _HEAD.size : end]) != crc:
                    break
                if seq > after:
                    yield seq, data[pos + _HEAD.size : end]
                last = max(last, seq)
                pos = end
            if pos < len(data):
                self.counters.inc("store.log_torn_records")
                with open(path, "r+b") as f:
                    f.truncate(pos)
                    os.fsync(f.fileno())
        self._written = self._synced = last
        self._first_unreleased = after + 1

    def start(self) -> None:
        """Open a fresh segment for appends and start the sync thread."""
        self._open_segment()
        self.restore_reserve()
        self._thread = threading.Thread(target=self._sync_loop, name="gpuscope-log-sync", daemon=True)
        self._thread.start()

    def _open_segment(self) -> None:
        path = self.dir / f"{self._written + 1:020d}{SUFFIX}"
        self._current = path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        _fsync_dir(self.dir)  # the new file's name must survive a crash as well as its records
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._size = os.fstat(fd).st_size

    # ------------------------------------------------------------------ appending

    @property
    def synced(self) -> int:
        """The sequence number up to which every record is on disk."""
        return self._synced

    def append(self, payload: bytes, written: Callable[[int], None]) -> int:
        """Write one record, call ``written(seq)`` (in log order: under the log's lock), then wait
        until the record is synced. Raises OSError when it could not be written or synced."""
        try:
            with self._cond:
                seq = self._write(payload, written)
                while self._synced < seq and self._failed is None:
                    if self._syncing:
                        self._cond.wait()  # the running sync may not cover this record: the next will
                    else:
                        self._sync()
                if self._synced < seq:
                    raise self._error()
        finally:
            self._fire()  # this sync may have covered records whose writers wait to be called
        return seq

    def write(self, payload: bytes, written: Callable[[int], None]) -> int:
        """Write one record and call ``written(seq)`` (in log order: under the log's lock), without
        waiting for its sync: not durable on return (see :meth:`when_synced`). Raises OSError when
        it could not be written."""
        with self._cond:
            return self._write(payload, written)

    def when_synced(self, seq: int, done: Synced) -> None:
        """Call ``done(None)`` once record ``seq`` is synced, or ``done(error)`` if its sync failed:
        at once when it already is, else from the thread whose sync covers it (the log's own thread
        runs one for it). ``done`` must not block: it runs between syncs."""
        with self._cond:
            if self._synced >= seq or self._failed is not None:
                self._due.append((done, None if self._synced >= seq else self._error()))
            else:
                self._callbacks.append((seq, done))
                if not self._pacing:  # a thread pacing its next sync covers this record anyway
                    self._work.notify()
        self._fire()

    def _write(self, payload: bytes, written: Callable[[int], None]) -> int:
        """Write one record (the lock held)."""
        if self._failed is not None:
            raise LogFailed(errno.EIO, f"the ingest log failed earlier: {self._failed}")
        seq = self._written + 1
        record = _HEAD.pack(len(payload), record_crc(seq, payload), seq) + payload
        try:
            done = 0
            while done < len(record):
                done += os.write(self._fd, record[done:])
        except OSError:
            if done:  # a partial record would be torn: take it back
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(record)
        self._written = seq
        written(seq)
        return seq

    def _error(self) -> LogFailed:
        return LogFailed(errno.EIO, f"the ingest log could not be synced: {self._failed}")

    def _settle_callbacks(self) -> None:
        """Move the callbacks that a sync or a failure decided to ``_due`` (the lock held)."""
        if not self._callbacks:
            return
        if self._failed is not None:
            error = self._error()
            self._due += [(done, error) for _, done in self._callbacks]
            self._callbacks.clear()
            return
        keep = []
        for seq, done in self._callbacks:
            if seq <= self._synced:
                self._due.append((done, None))
            else:
                keep.append((seq, done))
        self._callbacks = keep

    def _fire(self) -> None:
        """Call the callbacks that are due, outside the lock, in the order they were decided."""
        if not self._due:  # unlocked read: whoever makes a callback due fires it afterwards
            return
        with self._cond:
            due, self._due = self._due, []
        for done, error in due:
            try:
                done(error)
            except Exception:  # one writer's callback must not stop the syncs of the others
                self.counters.inc("store.log_callback_errors")
                log.exception("a callback after the ingest log's sync failed")

    def _sync(self) -> None:
        """Sync every record written so far. Called with the lock held, which is released while
        ``fdatasync`` runs: records written meanwhile wait for the next sync."""
        self._syncing = True
        self._last_sync = time.monotonic()
        target, fd = self._written, self._fd
        failed: OSError | None = None
        self._cond.release()
        try:
            os.fdatasync(fd)
        except OSError as exc:
            failed = exc
        finally:
            self._cond.acquire()
            self._syncing = False
        if failed is not None:
            self._failed = failed
            self.counters.inc("store.log_sync_failures")
        else:
            self._synced = max(self._synced, target)
            self.counters.inc("store.log_syncs")
        self._settle_callbacks()
        self._cond.notify_all()
        if self._rotate or self._closing:
            self._work.notify()

    def _sync_loop(self) -> None:
        """Open a fresh segment when asked (:meth:`release`), sync for writers waiting to be called
        back (:meth:`when_synced`), at most once per ``sync_window_s``, and sync the rest at close."""
        while True:
            with self._cond:
                while not self._closing and not self._rotate and not self._callbacks:
                    self._work.wait()
                if self._syncing:
                    self._cond.wait()  # an appender's sync runs: the segment stays until it ends
                    continue
                if self._callbacks and not self._closing and self._failed is None:
                    now = time.monotonic()
                    early = self._last_sync + self.sync_window_s - now
                    if early > 0 and (self._grouping or now >= self._probe_at):
                        # records written until the window ends join this sync
                        self._pacing = self._waited = True
                        self._work.wait(early)
                        self._pacing = False
                        continue
                if self._synced < self._written and self._failed is None:
                    covered = self._written - self._synced
                    self._sync()
                    if self._waited:
                        self._waited = False
                        self.counters.inc("store.log_windows")
                        self._singles = 0 if covered >= 2 else self._singles + 1
                        if covered >= 2:
                            self._grouping = True
                        elif not self._grouping or self._singles >= SYNC_SINGLES:
                            self._grouping = False
                            self._probe_at = time.monotonic() + self.sync_probe_s
                            self.counters.inc("store.log_windows_ungrouped")
                self._settle_callbacks()
                stop = self._failed is not None or (self._closing and self._synced >= self._written)
                if not stop and self._rotate and self._synced >= self._written:
                    self._rotate = False
                    with contextlib.suppress(OSError):  # a full disk: keep writing the old one
                        self._open_segment()
            self._fire()
            if stop:
                return

    # ------------------------------------------------------------------ releasing

    def segment_full(self) -> bool:
        """Whether the open segment reached ``segment_bytes`` (:meth:`release` then asks for a
        fresh one)."""
        return self._size >= self.segment_bytes

    def release(self, upto: int) -> bool:
        """Everything up to ``upto`` is safe elsewhere: delete the segments that hold nothing
        newer, and ask for a fresh segment once the current one is large or fully released.
        True when it asked: the segment it leaves is deleted by a later call (with the same
        ``upto`` if it was fully released)."""
        with self._cond:
            self._first_unreleased = max(self._first_unreleased, upto + 1)
            asked = bool(self._size and (self._size >= self.segment_bytes or self._written <= upto))
            if asked:
                self._rotate = True
                self._work.notify()
        segments = self._segments()
        for k, (_, path) in enumerate(segments[:-1]):
            if segments[k + 1][0] - 1 <= upto and path != self._current:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return asked

    # ------------------------------------------------------------------ space

    @property
    def _reserve(self) -> Path:
        return self.dir / "reserve"

    def release_reserve(self) -> bool:
        """Give the reserved space back to the filesystem; False if it was already given."""
        self._reserved = False
        try:
            self._reserve.unlink()
        except FileNotFoundError:
            return False
        self.counters.inc("store.log_reserve_released")
        return True

    def restore_reserve(self) -> bool:
        """Hold the reserve again (True), or False while the disk has no room for it."""
        if self._reserved or self.reserve_bytes <= 0:
            return True
        try:
            fd = os.open(self._reserve.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.reserve_bytes)
            finally:
                os.close(fd)
            os.replace(self._reserve.with_suffix(".tmp"), self._reserve)
            self._reserved = True
        except OSError:
            with contextlib.suppress(OSError):
                self._reserve.with_suffix(".tmp").unlink()
            return False
        return True

    def has_reserve(self) -> bool:
        return self._reserved or self.reserve_bytes <= 0

    def bytes(self) -> int:
        return sum(p.stat().st_size for _, p in self._segments())

    def segments(self) -> int:
        return len(self._segments())

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Sync what was written, stop the sync thread and close the segment."""
        with self._cond:
            self._closing = True
            self._work.notify()
        if self._thread is not None:
            self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._written < self._first_unreleased:  # everything is elsewhere: no segment needed
            for _, path in self._segments():
                path.unlink()
