"""Sealed raw telemetry: closed time chunks moved out of the hot table into zstd Parquet files.

Why files: DuckDB's own table compression (ALP, bitpacking, RLE) has no entropy coder, and noisy
GPU telemetry (power in mW, PCIe/NVLink throughput, energy counters) costs about 0.9 bytes per
sample that way. The same rows written as Parquet (format v2: byte-stream-split floats, delta
integers, zstd), ordered by (entity, ts) so each GPU's values sit together, cost about 0.6.
DuckDB reads the files in place, with row-group statistics pruning by time and entity.

A chunk is registered in the ``chunks`` table in the same transaction that deletes its rows from
the hot table, after the file is fsynced; a crash in between leaves an unregistered file, which
the next open deletes. Recent data stays in the hot table, where appends are WAL-durable.

Pieces: the hot rows are sealed every few minutes (``seal_interval_s``), so that neither the hot
table nor a seal's sort ever holds more than a piece; once an hour is closed its pieces are merged
into one file (:meth:`ChunkSet.merge`: the pieces' row groups joined as they are, each piece already
ordered by entity, so nothing is sorted or decoded), which keeps the number of files one per hour.
The merged file is registered and the pieces unregistered in one transaction; a crash before it
leaves the new file unregistered, after it the pieces, and the next open deletes whichever.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from gpuscope.store.duckdb import parquet_concat
from gpuscope.store.duckdb.schema import one
from gpuscope.store.errors import StoreError
from gpuscope.store.registry import ATTR_COLUMNS

PARQUET_OPTIONS = "FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION V2, ROW_GROUP_SIZE 122880"
#: For the merge of pieces with different columns only (the others are joined undecoded): a
#: decoding merge holds about four copies of a row group. Merging an hour of 64 nodes' one-minute
#: pieces (2.0 M rows) lifted RSS by 169 MiB at 122,880 rows per group and 106 MiB at 61,440, and
#: the file was 22.9 and 20.5 MiB (30,720: 93 MiB, but 33.5 MiB; bench/bench_seal_memory.py pieces).
MERGE_OPTIONS = "FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION V2, ROW_GROUP_SIZE 61440"
#: The merge writes pieces again together in runs of at least this many rows (one row group per
#: run, up to MERGE_OPTIONS' 61,440 rows): realistic telemetry (bench/bench_storage.py, 64 GPUs)
#: cost 0.705 bytes/sample in row groups of 57,600 or more rows, 0.735 at 19,200 and 0.796 at
#: 3,840; see docs/scaling.md (d). An hour merged before is kept as it is (joined undecoded).
JOIN_ROWS = 30_720
#: A seal sorts and writes the hot rows a range of entities of about this many rows at a time:
#: DuckDB's Parquet writer holds a whole row group, and with the sort in front of it a seal's
#: allocator peak grows with the rows it writes at once (bench/bench_upkeep_steps.py: a minute of 64
#: nodes, ~35,000 rows of 53 columns, lifted jemalloc's allocated bytes by 24 MiB in one range,
#: 12 MiB in ranges of 16,384 rows and 6.5 MiB in ranges of 8,192; docs/scaling.md (d)). The
#: small row groups this leaves in a piece are written again into large ones when its hour is
#: merged, once an hour instead of every minute.
SEAL_SORT_ROWS = 8_192
#: A seal of many rows (a large fleet, a hub back after downtime) takes larger ranges, so that it
#: makes at most this many: each range scans the hot rows again, and the hour's merge writes
#: small ranges again (0.10 CPU-s more a minute's upkeep and 6.5 CPU-s more a merge at 64 nodes,
#: bench/bench_seal_memory.py, docs/scaling.md (d)); at 1,024 nodes this keeps the ranges (9 of
#: 61,440 rows) and the undecoded merge of before, where the hub has no CPU to spare ...
SEAL_MAX_RANGES = 8
#: ... up to this many rows a range (the range of before: the memory of a sort of 61,440 rows).
SEAL_MAX_SORT_ROWS = 61_440
FILE_RE = re.compile(r"^(chunk|hour)-\d+-\d+-\d+\.parquet$")
MERGED = "hour"  # the name of a file merged from an hour's pieces starts so; a piece's with "chunk"
METRIC_RE = re.compile(r"^m(\d+)$")
BASE_COLUMNS = ("ts", "entity", *ATTR_COLUMNS)


@dataclass(frozen=True, slots=True)
class Chunk:
    file: str  # name inside the chunk directory
    lo: int  # first ts (ms) in the file
    hi: int  # ts bound: every row is < hi
    rows: int
    bytes: int
    cols: frozenset[int]  # metric columns present in the file

    @property
    def merged(self) -> bool:
        return self.file.startswith(MERGED + "-")


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _present(column: str, cols: frozenset[int]) -> bool:
    match = METRIC_RE.match(column)
    return match is None or int(match.group(1)) in cols


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_chunk_file(path: Path, size: int) -> None:
    """A sealed file must still be what was sealed: its size, and Parquet's magic at both ends.

    Caught at open, a damaged chunk stops the hub with its name instead of failing queries later.
    """
    actual = path.stat().st_size
    why = None
    if actual != size:
        why = f"{actual} bytes where {size} were written"
    else:
        with path.open("rb") as f:
            head = f.read(4)
            f.seek(-4, os.SEEK_END)
            if head != b"PAR1" or f.read(4) != b"PAR1":
                why = "not a Parquet file any more"
    if why is not None:
        raise StoreError(
            f"gpuscope store is damaged: chunk file {path} is {why}. Nothing was changed; restore "
            f"the store and its chunk directory from a backup"
        )


def _copy(con: duckdb.DuckDBPyConnection, query: str, target: Path, options: str = PARQUET_OPTIONS) -> int:
    """``query``'s rows written by DuckDB to the Parquet file ``target``; their count."""
    written = one(con, f"COPY ({query}) TO {_sql_str(str(target))} ({options})")
    return int(written[0]) if written else 0


