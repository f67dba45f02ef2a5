"""Where the evaluations read real traces unless ``--data DIR`` says otherwise: ../shared/data
beside the checkout. An evaluation whose traces are not there prints SKIP and exits 0."""

from __future__ import annotations

from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
