"""The GPUs and nodes with a live hardware finding, as of the engine's last evaluation.

A training rank that slows down because its own GPU is throttled, slow or failing has a cause
that another rule already names (``gpu_thermal_throttle``, ``gpu_underperforming``, an ECC
storm ...); the rank rules read this to tell such a slowdown from the rank's placement. The engine
updates it after every evaluation from all findings of the hardware layer (:mod:`gpuscope.rules`),
so a step rule sees the hardware as it stood one tick before.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuscope.model import Finding, Labels
from gpuscope.rules import rules_of

HARDWARE = rules_of("hardware")


class HardwareFaults:
    """Which GPUs (node, gpu) and whole nodes have a live hardware finding."""

    def __init__(self) -> None:
        self._gpus: frozenset[tuple[str, str]] = frozenset()
        self._nodes: frozenset[str] = frozenset()

    def update(self, findings: Iterable[Finding]) -> None:
        """The findings of one evaluation (any rules: those of other layers are passed over)."""
        gpus: set[tuple[str, str]] = set()
        nodes: set[str] = set()
        for finding in findings:
            node = finding.entity.get("node")
            if finding.rule not in HARDWARE or node is None:
                continue
            gpu = finding.entity.get("gpu")
            if gpu is None:
                nodes.add(node)  # a node-wide fault (its network, the node itself) slows every GPU
            else:
                gpus.add((node, gpu))
        self._gpus, self._nodes = frozenset(gpus), frozenset(nodes)

    def on(self, place: Labels) -> bool:
        """Does the GPU of ``place`` (labels ``node`` and ``gpu``) have a live hardware finding?"""
        node = place.get("node")
        if node is None:
            return False
        return node in self._nodes or (node, place.get("gpu", "")) in self._gpus
