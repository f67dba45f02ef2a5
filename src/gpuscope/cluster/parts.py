"""Several forwarded batch parts in one request body (``application/vnd.gpuscope.frames``).

A peer's sender thread takes every part queued for a hub while its previous request was in
flight and posts them at once: one HTTP round trip, one event-loop turn and one worker-thread hop
on each side for dozens of parts instead of one each, and each part as the binary frame agents
send (:mod:`gpuscope.ingest.frame`), which both sides encode and decode with a few numpy calls
instead of building and parsing JSON text. Layout: per part a little-endian ``u32`` length, then
that many bytes of frame. The observe endpoint still takes one JSON batch (``application/json``)
from a peer of an older version.
"""

from __future__ import annotations

import struct

from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.ingest.payload import DEFAULT_LIMITS, Limits, PayloadError
from gpuscope.model import Batch

CONTENT_TYPE = "application/vnd.gpuscope.frames"
#: parts of at most this many bytes together go in one request (one larger part goes alone)
MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: and at most this many parts
MAX_REQUEST_PARTS = 512
_LEN = struct.Struct("<I")


def encode_parts(parts: list[bytes]) -> bytes:
    """One body of already encoded parts (:func:`encode_part`)."""
    return b"".join(_LEN.pack(len(p)) + p for p in parts)


def encode_part(part: Batch) -> bytes:
    return encode_frame(part)


def decode_parts(body: bytes, limits: Limits = DEFAULT_LIMITS) -> list[Batch]:
    """Every part of ``body``, validated, or :class:`PayloadError` naming the first bad one (then
    none is taken)."""
    out: list[Batch] = []
    pos = 0
    while pos < len(body):
        if len(out) >= MAX_REQUEST_PARTS:
            raise PayloadError("parts", f"more than {MAX_REQUEST_PARTS} parts in one request")
        if pos + _LEN.size > len(body):
            raise PayloadError(f"parts[{len(out)}]", f"length cut short at byte {pos}")
        (n,) = _LEN.unpack_from(body, pos)
        pos += _LEN.size
        if pos + n > len(body):
            raise PayloadError(f"parts[{len(out)}]", f"{n} bytes announced, {len(body) - pos} left")
        try:
            out.append(decode_frame(body[pos : pos + n], limits))
        except PayloadError as exc:
            raise PayloadError(f"parts[{len(out)}].{exc.field}", exc.message) from None
        pos += n
    return out
