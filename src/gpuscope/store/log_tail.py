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
import zlib
from pathlib import Path

from gpuscope.store.ingest_log import SUFFIX

_HEAD = struct.Struct("<IIQ")
_SEQ = struct.Struct("<Q")


def _crc_ok(seq: int, payload: bytes, crc: int) -> bool:
    return zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq))) == crc


class LogTail:
    """The records of the log in ``directory`` after record ``after``, as they are synced."""

    def __init__(self, directory: Path, after: int) -> None:
        self.dir = directory
        self.position = after  # the last record handed out
        self._segment: int | None = None  # first sequence number of the segment being read
        self._offset = 0  # bytes of it read

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
            assert self._segment is not None
            before = len(out)
            ended = self._read_segment(self.dir / f"{self._segment:020d}{SUFFIX}", synced, limit, out)
            if len(out) == before:
                if not ended:
                    return out  # the rest is still being written
                newer = [s for s in self._segments() if s > self._segment]
                if not newer:
                    return out
                self._segment, self._offset = newer[0], 0
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
        self._segment, self._offset = starts[-1], 0
        return True

    def _read_segment(self, path: Path, synced: int, limit: int, out: list[tuple[int, bytes]]) -> bool:
        """Records of one segment from the saved offset into ``out``; True when nothing more
        can come from it (its end, or a record that is torn or out of place)."""
        try:
            with open(path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:  # released meanwhile: its records are in the store
            self._segment = None
            return False
        pos = 0
        ended = False
        while len(out) < limit and not ended:
            if pos + _HEAD.size > len(data):
                ended = pos == len(data)  # a part of a header: still being written
                break
            n, crc, seq = _HEAD.unpack_from(data, pos)
            end = pos + _HEAD.size + n
            if end > len(data):
                break  # still being written
            payload = data[pos + _HEAD.size : end]
            if not _crc_ok(seq, payload, crc):
                ended = True  # torn: the owner cuts it off; its next records are in a newer segment
                break
            if seq > synced:
                break
            pos = end
            if seq > self.position:
                out.append((seq, payload))
                self.position = seq
        self._offset += pos
        return ended
