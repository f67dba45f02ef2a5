"""Who holds each GPU by allocation, and the team of each pod: the owner identity the agent reports.

The kubelet collector (and dcgm-exporter's pod mapping) report a ``gpu_owner_allocated`` row per pod
holding a GPU, labelled ``pod`` (``namespace/name``) and, from the pod's metadata
(:mod:`gpuscope.kube.metadata`: a pod label, from the API server), ``team``. A GPU frame names the
pod using the GPU the same way (:mod:`gpuscope.collect.podresources`), so the pod's team is found
from either; a GPU that is held but runs nothing still has its holder's team.

A frame that lists a node's allocatable GPUs (the kubelet's) is the node's whole allocation: its
GPUs without an owner row are free. Otherwise a holding lapses ``STALE_S`` after it was last reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.model import FloatArray, Frame

STALE_S = 60.0
#: pod -> team entries kept at most; beyond, those of pods holding nothing now are dropped
MAX_PODS = 10_000


@dataclass(frozen=True, slots=True)
class Holding:
    ts: float
    pods: frozenset[str]
    teams: frozenset[str]


class Holders:
    def __init__(self) -> None:
        self.gpus: dict[tuple[str, str], Holding] = {}
        self.pod_team: dict[str, str] = {}

    def observe(self, frame: Frame, held: FloatArray) -> None:
        allocatable = frame.column("gpu_allocatable")
        whole = {
            e.get("node", "")
            for i, e in enumerate(frame.entities)
            if allocatable is not None and allocatable[i] > 0
        }
        if whole:
            self.gpus = {k: v for k, v in self.gpus.items() if k[0] not in whole}
        rows: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
        for i, labels in enumerate(frame.entities):
            node, gpu = labels.get("node"), labels.get("gpu")
            if node is None or gpu is None or not held[i] > 0:
                continue
            pods, teams = rows.setdefault((node, gpu), (set(), set()))
            pod, team = labels.get("pod", ""), labels.get("team", "")
            if pod:
                pods.add(pod)
                if team:
                    self.pod_team[pod] = team
            if team:
                teams.add(team)
        for key, (pods, teams) in rows.items():
            self.gpus[key] = Holding(frame.ts, frozenset(pods), frozenset(teams))
        if len(self.pod_team) > MAX_PODS:
            current = {p for h in self.gpus.values() for p in h.pods}
            self.pod_team = {p: t for p, t in self.pod_team.items() if p in current}

    def _holding(self, node: str, gpu: str, ts: float) -> Holding | None:
        h = self.gpus.get((node, gpu))
        return h if h is not None and ts - h.ts <= STALE_S else None

    def held(self, node: str, gpu: str, ts: float) -> bool:
        return self._holding(node, gpu, ts) is not None

    def team(self, node: str, gpu: str, pod: str, ts: float) -> str:
        """The team of the pod using the GPU, else of the one team holding it; '' when unknown."""
        if pod in self.pod_team:
            return self.pod_team[pod]
        h = self._holding(node, gpu, ts)
        if h is not None and len(h.teams) == 1:
            (team,) = h.teams
            return team
        return ""
