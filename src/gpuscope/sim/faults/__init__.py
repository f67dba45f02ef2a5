"""Fault effects, one class per kind of DESIGN §4 (see :mod:`gpuscope.sim.faults.base`)."""

from __future__ import annotations

from gpuscope.sim.faults import hardware, service, workload
from gpuscope.sim.faults.base import EFFECTS, Effect, register
from gpuscope.sim.scenario import FaultSpec
from gpuscope.sim.world import World

__all__ = ["EFFECTS", "Effect", "make_effect", "register"]
_MODULES = (hardware, service, workload)  # imported for their registrations


def make_effect(fault: FaultSpec, world: World) -> Effect:
    return EFFECTS[fault.kind](fault, world)
