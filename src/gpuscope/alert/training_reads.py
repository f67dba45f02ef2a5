"""A job's training records for playbook checks, read a slice of time at a time.

A check that asked the store for a job's last 10 minutes at once held every record as Python
objects (a record, its metrics and its labels: three objects and a dozen floats each) to keep a
few figures per rank: for a job of 128 ranks (the load generator's, ~85 records a second) that
was 51,200 records and ~73 MiB of small objects for about a second. The interpreter's allocator
keeps each 1-MiB arena such a burst filled for as long as any object allocated beside it lives,
and a serving hub allocates all the while (ingest, evaluation): in a 2-hour soak one
``training_stalled`` playbook left the hub's arenas 27 MiB larger for good (docs/scaling.md,
(d)). Read in slices of about :data:`SLICE_RECORDS`, a check holds one slice at a time.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuscope.model import TrainingRecord
from gpuscope.store.base import RecordStore

#: records a slice aims at (a slice's width follows the rate of the slice before it)
SLICE_RECORDS = 2_000
#: the first slice's width, and the bounds of every slice's, in seconds: a slice after an empty
#: one grows, but never so much that a dense one after it would hold the whole window
FIRST_SLICE_S = 10.0
MIN_SLICE_S = 1.0
MAX_SLICE_S = 60.0


def training_slices(
    store: RecordStore, job: str, start: float, end: float, limit: int
) -> Iterator[list[TrainingRecord]]:
    """The records ``store.training(job, start, end, None, limit)`` returns (the newest ``limit``
    of ``[start, end]``), in slices of time read back from ``end``: the newest slice first, each
    slice oldest first, as the store orders them. A slice covers ``(lo, hi]`` (the last one
    ``[start, hi]``), so no record is read twice."""
    need, hi, width = limit, end, FIRST_SLICE_S
    while need > 0 and hi >= start:
        lo = max(start, hi - width)
        got = store.training(job, lo, hi, None, need)
        if lo > start:
            got = [r for r in got if r.ts > lo]  # a record at lo belongs to the next slice
        if got:
            yield got
            need -= len(got)
        if lo <= start:
            return
        width = min(max(width * SLICE_RECORDS / max(len(got), 1), MIN_SLICE_S), MAX_SLICE_S)
        hi = lo
