"""The written straggler rule of eval/eval_replay_traces.py counts each reading once: a sample whose
value equals the worker's last one is that reading logged again (the real per-worker logs repeat
28-60 % of their samples as exact copies of a noisy value). A minute of one slow reading logged
again is no episode; three slow readings over a minute are one; the third round's rule, scored
beside it, counted every sample."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

EVAL = Path(__file__).resolve().parent.parent / "eval"
WORKERS, SAMPLES, EVERY, SLOW = 6, 120, 10, 80


def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EVAL))
    return importlib.import_module("eval_replay_traces")


def times(slow: list[float]) -> dict[int, dict[int, float]]:
    """Six workers at about 400 (1 % noise, every reading new); worker 2 reads ``slow`` from
    sample ``SLOW`` on, one value a sample."""
    rng = np.random.default_rng(3)
    values = np.round(400.0 * (1.0 + 0.01 * rng.standard_normal((SAMPLES, WORKERS))), 3)
    values[SLOW : SLOW + len(slow), 2] = slow
    return {k * EVERY: {w: float(values[k, w]) for w in range(WORKERS)} for k in range(SAMPLES)}


def episodes(module: ModuleType, by: dict[int, dict[int, float]], readings: bool) -> list[float]:
    runs = module.truth(by, float(EVERY), readings=readings)[2]
    return [r.start for r in runs if r.must]


def test_one_slow_reading_logged_again_for_a_minute_is_no_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    module = script(monkeypatch)
    by = times([520.0] * 7)  # one reading at 1.3x, seven samples
    assert episodes(module, by, readings=True) == []
    assert episodes(module, by, readings=False) == [SLOW * EVERY]  # the third round's rule


def test_three_slow_readings_over_a_minute_are_an_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    module = script(monkeypatch)
    by = times([520.0, 520.0, 530.0, 530.0, 525.0, 525.0, 525.0])  # three readings at 1.3x
    assert episodes(module, by, readings=True) == [SLOW * EVERY]
    assert episodes(module, by, readings=False) == [SLOW * EVERY]


def test_a_copy_is_told_from_a_new_reading_per_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    module = script(monkeypatch)
    by = {0: {0: 1.0, 1: 2.0, 2: 3.0}, 10: {0: 1.0, 1: 2.5, 2: 3.0}, 20: {0: 1.5, 1: 2.5, 2: 3.0}}
    new = module.fresh(by)
    assert [new[0][s] for s in (0, 10, 20)] == [True, False, True]
    assert [new[1][s] for s in (0, 10, 20)] == [True, True, False]
    assert [new[2][s] for s in (0, 10, 20)] == [True, False, False]
