"""Reading another process's ingest log as it grows (:mod:`gpuscope.store.ingest_log`'s layout).

An ingest worker (:mod:`gpuscope.web.ingest_worker`) appends to its own log and acknowledges a
batch once its record is synced; the hub reads that log behind it and moves the batches into its
store. The reader never writes: the log's owner alone cuts a torn record off and deletes the
segments the hub's store holds. It takes only records up to the owner's synced position (records
past it may still be torn, or lost with the machine, and renumbered by the owner's next run), in
order, each once, and remembers where it stopped, so that a pass costs a read of the new bytes.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from gpuscope.store.ingest_log import SUFFIX, record_crc

_HEAD = struct.Struct("<IIQ")
#: bytes read from a segment at a time: a replay or a reader behind its worker takes
#: ``limit`` records a pass, and reading a 32-MiB segment's whole rest for each pass made a
#: replay quadratic in the segment's size
CHUNK = 1 << 20


class LogTail:
    """The records of the log in ``directory`` after record ``after``, as they are synced.

    The segment being read stays open between passes (a pass that opened, sought, read to the
    end and closed it cost the hub's reader about 0.1 ms of CPU, several times a second per
    worker): the owner appends to the same file, cuts a torn record off it in place and deletes
    it only once the store holds all of it, so the open file shows what its name would."""

    def __init__(self, directory: Path, after: int) -> None:
        self.dir = directory
        self.position = after  # the last record handed out
        self._segment: int | None = None  # first sequence number of the segment being read
        self._fd = -1  # that segment, open
        self._offset = 0  # bytes of it read

    def close(self) -> None:
        """Close the segment being read (a later :meth:`read` opens it again)."""
        self._move(None)

    def _move(self, segment: int | None) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._segment, self._offset = segment, 0

    def _segments(self) -> list[int]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(
            int(n[: -len(SUFFIX)]) for n in names if n.endswith(SUFFIX) and n[: -len(SUFFIX)].isdigit()
        )

    def read(self, synced: int, limit: int = 4096) -> list[tuple[int, bytes]]:
        """Up to ``limit`` records after :attr:`position` and at most ``synced``, in order."""
        out: list[tuple[int, bytes]] = []
        while self.position < synced and len(out) < limit:
            if self._segment is None and not self._find():
                return out
            advanced, ended = self._read_segment(synced, limit, out)
            if not advanced:
                if not ended:
                    return out  # the rest is still being written
                newer = [s for s in self._segments() if s > (self._segment or 0)]
                if not newer:
                    return out
                self._move(newer[0])
        return out

    def _find(self) -> bool:
        """The segment that holds the next record: the last one starting at or before it (a
        segment is named by the number of its first record), else the first after it."""
        segments = self._segments()
        starts = [s for s in segments if s <= self.position + 1] or [
            s for s in segments if s > self.position
        ][:1]
        if not starts:
            return False
        self._move(starts[-1])
        return True

    def _open(self) -> bool:
        if self._segment is None:
            return False
        if self._fd < 0:
            try:
                self._fd = os.open(self.dir / f"{self._segment:020d}{SUFFIX}", os.O_RDONLY)
            except FileNotFoundError:  # released meanwhile: its records are in the store
                self._move(None)
                return False
        return True

    def _read_segment(self, synced: int, limit: int, out: list[tuple[int, bytes]]) -> tuple[bool, bool]:
        """Records of one segment from the saved offset into ``out``: (whether it read past any
        record, whether nothing more can come from it: its end, or a record that is torn or out
        of place)."""
        if not self._open():
            return False, False
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, max(0, min(size - self._offset, CHUNK)), self._offset)
        pos = 0
        ended = False
        while len(out) < limit and not ended:
            if pos + _HEAD.size > len(data):
                ended = self._offset + pos == size  # a part of a header: still being written
                break
            n, crc, seq = _HEAD.unpack_from(data, pos)
            end = pos + _HEAD.size + n
            if end > len(data):
                if pos or self._offset + end > size:
                    break  # the next chunk holds it, or it is still being written
                data = os.pread(self._fd, end, self._offset)  # one record larger than a chunk
                if len(data) < end:
                    break
            payload = data[pos + _HEAD.size : end]
            # in pieces, as the owner wrote it: zlib hands the interpreter lock to another thread
            # around a CRC of more than 5 KiB (an agent's record), and the reader waited to get it back
            if record_crc(seq, payload) != crc:
                ended = True  # torn: the owner cuts it off; its next records are in a newer segment
                break
            if seq > synced:
                break
            pos = end
            if seq > self.position:
                out.append((seq, payload))
                self.position = seq
        self._offset += pos
        return pos > 0, ended
