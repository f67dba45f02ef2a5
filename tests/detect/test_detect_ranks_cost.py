"""RankDetector's cheaper per-rank arithmetic gives bit for bit what numpy gave."""

from __future__ import annotations

import numpy as np

from gpuscope.detect.ranks import _median


def test_small_median_is_bit_for_bit_numpys_median() -> None:
    rng = np.random.default_rng(11)
    for n in range(1, 14):
        for scale in (1e-9, 0.03, 1.0, 7e5):
            for _ in range(200):
                values = (scale * rng.standard_normal(n)).tolist()
                if rng.random() < 0.3:
                    values[-1] = values[0]  # ties
                assert _median(values).hex() == float(np.median(values)).hex()
