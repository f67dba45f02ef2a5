"""Allocator memory of a training rank, from ``torch.cuda.memory_stats``.

``nvidia-smi`` shows what the caching allocator reserved, not what the model uses: a job can OOM
with gigabytes "free" when its reserve is fragmented. These numbers say how close to that it is:
allocated vs reserved, the inactive split blocks that fragmentation leaves, allocator retries
(cudaMalloc failed and the cache was flushed: the step just got slow) and OOMs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

#: Metric names in training records (see :data:`gpuscope.signals.TRAINING_METRICS`).
ALLOCATED = "memory_allocated_bytes"
RESERVED = "memory_reserved_bytes"
FRAGMENTATION = "memory_fragmentation_ratio"
INACTIVE_SPLIT = "memory_inactive_split_bytes"
RETRIES = "alloc_retries_total"
OOMS = "alloc_ooms_total"
PEAK_ALLOCATED = "memory_peak_allocated_bytes"


def memory_metrics(stats: Mapping[str, Any]) -> dict[str, float]:
    """Training-record metrics from one ``torch.cuda.memory_stats()`` dictionary."""
    allocated = float(stats.get("allocated_bytes.all.current", 0))
    reserved = float(stats.get("reserved_bytes.all.current", 0))
    return {
        ALLOCATED: allocated,
        RESERVED: reserved,
        FRAGMENTATION: (1.0 - allocated / reserved) if reserved > 0 else 0.0,
        INACTIVE_SPLIT: float(stats.get("inactive_split_bytes.all.current", 0)),
        RETRIES: float(stats.get("num_alloc_retries", 0)),
        OOMS: float(stats.get("num_ooms", 0)),
        PEAK_ALLOCATED: float(stats.get("allocated_bytes.all.peak", 0)),
    }


def cuda_memory_sampler(device: int) -> Callable[[], dict[str, float]] | None:
    """A sampler of ``device``'s allocator, or None when the process has no CUDA.

    torch is only consulted if the training code already imported it, so a job without torch
    never pays for importing it. ``memory_stats`` takes the allocator's lock, so sampling from
    the SDK's thread is safe and keeps the cost off the training thread.
    """
    torch: Any = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    count = int(torch.cuda.device_count())
    if count == 0:
        return None
    index = device if device < count else 0  # one visible GPU per process: it is device 0

    def sample() -> dict[str, float]:
        return memory_metrics(torch.cuda.memory_stats(index))

    return sample
