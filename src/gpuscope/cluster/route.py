"""Splitting a batch by where its parts are detected: each record goes to every destination
(this hub, or a peer) that owns one of its shards, and to each destination once."""

from __future__ import annotations

from collections.abc import Callable

from gpuscope.model import Batch, Frame, Labels

Place = Callable[[Labels], set[str]]


def split(batch: Batch, place: Place) -> dict[str, Batch]:
    """The parts of ``batch`` per destination named by ``place`` (labels -> destinations)."""
    out: dict[str, Batch] = {}

    def part(dest: str) -> Batch:
        if dest not in out:
            out[dest] = Batch(batch.source)
        return out[dest]

    for frame in batch.frames:
        rows: dict[str, list[int]] = {}
        for i, labels in enumerate(frame.entities):
            for dest in place(labels):
                rows.setdefault(dest, []).append(i)
        for dest, idx in rows.items():
            if len(idx) == len(frame.entities):
                part(dest).frames.append(frame)
            else:
                sub = Frame(frame.ts, frame.metrics, [frame.entities[i] for i in idx], frame.values[idx])
                part(dest).frames.append(sub)
    for event in batch.events:
        for dest in place(event.labels):
            part(dest).events.append(event)
    for record in batch.training:
        for dest in place({**record.labels, "job": record.job}):
            part(dest).training.append(record)
    return out
