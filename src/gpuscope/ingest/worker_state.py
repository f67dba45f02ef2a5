"""What a hub and one of its ingest workers tell each other all the time, in a small shared file.

A file of :data:`SIZE` bytes in the worker's log directory, mapped by both processes: the worker
writes how far its log is synced (the hub takes no record past it), the hub how far its store
holds the log (the worker deletes the segments below) and whether it shows a sign of lag (the
worker then sheds as the hub would). Each field is an aligned 8-byte word that one side writes
and the other reads, so a reader sees the old value or the new one, never a mix. What is rare
(refusals, counters, a connection to hand over) goes over the worker's control socket instead.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

SIZE = 64
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_SYNCED, _HELD, _LAG = 0, 8, 16
NAME = "state"


class WorkerState:
    """The shared file of the worker whose log lives in ``directory`` (made if missing)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < SIZE:
                os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)

    @property
    def synced(self) -> int:
        """The worker's log is synced up to this record (the worker writes it)."""
        return int(_U64.unpack_from(self._map, _SYNCED)[0])

    @synced.setter
    def synced(self, seq: int) -> None:
        _U64.pack_into(self._map, _SYNCED, seq)

    @property
    def held(self) -> int:
        """The hub's store holds the worker's log up to this record (the hub writes it)."""
        return int(_U64.unpack_from(self._map, _HELD)[0])

    @held.setter
    def held(self, seq: int) -> None:
        _U64.pack_into(self._map, _HELD, seq)

    @property
    def hub_lagging(self) -> bool:
        """The hub shows a sign of lag (the hub writes it): the worker admits as a hub behind does."""
        return bool(_F64.unpack_from(self._map, _LAG)[0])

    @hub_lagging.setter
    def hub_lagging(self, lagging: bool) -> None:
        _F64.pack_into(self._map, _LAG, 1.0 if lagging else 0.0)

    def close(self) -> None:
        self._map.close()
