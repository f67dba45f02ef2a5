"""A bounded on-disk FIFO of encoded batches, so an agent loses nothing while the hub is away.

Layout of the directory:

- ``<id>.seg``: append-only segment files of framed records
  ``magic(4) | length u32 | crc32 u32 | payload``; the CRC covers length and payload, so a torn
  write (crash mid-record) or later damage is detected. A reader that meets a bad record skips
  forward to the next valid frame and counts the bytes skipped.
- ``cursor``: the segment and offset of the oldest record not yet acknowledged, replaced
  atomically and fsynced on every ack, so a restarted agent replays exactly what was not
  acknowledged, in order.
- ``lock``: held with ``flock`` so two agents never share a spool.

A restarted spool always appends to a fresh segment, so it never writes behind a torn tail.
The spool is bounded by bytes on disk: when a new record does not fit, whole oldest segments are
dropped (their unacknowledged records counted as ``spool_dropped_batches`` / ``_bytes``). Disk
errors are counted and logged, never raised to the agent loop.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import struct
import threading
import zlib
from collections import deque
from pathlib import Path
from typing import IO

from gpuscope.counters import Counters

log = logging.getLogger("gpuscope.agent.spool")

MAGIC = b"\xa7\x5c\x0e\xd1"
HEADER = struct.Struct("<4sII")
SUFFIX = ".seg"


class SpoolError(OSError):
    """The spool directory cannot be used at all (not creatable, or held by another agent)."""


def _crc(payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<I", len(payload))))


def frame_record(payload: bytes) -> bytes:
    """The on-disk form of one record."""
    return HEADER.pack(MAGIC, len(payload), _crc(payload)) + payload


def scan_records(data: bytes, start: int, max_len: int) -> tuple[list[tuple[int, int]], int, int]:
    """Valid records in a segment's bytes from ``start``: ``([(offset, length)], bad_regions, bad_bytes)``.

    A region that is not a valid record (torn tail, damaged header or payload) is skipped by
    searching for the next magic whose record checks out.
    """
    records: list[tuple[int, int]] = []
    bad_regions = bad_bytes = 0
    pos, end = start, len(data)
    bad_from: int | None = None
    while pos < end:
        ok = False
        if pos + HEADER.size <= end:
            magic, length, crc = HEADER.unpack_from(data, pos)
            body = pos + HEADER.size
            ok = magic == MAGIC and length <= max_len and body + length <= end
            ok = ok and _crc(data[body : body + length]) == crc
        if ok:
            if bad_from is not None:
                bad_regions, bad_bytes, bad_from = bad_regions + 1, bad_bytes + pos - bad_from, None
            records.append((pos, length))
            pos = body + length
            continue
        if bad_from is None:
            bad_from = pos
        nxt = data.find(MAGIC, pos + 1)
        pos = end if nxt < 0 else nxt
    if bad_from is not None:
        bad_regions, bad_bytes = bad_regions + 1, bad_bytes + end - bad_from
    return records, bad_regions, bad_bytes


class Spool:
    """Bounded persistent FIFO of byte records: :meth:`append`, then :meth:`peek` / :meth:`ack`."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = 256 * 1024 * 1024,
        segment_bytes: int = 8 * 1024 * 1024,
        counters: Counters | None = None,
        fsync: bool = True,
    ) -> None:
        if max_bytes < 2 * HEADER.size:
            raise ValueError(f"spool max_bytes must be at least {2 * HEADER.size}, got {max_bytes}")
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        # at least two segments fit, so rolling over always leaves an older one to drop
        self.segment_bytes = max(HEADER.size, min(segment_bytes, max_bytes // 2))
        self.counters = counters if counters is not None else Counters()
        self._fsync = fsync
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}  # segment id -> bytes on disk, oldest first
        self._index: deque[tuple[int, int, int]] = deque()  # pending: segment, offset, length
        self._pending_bytes = 0
        self._active_id = 0
        self._active: IO[bytes] | None = None
        self._reader: tuple[int, IO[bytes]] | None = None
        self._cursor = (0, 0)
        self._full_logged = False
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lockfile = open(self.dir / "lock", "a+b")  # noqa: SIM115 - held for the spool's life
        except OSError as exc:
            raise SpoolError(f"spool directory {self.dir} cannot be used: {exc}") from exc
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lockfile.close()
            raise SpoolError(f"spool directory {self.dir} is in use by another agent") from None
        try:
            self._recover()
        except OSError as exc:
            self._lockfile.close()
            raise SpoolError(f"spool directory {self.dir} cannot be read: {exc}") from exc

    # ---- public API -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._index)

    @property
    def pending_bytes(self) -> int:
        """Payload bytes waiting to be acknowledged."""
        return self._pending_bytes

    @property
    def disk_bytes(self) -> int:
        """Bytes of all segment files, including acknowledged and skipped parts not yet deleted."""
        return sum(self._sizes.values())

    def append(self, payload: bytes) -> bool:
        """Store a record durably behind the others; False when it could not be stored (counted)."""
        with self._lock:
            size = HEADER.size + len(payload)
            if size > self.max_bytes:
                self._count_dropped(1, len(payload))
                log.warning("spool: a %d-byte record is larger than the whole spool; dropped", len(payload))
                return False
            try:
                active_size = self._sizes.get(self._active_id, 0)
                if self._active is None or (active_size > 0 and active_size + size > self.segment_bytes):
                    self._roll()
                while self.disk_bytes + size > self.max_bytes and next(iter(self._sizes)) != self._active_id:
                    dropped = self._drop_segment(next(iter(self._sizes)))
                    if dropped and not self._full_logged:  # once per outage; counters keep the total
                        self._full_logged = True
                        log.warning(
                            "spool: full (%d bytes); dropping the oldest batches (counted as "
                            "spool_dropped_batches)",
                            self.max_bytes,
                        )
                self._write(frame_record(payload))
            except OSError as exc:
                self.counters.inc("spool_write_errors")
                self._count_dropped(1, len(payload))
                log.error("spool: cannot write to %s (%s); the batch is dropped", self.dir, exc)
                return False
            offset = self._sizes[self._active_id]
            self._sizes[self._active_id] = offset + size
            self._index.append((self._active_id, offset, len(payload)))
            self._pending_bytes += len(payload)
            return True

    def peek(self) -> bytes | None:
        """The oldest unacknowledged record, or None when the spool is empty.

        A record that fails its CRC on reading (damaged since it was written) or cannot be read
        is counted and skipped.
        """
        with self._lock:
            while self._index:
                seg, offset, length = self._index[0]
                try:
                    raw = self._read(seg, offset, HEADER.size + length)
                except OSError as exc:
                    # a segment that cannot be read is given up whole, rather than one error per record
                    self.counters.inc("spool_read_errors")
                    n = self._drop_segment(seg)
                    log.error(
                        "spool: cannot read segment %d of %s (%s); its %d batches dropped",
                        seg,
                        self.dir,
                        exc,
                        n,
                    )
                    continue
                records, _, _ = scan_records(raw, 0, length)
                if records == [(0, length)]:
                    return raw[HEADER.size :]
                self.counters.inc("spool_corrupt_records")
                self.counters.inc("spool_corrupt_bytes", HEADER.size + length)
                log.error("spool: record at %d of segment %d failed its CRC; skipped", offset, seg)
                self._pop_head()
            return None

    def ack(self) -> None:
        """The oldest record was delivered (or permanently refused): never hand it out again."""
        with self._lock:
            if self._index:
                self._pop_head()

    def close(self) -> None:
        with self._lock:
            for fh in (self._active, self._reader[1] if self._reader else None):
                if fh is not None:
                    fh.close()
            self._active = self._reader = None
            self._lockfile.close()

    # ---- internals --------------------------------------------------------------------------

    def _seg_path(self, seg: int) -> Path:
        return self.dir / f"{seg:020d}{SUFFIX}"

    def _recover(self) -> None:
        """Rebuild the pending index from the cursor and the segments on disk."""
        ids = sorted(int(p.stem) for p in self.dir.glob(f"*{SUFFIX}") if p.stem.isdigit())
        cur_seg, cur_off = self._load_cursor(ids)
        for seg in ids:
            path = self._seg_path(seg)
            if seg < cur_seg:
                path.unlink()  # fully acknowledged before the last shutdown
                continue
            data = path.read_bytes()
            start = cur_off if seg == cur_seg else 0
            records, bad_regions, bad_bytes = scan_records(data, start, self.max_bytes)
            if bad_regions:
                self.counters.inc("spool_corrupt_records", bad_regions)
                self.counters.inc("spool_corrupt_bytes", bad_bytes)
                log.warning(
                    "spool: %d damaged region(s), %d bytes, in %s (torn write?); skipped",
                    bad_regions,
                    bad_bytes,
                    path.name,
                )
            if not records:
                path.unlink()
                continue
            self._sizes[seg] = len(data)
            for offset, length in records:
                self._index.append((seg, offset, length))
                self._pending_bytes += length
        self._active_id = max([cur_seg, *(seg + 1 for seg in ids)])
        if self._index:
            self._cursor = self._index[0][:2]
        else:
            self._cursor = (self._active_id, 0)
        self._save_cursor()
        if self._index:
            log.info(
                "spool: %d batches (%d bytes) waiting in %s", len(self._index), self._pending_bytes, self.dir
            )

    def _load_cursor(self, ids: list[int]) -> tuple[int, int]:
        path = self.dir / "cursor"
        try:
            obj = json.loads(path.read_text())
            seg, off = obj["segment"], obj["offset"]
            if not (isinstance(seg, int) and isinstance(off, int) and seg >= 0 and off >= 0):
                raise ValueError("segment and offset must be non-negative integers")
            return seg, off
        except FileNotFoundError:
            return (ids[0] if ids else 0), 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # replaying from the start is safer than losing data; the hub drops repeated batch ids
            self.counters.inc("spool_cursor_errors")
            log.error("spool: cursor file %s is unreadable (%s); replaying every segment", path, exc)
            return (ids[0] if ids else 0), 0

    def _save_cursor(self) -> None:
        tmp = self.dir / "cursor.tmp"
        seg, off = self._cursor
        with open(tmp, "w") as fh:
            fh.write(json.dumps({"segment": seg, "offset": off}))
            fh.flush()
            if self._fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, self.dir / "cursor")
        self._sync_dir()

    def _sync_dir(self) -> None:
        if not self._fsync:
            return
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _close_active(self) -> None:
        """Close the active segment; the next one takes a fresh id, never a file that holds data."""
        if self._active is not None:
            self._active.close()
            self._active = None
        if self._active_id in self._sizes:
            self._active_id += 1

    def _roll(self) -> None:
        """Start a new active segment."""
        self._close_active()
        # unbuffered: every record is written and fsynced at once, a buffer would only add a copy
        self._active = open(self._seg_path(self._active_id), "ab", buffering=0)  # noqa: SIM115 - kept open
        self._sizes[self._active_id] = 0
        self._sync_dir()

    def _write(self, data: bytes) -> None:
        assert self._active is not None
        size = self._sizes[self._active_id]
        view = memoryview(data)
        try:
            while view:
                n = self._active.write(view)
                if not n:
                    raise OSError(errno.EIO, f"segment {self._active_id}: the write made no progress")
                view = view[n:]
            if self._fsync:
                os.fsync(self._active.fileno())
        except OSError:
            # cut the partial record so later appends stay readable; if even that fails, the
            # next append starts a new segment and the scan skips the torn bytes
            try:
                self._active.truncate(size)
            except OSError:
                fh, self._active = self._active, None
                self._sizes[self._active_id] = size + len(data)
                with contextlib.suppress(OSError):
                    fh.close()
            raise

    def _read(self, seg: int, offset: int, n: int) -> bytes:
        if self._reader is None or self._reader[0] != seg:
            if self._reader is not None:
                self._reader[1].close()
                self._reader = None
            self._reader = (seg, open(self._seg_path(seg), "rb"))  # noqa: SIM115 - cached handle
        fh = self._reader[1]
        fh.seek(offset)
        data = fh.read(n)
        if len(data) != n:
            raise OSError(f"segment {seg} ends at {offset + len(data)}, record needs {offset + n}")
        return data

    def _pop_head(self) -> None:
        _, _, length = self._index.popleft()
        self._pending_bytes -= length
        self._advance_cursor()

    def _advance_cursor(self) -> None:
        """Persist the new cursor, then delete segments that are now fully behind it."""
        if self._index:
            self._cursor = self._index[0][:2]
        else:
            self._full_logged = False
            # empty: the next record starts a fresh segment, so consumed bytes do not linger
            self._close_active()
            self._cursor = (self._active_id, 0)
        if self._persist_cursor():
            for seg in [s for s in self._sizes if s < self._cursor[0]]:
                self._unlink(seg)

    def _persist_cursor(self) -> bool:
        try:
            self._save_cursor()
            return True
        except OSError as exc:
            self.counters.inc("spool_write_errors")
            log.error("spool: cannot save the cursor in %s (%s); a restart may replay", self.dir, exc)
            return False

    def _unlink(self, seg: int) -> None:
        if self._reader is not None and self._reader[0] == seg:
            self._reader[1].close()
            self._reader = None
        if seg == self._active_id and self._active is not None:
            self._active.close()  # the next append starts a new file rather than write to a deleted one
            self._active = None
        self._sizes.pop(seg, None)
        try:
            self._seg_path(seg).unlink()
        except OSError as exc:
            self.counters.inc("spool_write_errors")
            log.error("spool: cannot delete segment %d of %s (%s)", seg, self.dir, exc)

    def _drop_segment(self, seg: int) -> int:
        """Drop a whole segment with whatever in it was still pending; returns how many were."""
        n = nbytes = 0
        while self._index and self._index[0][0] == seg:
            nbytes += self._index.popleft()[2]
            n += 1
        self._pending_bytes -= nbytes
        self._count_dropped(n, nbytes)
        if self._index:
            self._cursor = self._index[0][:2]
        elif seg == self._active_id:
            self._cursor = (seg, 0)  # the next append recreates this segment from its start
        else:
            self._cursor = (self._active_id, self._sizes.get(self._active_id, 0))
        # deleted even if the cursor could not be saved: a restart skips a missing segment
        self._persist_cursor()
        self._unlink(seg)
        return n

    def _count_dropped(self, batches: int, nbytes: int) -> None:
        self.counters.inc("spool_dropped_batches", batches)
        self.counters.inc("spool_dropped_bytes", nbytes)
