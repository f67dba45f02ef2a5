"""The cluster simulator: scenario files, a simulated cluster with its workloads, fault injection.

``Simulator(load_scenario(builtin_scenario("demo"))).ticks()`` yields, per sampling interval,
the batches real node agents and training/inference SDKs would send (DESIGN §4 and the signal
contract), so the demo, the tests and ``sim-eval`` exercise the same ingest and detectors as a
real cluster.
"""

from gpuscope.sim.builtin import builtin_names, builtin_scenario
from gpuscope.sim.cluster import Simulator, Tick
from gpuscope.sim.kinds import FAULT_KINDS
from gpuscope.sim.scenario import (
    ClusterSpec,
    FaultSpec,
    JobSpec,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
)

__all__ = [
    "FAULT_KINDS",
    "ClusterSpec",
    "FaultSpec",
    "JobSpec",
    "Scenario",
    "ScenarioError",
    "Simulator",
    "Tick",
    "builtin_names",
    "builtin_scenario",
    "load_scenario",
    "parse_scenario",
]
