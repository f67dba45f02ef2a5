"""Prometheus remote-write 1.0 on the wire: ``prometheus.WriteRequest``, protobuf + snappy.

The message classes are built at import from a FileDescriptorProto that mirrors the upstream
``prompb/types.proto`` and ``prompb/remote.proto`` (same package, names and field numbers). Only the
fields gpuscope sends are declared (exemplars, histograms and metadata are not), which protobuf's
wire format allows: a reader skips what it does not know and we never set the rest.

Encoding is built for 10^5..10^6 samples a second. A WriteRequest is a concatenation of
length-delimited ``timeseries`` fields, and a series' labels change far less often than its
samples, so a request is assembled from parts: per series the *head* (field tag, length, and the
labels serialized by the protobuf library), cached by the caller, and per sample its ``samples``
field, built for a whole frame at once with numpy. Every series carries exactly one sample, which
keeps each part independent of the others (the same series may occur again later in the request,
in time order, which the protocol allows). The protobuf library parses the result into exactly the
messages it would have built itself (the tests check this against it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cramjam
import numpy as np
import numpy.typing as npt
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}

_F = descriptor_pb2.FieldDescriptorProto
_TIMESERIES_TAG = b"\x0a"  # WriteRequest.timeseries = 1, length-delimited
_SAMPLE_TAG = 0x12  # TimeSeries.samples = 2, length-delimited
_VALUE_TAG = 0x09  # Sample.value = 1, fixed64 (double)
_TIMESTAMP_TAG = 0x10  # Sample.timestamp = 2, varint (int64)


def _message(
    fd: descriptor_pb2.FileDescriptorProto, name: str, fields: list[tuple[str, int, int, int, str]]
) -> None:
    msg = fd.message_type.add(name=name)
    for fname, number, ftype, label, type_name in fields:
        field = msg.field.add(name=fname, number=number, type=ftype, label=label)
        if type_name:
            field.type_name = type_name


def _build() -> dict[str, Any]:
    fd = descriptor_pb2.FileDescriptorProto(
        name="gpuscope/prometheus_remote.proto", package="prometheus", syntax="proto3"
    )
    opt, rep = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    _message(fd, "Sample", [("value", 1, _F.TYPE_DOUBLE, opt, ""), ("timestamp", 2, _F.TYPE_INT64, opt, "")])
    _message(fd, "Label", [("name", 1, _F.TYPE_STRING, opt, ""), ("value", 2, _F.TYPE_STRING, opt, "")])
    _message(
        fd,
        "TimeSeries",
        [
            ("labels", 1, _F.TYPE_MESSAGE, rep, ".prometheus.Label"),
            ("samples", 2, _F.TYPE_MESSAGE, rep, ".prometheus.Sample"),
        ],
    )
    _message(fd, "WriteRequest", [("timeseries", 1, _F.TYPE_MESSAGE, rep, ".prometheus.TimeSeries")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prometheus.{name}"))
        for name in ("Sample", "Label", "TimeSeries", "WriteRequest")
    }


_CLASSES = _build()
WriteRequest: Any = _CLASSES["WriteRequest"]
TimeSeries: Any = _CLASSES["TimeSeries"]


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of an int64 (negative numbers as their 64-bit two's complement)."""
    n &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def sample_size(ts_ms: int) -> int:
    """Bytes of one ``samples`` field holding a sample at ``ts_ms`` (see :func:`samples`)."""
    return 12 + len(varint(ts_ms))


def series_head(labels: Sequence[tuple[str, str]], size: int) -> bytes:
    """The start of a ``timeseries`` field whose one sample takes ``size`` bytes: tag, length and
    the labels (sorted by name, as the protocol requires) serialized by the protobuf library.
    Raises ValueError for a label that is not valid UTF-8."""
    series = TimeSeries()
    for name, value in sorted(labels):
        series.labels.add(name=name, value=value)
    body: bytes = series.SerializeToString()
    return _TIMESERIES_TAG + varint(len(body) + size) + body


def samples(ts_ms: int, values: npt.NDArray[np.floating[Any]]) -> list[bytes]:
    """One ``samples`` field per value, all at ``ts_ms``, each :func:`sample_size` bytes. Both
    fields are always written (proto3 may leave out zeros; a reader reads the same either way)."""
    ts = varint(ts_ms)
    size = 12 + len(ts)
    rec = np.empty((len(values), size), dtype=np.uint8)
    rec[:, :3] = (_SAMPLE_TAG, size - 2, _VALUE_TAG)
    rec[:, 3:11] = np.ascontiguousarray(values, dtype="<f8").reshape(-1, 1).view(np.uint8)
    rec[:, 11] = _TIMESTAMP_TAG
    rec[:, 12:] = np.frombuffer(ts, dtype=np.uint8)
    out: list[bytes] = rec.view(f"V{size}").ravel().tolist()
    return out


def write_request(heads: Sequence[bytes], sample_fields: Sequence[bytes]) -> bytes:
    """A snappy-compressed (block format) ``WriteRequest`` of one series per sample: ``heads[i]``
    from :func:`series_head` followed by ``sample_fields[i]`` from :func:`samples`, whose size
    the head was built for."""
    parts: list[bytes] = [b""] * (2 * len(heads))
    parts[0::2] = heads
    parts[1::2] = sample_fields
    return bytes(cramjam.snappy.compress_raw(b"".join(parts)))


#: One series read back: its labels (``__name__`` included) and its (ms timestamp, value) samples.
Series = tuple[list[tuple[str, str]], list[tuple[int, float]]]


def decode(body: bytes) -> list[Series]:
    """A compressed ``WriteRequest`` as plain series (for tests and for debugging a capture)."""
    req = WriteRequest()
    req.ParseFromString(bytes(cramjam.snappy.decompress_raw(body)))
    return [
        ([(lbl.name, lbl.value) for lbl in ts.labels], [(s.timestamp, s.value) for s in ts.samples])
        for ts in req.timeseries
    ]
