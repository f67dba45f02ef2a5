"""Parquet files joined row group by row group, without decoding a value.

The hourly merge of one-minute pieces used to read every row back and encode it again (DuckDB's
``COPY``), which held about four copies of a row group and lifted a 64-node hub's RSS by ~100 MiB
for seconds. Each piece is ordered by entity already, so the merged file only needs the pieces'
row groups one after another: their bytes are copied as they are (through a bounded buffer), and
the footer is the first piece's with every piece's row-group metadata appended, each offset
shifted by where that piece's bytes now start.

The footer is Thrift's compact protocol. It is parsed into a generic tree that keeps every field,
known or not, so that statistics, encodings, bloom filters and page indexes (all inside the copied
bytes) survive; only the offsets into the file, the row groups' ordinals and the row count change.
Files that do not share one schema (a metric that appeared within the hour) are not joined here:
:func:`concat` raises :class:`NotJoinable` and the caller merges them by decoding.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAGIC = b"PAR1"
#: bytes copied at a time: the merge's memory, whatever the size of the pieces
COPY_BUFFER = 1 << 20

# Thrift compact protocol types
_TRUE, _FALSE, _I8, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)

# Parquet's FileMetaData / RowGroup / ColumnChunk / ColumnMetaData field ids (parquet.thrift)
_FMD_SCHEMA, _FMD_NUM_ROWS, _FMD_ROW_GROUPS = 2, 3, 4
_FMD_ENCRYPTION = 8
_RG_COLUMNS, _RG_FILE_OFFSET, _RG_ORDINAL = 1, 5, 7
_CC_FILE_PATH, _CC_FILE_OFFSET, _CC_META, _CC_OFFSET_INDEX, _CC_COLUMN_INDEX = 1, 2, 3, 4, 6
_CC_ENCRYPTED_META = 9
#: ColumnMetaData: data_page_offset, index_page_offset, dictionary_page_offset, bloom_filter_offset
_CMD_OFFSETS = (9, 10, 11, 14)


class NotJoinable(Exception):
    """The files cannot be joined without decoding them (different schemas, encrypted, external
    column chunks)."""


@dataclass(slots=True)
class Field:
    fid: int
    ctype: int
    value: object  # int, bool, bytes (binary, double), Struct, List, or Encoded (a list)


@dataclass(slots=True)
class List:
    etype: int
    items: list[object]


@dataclass(slots=True)
class Encoded:
    """A list whose items are encoded already: written as its header and these bytes."""

    etype: int
    count: int
    body: bytes | bytearray


@dataclass(slots=True)
class Struct:
    fields: list[Field]

    def get(self, fid: int) -> Field | None:
        return next((f for f in self.fields if f.fid == fid), None)

    def struct(self, fid: int) -> Struct:
        f = self.get(fid)
        if f is None or not isinstance(f.value, Struct):
            raise NotJoinable(f"Parquet footer: field {fid} is not a struct")
        return f.value

    def items(self, fid: int) -> list[object]:
        f = self.get(fid)
        if f is None or not isinstance(f.value, List):
            raise NotJoinable(f"Parquet footer: field {fid} is not a list")
        return f.value.items

    def set_int(self, fid: int, value: int, ctype: int) -> None:
        f = self.get(fid)
        if f is None:
            self.fields.append(Field(fid, ctype, value))
            self.fields.sort(key=lambda x: x.fid)
        else:
            f.value = value


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def byte(self) -> int:
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise NotJoinable("Parquet footer is truncated")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def value(self, ctype: int) -> object:
        if ctype in (_TRUE, _FALSE):  # inside a list: one byte each
            return self.byte() == _TRUE
        if ctype == _I8:
            return struct.unpack("b", self.take(1))[0]
        if ctype in (_I16, _I32, _I64):
            return self.zigzag()
        if ctype == _DOUBLE:
            return self.take(8)
        if ctype == _BINARY:
            return self.take(self.varint())
        if ctype in (_LIST, _SET):
            head = self.byte()
            size, etype = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            return List(etype, [self.value(etype) for _ in range(size)])
        if ctype == _STRUCT:
            return self.struct()
        raise NotJoinable(f"Parquet footer: unsupported Thrift type {ctype}")  # maps: not in Parquet

    def struct(self) -> Struct:
        fields: list[Field] = []
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return Struct(fields)
            delta, ctype = head >> 4, head & 0x0F
            fid = last + delta if delta else self.zigzag()
            value: object = ctype == _TRUE if ctype in (_TRUE, _FALSE) else self.value(ctype)
            fields.append(Field(fid, ctype, value))
            last = fid


def _varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(out: bytearray, n: int) -> None:
    _varint(out, (n << 1) ^ (n >> 63))


def _write_value(out: bytearray, ctype: int, value: object) -> None:
    if ctype in (_TRUE, _FALSE):
        out.append(_TRUE if value else _FALSE)
    elif ctype == _I8:
        assert isinstance(value, int)
        out += struct.pack("b", value)
    elif ctype in (_I16, _I32, _I64):
        assert isinstance(value, int)
        _zigzag(out, value)
    elif ctype == _DOUBLE:
        assert isinstance(value, bytes)
        out += value
    elif ctype == _BINARY:
        assert isinstance(value, bytes)
        _varint(out, len(value))
        out += value
    elif ctype in (_LIST, _SET):
        assert isinstance(value, List | Encoded)
        n = value.count if isinstance(value, Encoded) else len(value.items)
        if n < 15:
            out.append(n << 4 | value.etype)
        else:
            out.append(0xF0 | value.etype)
            _varint(out, n)
        if isinstance(value, Encoded):
            out += value.body
            return
        for item in value.items:
            _write_value(out, value.etype, item)
    else:
        assert isinstance(value, Struct)
        _write_struct(out, value)


def _write_struct(out: bytearray, s: Struct) -> None:
    last = 0
    for f in s.fields:
        ctype = (_TRUE if f.value else _FALSE) if f.ctype in (_TRUE, _FALSE) else f.ctype
        delta = f.fid - last
        if 0 < delta <= 15:
            out.append(delta << 4 | ctype)
        else:
            out.append(ctype)
            _zigzag(out, f.fid)
        if ctype not in (_TRUE, _FALSE):
            _write_value(out, ctype, f.value)
        last = f.fid
    out.append(0)


def encode(s: Struct) -> bytes:
    out = bytearray()
    _write_struct(out, s)
    return bytes(out)


def decode(buf: bytes) -> Struct:
    return _Reader(buf).struct()


def read_footer(f: BinaryIO) -> tuple[Struct, int]:
    """The file's FileMetaData, and where it starts (the end of the row groups' bytes)."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if size < 12:
        raise NotJoinable("not a Parquet file: too short")
    f.seek(size - 8)
    tail = f.read(8)
    length = struct.unpack("<I", tail[:4])[0]
    f.seek(0)
    if tail[4:] != MAGIC or f.read(4) != MAGIC or length > size - 12:
        raise NotJoinable("not a Parquet file (plain, unencrypted)")
    start = size - 8 - length
    f.seek(start)
    return decode(f.read(length)), start


