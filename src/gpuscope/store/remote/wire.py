"""Prometheus remote-write 1.0 on the wire: ``prometheus.WriteRequest``, protobuf + snappy.

The message classes are built at import from a FileDescriptorProto that mirrors the upstream
``prompb/types.proto`` and ``prompb/remote.proto`` (same package, names and field numbers), so the
protobuf runtime does all encoding and no generated code or code generator is needed. Only the
fields gpuscope sends are declared (exemplars, histograms and metadata are not), which protobuf's
wire format allows: a reader skips what it does not know and we never set the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import cramjam
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}

_F = descriptor_pb2.FieldDescriptorProto


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

#: One series for the wire: its labels (``__name__`` included) and its (ms timestamp, value) samples.
Series = tuple[Sequence[tuple[str, str]], Sequence[tuple[int, float]]]


def _is_sorted(items: Sequence[tuple[Any, Any]]) -> bool:
    return all(items[i][0] < items[i + 1][0] for i in range(len(items) - 1))


def encode(series: Iterable[Series]) -> bytes:
    """A snappy-compressed (block format) ``WriteRequest``. Labels are sent sorted by name and each
    series' samples in time order, as the protocol requires."""
    req = WriteRequest()
    for labels, samples in series:
        ts = req.timeseries.add()
        for name, value in labels if _is_sorted(labels) else sorted(labels):
            ts.labels.add(name=name, value=value)
        for t, v in samples if _is_sorted(samples) else sorted(samples):
            ts.samples.add(timestamp=t, value=v)
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


def decode(body: bytes) -> list[Series]:
    """The inverse of :func:`encode` (for tests and for debugging a capture)."""
    req = WriteRequest()
    req.ParseFromString(bytes(cramjam.snappy.decompress_raw(body)))
    return [
        ([(lbl.name, lbl.value) for lbl in ts.labels], [(s.timestamp, s.value) for s in ts.samples])
        for ts in req.timeseries
    ]
