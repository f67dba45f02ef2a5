"""The built-in fault scenarios run to the end (a module of its own: together they take minutes, and
a module is one unit of work for the test workers)."""

from __future__ import annotations

import pytest

from gpuscope.ingest.payload import decode_json, encode_batch, parse_batch
from gpuscope.sim import Simulator, builtin_names, builtin_scenario, load_scenario

pytestmark = pytest.mark.long


#: the 2- and 3-hour mixes are simulated and scored whole by ``make eval`` (eval/eval_families.py MIXES)
MIXES = ("hardware-mix", "service-mix", "training-mix")


@pytest.mark.parametrize("name", [n for n in builtin_names() if n not in ("healthy-3h", "demo", *MIXES)])
def test_builtin_fault_scenarios_run_to_the_end(name: str) -> None:
    scenario = load_scenario(builtin_scenario(name))
    ticks = 0
    for tick in Simulator(scenario).ticks():
        ticks += 1
        if ticks % 97 == 0:  # a sample of the batches through the wire format
            for batch in [*tick.node_batches.values(), *tick.sdk_batches]:
                parse_batch(decode_json(encode_batch(batch)))
    assert ticks == scenario.duration / scenario.interval