def _shift(rg: Struct, by: int, ordinal: int) -> Struct:
    for item in rg.items(_RG_COLUMNS):
        assert isinstance(item, Struct)
        if item.get(_CC_FILE_PATH) is not None or item.get(_CC_ENCRYPTED_META) is not None:
            raise NotJoinable("column chunks in other files or encrypted")
        for fid in (_CC_FILE_OFFSET, _CC_OFFSET_INDEX, _CC_COLUMN_INDEX):
            f = item.get(fid)
            if f is not None and isinstance(f.value, int) and f.value:  # DuckDB writes file_offset 0
                f.value += by
        meta = item.struct(_CC_META)
        for fid in _CMD_OFFSETS:
            f = meta.get(fid)
            if f is not None and isinstance(f.value, int):
                f.value += by
    f = rg.get(_RG_FILE_OFFSET)
    if f is not None and isinstance(f.value, int):
        f.value += by
    rg.set_int(_RG_ORDINAL, ordinal, _I16)
    return rg


def concat(sources: list[Path], target: BinaryIO) -> int:
    """Write ``sources``' row groups, in order, as one Parquet file to ``target``; its row count.

    Raises :class:`NotJoinable` before writing anything if the sources do not share one schema.

    One footer's tree is held at a time: each file's row groups are shifted and encoded as they
    are read, and only their bytes kept. Holding every file's tree until the end (an hour's merge
    of 60 files of 53 columns: ~20 MiB of small objects for seconds, once an hour) grew the
    interpreter's arenas in a serving hub, which keeps them while anything allocated beside lives
    (docs/scaling.md (d))."""
    head: Struct | None = None  # the first file's footer, less its row groups: the joined one's
    schema = b""
    groups = bytearray()  # every row group, shifted and encoded
    count = rows = by = 0
    ends: list[int] = []
    for path in sources:
        with path.open("rb") as f:
            meta, end = read_footer(f)
        if head is None:
            first = meta.get(_FMD_SCHEMA) or Field(_FMD_SCHEMA, _LIST, List(_STRUCT, []))
            head, schema = meta, encode(Struct([first]))
        if meta.get(_FMD_ENCRYPTION) is not None:
            raise NotJoinable("encrypted footer")
        if encode(Struct([f for f in meta.fields if f.fid == _FMD_SCHEMA])) != schema:
            raise NotJoinable("the files' schemas differ")
        for rg in meta.items(_FMD_ROW_GROUPS):
            assert isinstance(rg, Struct)
            _write_struct(groups, _shift(rg, by, count))
            count += 1
        num = meta.get(_FMD_NUM_ROWS)
        rows += num.value if num is not None and isinstance(num.value, int) else 0
        ends.append(end)
        by += end - len(MAGIC)
        rgs = meta.get(_FMD_ROW_GROUPS)
        assert rgs is not None
        rgs.value = List(_STRUCT, [])  # encoded above: the tree of the head need not keep them
    assert head is not None
    target.write(MAGIC)
    buf = bytearray(COPY_BUFFER)
    view = memoryview(buf)
    for path, end in zip(sources, ends, strict=True):
        with path.open("rb") as f:
            f.seek(len(MAGIC))
            left = end - len(MAGIC)
            while left:
                n = f.readinto(view[: min(left, COPY_BUFFER)])
                if not n:
                    raise NotJoinable(f"{path.name} ended early")
                target.write(view[:n])
                left -= n
    head.set_int(_FMD_NUM_ROWS, rows, _I64)
    rgs = head.get(_FMD_ROW_GROUPS)
    assert rgs is not None
    rgs.value = Encoded(_STRUCT, count, groups)
    footer = encode(head)
    target.write(footer)
    target.write(struct.pack("<I", len(footer)))
    target.write(MAGIC)
    return rows
