"""bench/common.py: what the benchmarks assume of the hub process they start."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.store.settings import StorageSettings
from support import load_script

COMMON = Path(__file__).resolve().parents[1] / "bench" / "common.py"


common = load_script(COMMON, "bench_common")


def test_the_hub_commit_interval_is_that_of_the_config_the_started_hub_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_hub_cpu waits this long after its last tick: a hub run with $GPUSCOPE_CONFIG commits
    at that file's interval, not at the default's."""
    monkeypatch.delenv("GPUSCOPE_CONFIG", raising=False)
    assert common.hub_flush_interval_s() == StorageSettings().flush_interval_s
    config = tmp_path / "hub.yaml"
    config.write_text("storage:\n  flush_interval_s: 1.5\n")
    monkeypatch.setenv("GPUSCOPE_CONFIG", str(config))
    assert common.hub_flush_interval_s() == 1.5 != StorageSettings().flush_interval_s