def _join(sources: list[Path], target: Path) -> int:
    with target.open("wb") as out:
        return parquet_concat.concat(sources, out)


def _entity_ranges(con: duckdb.DuckDBPyConnection, cut: int, count: int) -> list[str]:
    """SQL conditions that split the ``count`` hot rows older than ``cut`` into consecutive ranges
    of entities of about :data:`SEAL_SORT_ROWS` rows each, larger where that would make more than
    :data:`SEAL_MAX_RANGES` of them, up to :data:`SEAL_MAX_SORT_ROWS` (an entity's rows stay in one
    range)."""
    counts = con.execute(
        "SELECT entity, count(*) FROM samples WHERE ts < ? GROUP BY entity ORDER BY entity", [cut]
    ).fetchall()
    per_range = min(max(SEAL_SORT_ROWS, -(-count // SEAL_MAX_RANGES)), SEAL_MAX_SORT_ROWS)
    starts: list[str] = []
    held = 0
    for entity, n in counts:
        if held >= per_range:
            starts.append(_sql_str(str(entity)))
            held = 0
        held += int(n)
    if not starts:
        return []
    middle = [f"entity >= {a} AND entity < {b}" for a, b in itertools.pairwise(starts)]
    return [f"entity < {starts[0]}", *middle, f"entity >= {starts[-1]}"]


def _large(piece: Chunk) -> bool:
    """Whether ``piece``'s row groups are large enough to keep in a merged hour (joined undecoded):
    an hour merged before, or a piece sealed in ranges of at least :data:`JOIN_ROWS` rows."""
    return piece.merged or piece.rows >= SEAL_MAX_RANGES * JOIN_ROWS


def _runs(pieces: list[Chunk]) -> list[list[Chunk]]:
    """``pieces`` in order, in runs: a large piece alone (:func:`_large`), the others together
    until they hold :data:`JOIN_ROWS` rows."""
    runs: list[list[Chunk]] = []
    run: list[Chunk] = []
    for piece in pieces:
        if _large(piece):
            if run:
                runs.append(run)
                run = []
            runs.append([piece])
            continue
        run.append(piece)
        if sum(c.rows for c in run) >= JOIN_ROWS:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    return runs


def _recode(sources: list[Path], cols: frozenset[int], target: Path, options: str = MERGE_OPTIONS) -> int:
    """``sources`` read and written again as one file (metrics a source lacks as NULL)."""
    names = ", ".join([*BASE_COLUMNS, *(f"m{c}" for c in sorted(cols))])
    files = ", ".join(_sql_str(str(p)) for p in sources)
    query = f"SELECT {names} FROM read_parquet([{files}], union_by_name = true)"
    # The copy runs in a DuckDB of its own with one thread: the store's threads would read
    # row groups ahead of the writer and hold them (kept in order) for the store's whole limit.
    with contextlib.closing(duckdb.connect(":memory:", config={"threads": 1})) as copier:
        return _copy(copier, query, target, options)


class _ReadsChunks(ABC):
    """``source``, the SQL that reads the hot table together with chunk files: for a frozen
    :class:`ChunkView` and for the live :class:`ChunkSet` (whose :meth:`view` freezes its current list)."""

    __slots__ = ()

    @abstractmethod
    def view(self) -> ChunkView: ...

    def source(
        self,
        columns: list[str],
        where: str,
        params: list[Any],
        lo: int | None,
        hi: int | None,
        require: int | None = None,
    ) -> tuple[str, list[Any]]:
        """``SELECT columns FROM <hot table and chunk files> WHERE where``: one UNION ALL part per
        distinct column set among the files (a file lacks metrics that appeared after it; files
        without metric column ``require``, which ``where`` may name, are skipped)."""
        view = self.view()
        names = ", ".join(columns)
        parts = [f"SELECT {names} FROM samples WHERE {where}"]
        out_params = list(params)
        groups: dict[frozenset[int], list[Chunk]] = {}
        for chunk in view.chunks:
            if (hi is not None and chunk.lo >= hi) or (lo is not None and chunk.hi <= lo):
                continue
            if require is None or require in chunk.cols:
                groups.setdefault(chunk.cols, []).append(chunk)
        if not groups:
            return parts[0], out_params
        if view.directory is None:
            raise StoreError("chunk files are registered but the store has no chunk directory")
        base: Path = view.directory
        for cols, chunks in groups.items():
            select = ", ".join(c if _present(c, cols) else f"NULL::FLOAT AS {c}" for c in columns)
            files = ", ".join(_sql_str(str(base / c.file)) for c in chunks)
            parts.append(f"SELECT {select} FROM read_parquet([{files}]) WHERE {where}")
            out_params.extend(params)
        return " UNION ALL ".join(parts), out_params


@dataclass(frozen=True, slots=True)
class ChunkView(_ReadsChunks):
    """A frozen list of chunk files: a query reads the files of one moment."""

    directory: Path | None
    chunks: tuple[Chunk, ...]

    def view(self) -> ChunkView:
        return self


class ChunkSet(_ReadsChunks):
    """The registered chunk files of one store, and the SQL that reads them with the hot table."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._chunks: list[Chunk] = []
        self._seq = 0
        # unregistered and hidden from new queries; deleted one removal later (readers may hold them)
        self._hidden: list[Chunk] = []  # hidden since the last removal
        self._graveyard: list[Chunk] = []  # hidden before it: deleted by the next

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def load(self, rows: list[tuple[Any, ...]]) -> None:
        """Register the chunks listed in the database; delete files a crash left unregistered."""
        chunks = [
            Chunk(
                str(f), int(lo), int(hi), int(n), int(b), frozenset(int(c) for c in str(cols).split(",") if c)
            )
            for f, lo, hi, n, b, cols in rows
        ]
        if self.directory is None:
            if chunks:
                raise StoreError("an in-memory store cannot have chunk files")
            return
        registered = {c.file for c in chunks}
        missing = [c.file for c in chunks if not (self.directory / c.file).is_file()]
        if missing:
            raise StoreError(
                f"gpuscope store is damaged: chunk file(s) {missing[:3]} are missing from {self.directory}"
            )
        for c in chunks:
            _check_chunk_file(self.directory / c.file, c.bytes)
        if self.directory.is_dir():
            for entry in self.directory.iterdir():
                if FILE_RE.match(entry.name) and entry.name not in registered:
                    entry.unlink()  # written by a seal that crashed before it committed
        with self._lock:
            self._chunks = sorted(chunks, key=lambda c: (c.lo, c.file))
            self._seq = max((int(c.file.rsplit("-", 1)[1].split(".")[0]) for c in chunks), default=0)

    def all(self) -> list[Chunk]:
        with self._lock:
            return list(self._chunks)

    def total_bytes(self) -> int:
        with self._lock:
            return sum(c.bytes for c in self._chunks)

    def total_rows(self) -> int:
        with self._lock:
            return sum(c.rows for c in self._chunks)

    def view(self) -> ChunkView:
        """The current chunks, frozen: a query reads the files of one moment."""
        with self._lock:
            return ChunkView(self.directory, tuple(self._chunks))

    def seal(self, con: duckdb.DuckDBPyConnection, cut: int, cols: list[int]) -> Chunk | None:
        """Write hot rows older than ``cut`` to a new chunk file and delete them from the hot
        table, in the caller's open transaction (so exactly the rows written are deleted).

        The rows are sorted by (entity, ts) a range of entities of about :data:`SEAL_SORT_ROWS`
        rows at a time, each range written as its own row groups and the ranges joined in
        entity order: a sort holds what it sorts, so a large fleet's minute would otherwise
        lift the hub's memory in proportion to the fleet."""
        assert self.directory is not None
        row = one(con, "SELECT min(ts), count(*) FROM samples WHERE ts < ?", [cut])
        if row is None or not row[1]:
            return None
        lo, count = int(row[0]), int(row[1])
        names = ", ".join([*BASE_COLUMNS, *(f"m{c}" for c in cols)])
        select = f"SELECT {names} FROM samples WHERE ts < {int(cut)}"
        ranges = _entity_ranges(con, cut, count) if count > SEAL_SORT_ROWS else []
        if len(ranges) < 2:
            query = f"{select} ORDER BY entity, ts"
            path, chunk = self._write(
                con, "chunk", lo, cut, frozenset(cols), lambda target: _copy(con, query, target)
            )
        else:
            directory = self.directory
            directory.mkdir(parents=True, exist_ok=True)
            parts: list[Path] = []
            try:
                for where in ranges:
                    with self._lock:
                        self._seq += 1
                        part = directory / f"chunk-{lo}-{cut}-{self._seq}.parquet"
                    parts.append(part)
                    _copy(con, f"{select} AND {where} ORDER BY entity, ts", part)
                path, chunk = self._write(
                    con, "chunk", lo, cut, frozenset(cols), lambda target: _join(parts, target)
                )
            finally:
                for part in parts:
                    part.unlink(missing_ok=True)
        try:
            if chunk.rows != count:
                raise StoreError(f"sealing {count} hot rows wrote {chunk.rows} to chunk file {chunk.file}")
            con.execute("DELETE FROM samples WHERE ts < ?", [cut])
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return chunk

    def merge(self, con: duckdb.DuckDBPyConnection, pieces: list[Chunk]) -> Chunk:
        """Write ``pieces`` (in time order) as one chunk file, register it and unregister them, in
        the caller's open transaction. Each piece is ordered by entity already, so nothing is
        sorted: the pieces are read and written again in runs of at least :data:`JOIN_ROWS` rows,
        a run at a time, each into row groups of up to 61,440 rows (a seal writes small ones to
        bound its memory, zstd needs rows to compress well), and the runs' files joined undecoded
        (:mod:`parquet_concat`), as is a large piece (:func:`_large`). Pieces with different
        columns (a metric appeared in the hour) are read and written again as one instead."""
        assert self.directory is not None and len(pieces) > 1
        pieces = sorted(pieces, key=lambda c: (c.lo, c.file))
        cols = frozenset().union(*(c.cols for c in pieces))
        lo, hi = min(c.lo for c in pieces), max(c.hi for c in pieces)
        directory = self.directory
        if all(c.cols == cols for c in pieces):
            parts: list[Path] = []
            # the runs' files are for this merge only: unregistered, a crash leaves them to the next open
            runs: list[Path] = []
            try:
                for run in _runs(pieces):
                    if _large(run[0]):
                        parts.append(directory / run[0].file)
                        continue
                    with self._lock:
                        self._seq += 1
                        tmp = directory / f"chunk-{run[0].lo}-{run[-1].hi}-{self._seq}.parquet"
                    runs.append(tmp)
                    _recode([directory / c.file for c in run], cols, tmp)
                    parts.append(tmp)
                path, chunk = self._write(con, MERGED, lo, hi, cols, lambda target: _join(parts, target))
            except parquet_concat.NotJoinable:
                pass
            else:
                return self._check_merge(con, pieces, path, chunk)
            finally:
                for tmp in runs:
                    tmp.unlink(missing_ok=True)
        paths = [directory / c.file for c in pieces]
        path, chunk = self._write(con, MERGED, lo, hi, cols, lambda target: _recode(paths, cols, target))
        return self._check_merge(con, pieces, path, chunk)

    def _check_merge(
        self, con: duckdb.DuckDBPyConnection, pieces: list[Chunk], path: Path, chunk: Chunk
    ) -> Chunk:
        try:
            if chunk.rows != sum(c.rows for c in pieces):
                raise StoreError(
                    f"merging chunk files {[c.file for c in pieces][:3]} wrote {chunk.rows} rows "
                    f"where they hold {sum(c.rows for c in pieces)}"
                )
            con.execute("DELETE FROM chunks WHERE file IN (SELECT unnest(?))", [[c.file for c in pieces]])
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return chunk

    def _write(
        self,
        con: duckdb.DuckDBPyConnection,
        kind: str,
        lo: int,
        hi: int,
        cols: frozenset[int],
        produce: Callable[[Path], int],
    ) -> tuple[Path, Chunk]:
        """A new, fsynced chunk file written by ``produce`` (which returns its row count),
        registered in ``con``'s open transaction."""
        assert self.directory is not None
        with self._lock:
            self._seq += 1
            name = f"{kind}-{lo}-{hi}-{self._seq}.parquet"
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / name
        try:
            rows = produce(path)
            _fsync(path)
            _fsync(self.directory)
            chunk = Chunk(name, lo, hi, rows, path.stat().st_size, cols)
            con.execute(
                "INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?)",
                [chunk.file, chunk.lo, chunk.hi, chunk.rows, chunk.bytes, ",".join(map(str, sorted(cols)))],
            )
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path, chunk

    def added(self, chunk: Chunk) -> None:
        """Make a committed chunk visible to queries."""
        with self._lock:
            self._chunks.append(chunk)
            self._chunks.sort(key=lambda c: (c.lo, c.file))

    def replaced(self, pieces: list[Chunk], merged: Chunk) -> None:
        """After the commit of a :meth:`merge`: new queries read ``merged`` instead of ``pieces``,
        whose files go when no query can hold them any more (see :meth:`removed`)."""
        gone = {c.file for c in pieces}
        with self._lock:
            self._chunks = sorted(
                [*(c for c in self._chunks if c.file not in gone), merged], key=lambda c: (c.lo, c.file)
            )
            self._hidden.extend(pieces)

    def expire(self, con: duckdb.DuckDBPyConnection, cut: int) -> list[Chunk]:
        """Unregister chunks entirely older than ``cut`` (in the caller's transaction)."""
        old = [c for c in self.all() if c.hi <= cut]
        if old:
            con.execute("DELETE FROM chunks WHERE hi <= ?", [cut])
        return old

    def removed(self, chunks: list[Chunk]) -> None:
        """After the commit that unregistered ``chunks``: hide them from new queries; delete the
        files hidden before the previous call (a query started before that has long finished)."""
        gone = {c.file for c in chunks}
        with self._lock:
            self._chunks = [c for c in self._chunks if c.file not in gone]
            doomed, self._graveyard, self._hidden = self._graveyard, [*self._hidden, *chunks], []
        self._unlink(doomed)

    def discard(self, chunks: list[Chunk]) -> None:
        """Delete the files of chunks whose registration was rolled back (never visible)."""
        self._unlink(chunks)

    def close(self) -> None:
        """Delete the files still waiting for readers to finish (there are none after close)."""
        with self._lock:
            doomed, self._graveyard, self._hidden = [*self._graveyard, *self._hidden], [], []
        self._unlink(doomed)

    def _unlink(self, chunks: list[Chunk]) -> None:
        if self.directory is not None:
            for c in chunks:
                (self.directory / c.file).unlink(missing_ok=True)
