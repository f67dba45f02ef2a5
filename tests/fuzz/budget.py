"""Hypothesis profiles of the fuzz tests, and a count of the inputs each parser was given.

``gpuscope-ci`` (loaded on import) keeps the property tests inside their share of ``make test``;
bench/bench_fuzz.py loads ``gpuscope-long`` and reads :data:`TRIED` for its table.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings

settings.register_profile(
    "gpuscope-ci",
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,  # the same inputs on every run: a failure in CI is a failure here
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "gpuscope-long",
    max_examples=3000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("gpuscope-ci")

#: parser -> inputs tried, across the tests that feed it
TRIED: Counter[str] = Counter()
