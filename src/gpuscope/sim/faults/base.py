"""The fault-effect seam: one class per fault kind, registered by name.

An effect has three moments: :meth:`Effect.begin` at onset (one-off consequences: driver
events, dead processes), :meth:`Effect.apply` whenever conditions are rebuilt while it is
active (ongoing consequences: heat, lost GPU, slow rank), :meth:`Effect.advance` every tick
(consequences that grow over time), and :meth:`Effect.finish` when its
``duration`` ends (recovery that needs more than dropping the conditions, e.g. a restart).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from gpuscope.sim.inference import InferenceService
from gpuscope.sim.scenario import FaultSpec
from gpuscope.sim.training import TrainingJob
from gpuscope.sim.world import World


class Effect:
    kinds: ClassVar[tuple[str, ...]] = ()

    def __init__(self, fault: FaultSpec, world: World) -> None:
        self.fault = fault
        self.world = world

    def begin(self, t: float) -> None:
        """One-off consequences at onset."""

    def apply(self) -> None:
        """Ongoing consequences, set into the world's conditions."""

    def advance(self, t: float) -> None:
        """Consequences that develop with time (a part wearing out), every tick while active."""

    def finish(self, t: float) -> None:
        """Recovery when the fault's duration ends."""
        self.world.fault_cleared(self.fault.index)

    # -- helpers for target lookups ---------------------------------------------------------------

    @property
    def gpu_index(self) -> int:
        node, gpu = self.fault.node, self.fault.gpu
        assert node is not None and gpu is not None, "GPU faults target a node and a GPU"
        return self.world.gpu(node, gpu)

    @property
    def node_index(self) -> int:
        assert self.fault.node is not None, "node faults target a node"
        return self.world.node_pos[self.fault.node]

    @property
    def job(self) -> TrainingJob:
        name = self.fault.job
        assert name is not None and name in self.world.jobs, "the parser checked the job is a training job"
        return self.world.jobs[name]

    @property
    def workload(self) -> TrainingJob | InferenceService:
        name = self.fault.job or self.fault.service
        assert name is not None, "job faults target a job"
        return self.world.jobs[name] if name in self.world.jobs else self.world.services[name]

    @property
    def service(self) -> InferenceService:
        name = self.fault.service
        assert name is not None and name in self.world.services, "the parser checked the service"
        return self.world.services[name]

    @property
    def rank(self) -> int:
        rank = self.fault.rank
        assert rank is not None, "rank faults target a rank"
        return rank

    def param(self, name: str) -> float:
        return float(self.fault.params[name])


EFFECTS: dict[str, type[Effect]] = {}


def register(cls: type[Effect]) -> type[Effect]:
    for kind in cls.kinds:
        EFFECTS[kind] = cls
    return cls


EffectFactory = Callable[[FaultSpec, World], Effect]
