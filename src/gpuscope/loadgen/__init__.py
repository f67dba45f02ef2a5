"""A load generator that behaves like a fleet of agents and training SDKs (``gpuscope loadgen``).

It plays a simulated cluster in real time over HTTP into one or more hubs, one in-order stream
per agent and SDK process, retrying until every batch is acknowledged, and measures what a hub
must sustain: samples/s, drops, request latency, hub CPU and memory, and the time to detect faults
injected during the load. ``bench/bench_load.py`` runs it against hubs it starts itself.
"""

from gpuscope.loadgen.run import LoadOptions, LoadReport, run_load
from gpuscope.loadgen.traffic import FleetShape, build_scenario, default_faults

__all__ = ["FleetShape", "LoadOptions", "LoadReport", "build_scenario", "default_faults", "run_load"]
