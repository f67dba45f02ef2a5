"""Allocator metrics from a ``torch.cuda.memory_stats()`` dictionary (keys as torch 2.13 names them)."""

from __future__ import annotations

import pytest

from gpuscope.sdk.memory import cuda_memory_sampler, memory_metrics
from gpuscope.signals import TRAINING_METRICS

#: the keys memory_metrics reads, with values from a fragmented 80 GB reserve
STATS = {
    "allocated_bytes.all.current": 30 * 2**30,
    "allocated_bytes.all.peak": 52 * 2**30,
    "reserved_bytes.all.current": 40 * 2**30,
    "inactive_split_bytes.all.current": 6 * 2**30,
    "num_alloc_retries": 3,
    "num_ooms": 1,
}


def test_memory_metrics() -> None:
    m = memory_metrics(STATS)
    assert m["memory_fragmentation_ratio"] == pytest.approx(0.25)
    assert m["memory_inactive_split_bytes"] == 6 * 2**30
    assert (m["alloc_retries_total"], m["alloc_ooms_total"]) == (3.0, 1.0)
    for name in ("memory_allocated_bytes", "memory_reserved_bytes", "memory_fragmentation_ratio"):
        assert name in TRAINING_METRICS and name in m
    assert memory_metrics({})["memory_fragmentation_ratio"] == 0.0  # nothing reserved yet


def test_no_cuda_means_no_sampler() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        assert cuda_memory_sampler(0) is not None
        assert "memory_reserved_bytes" in cuda_memory_sampler(0)()  # type: ignore[misc]
    else:
        assert cuda_memory_sampler(0) is None
