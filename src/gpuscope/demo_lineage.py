"""The model team's side of a demo, told through the hub's lineage API as their tooling would.

The built-in story names model ``chat`` version ``v7`` serving ``chat-api``, but a hub that hears
only telemetry knows no lineage, and its Lineage page stayed empty. So before the run the demo
registers where each service's version came from (an earlier fine-tuning run and its checkpoint,
a day before), the version and its promotion, with the requests ``gpuscope lineage`` sends.
During the run rank 0's checkpoint reports carry a manifest hash, as the training SDK's
``run.save()`` reports do, so the hub records each checkpoint itself. A version the scenario
rolls out (``bad_version``, or its rollback) is registered from the newest checkpoint of a
training job and promoted through ``/api/v1/lineage/promotions``; the event that request emits
is the promotion detectors and pages read, so the simulator's own copy is not sent as well.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import httpx

from gpuscope.model import Batch, Event
from gpuscope.sim.scenario import JobSpec, Scenario

BASE = "/api/v1/lineage"
#: the step of the earlier run's checkpoint that the serving version was made from
ORIGIN_STEP = 4000
#: how long before the demo that history happened (the version has served for a day)
ORIGIN_AGE_S = 86400.0
PROMOTED = "model_version_promoted"


def manifest_hash(job: str, step: int) -> str:
    """What stands in for the SDK's manifest digest: 64 hex digits, one per checkpoint."""
    return hashlib.sha256(f"{job}/{step}".encode()).hexdigest()


def origin_run(service: JobSpec) -> str:
    """The earlier run the service's starting version was fine-tuned in."""
    return f"{service.model}-finetune"


class DemoLineage:
    """Registers a scenario's lineage on the hub ``client`` talks to; ``warn`` hears a refusal
    once (the demo plays on without lineage rather than stop)."""

    def __init__(self, client: httpx.Client, scenario: Scenario, warn: Callable[[str], None]) -> None:
        self.client = client
        self.warn = warn
        self.services = {j.name: j for j in scenario.jobs if j.kind == "inference" and j.model}
        self.newest: tuple[str, int] | None = None  # (job, step) of the newest checkpoint saved
        self.registered: set[tuple[str, str]] = set()
        self.refused = 0

    def _post(self, path: str, body: dict[str, Any]) -> bool:
        try:
            res = self.client.post(f"{BASE}/{path}", json=body)
        except httpx.HTTPError as exc:
            return self._refused(f"{path}: {exc}")
        if res.status_code == 200:
            return True
        try:
            message = str(res.json().get("error", res.text))
        except ValueError:
            message = res.text[:200]
        return self._refused(f"{path}: HTTP {res.status_code}: {message}")

    def _refused(self, why: str) -> bool:
        self.refused += 1
        if self.refused == 1:
            self.warn(f"lineage not recorded (the Lineage page will miss it): {why}")
        return False

    def start(self, now: float) -> None:
        """Each service's serving version with the run and checkpoint it came from, promoted."""
        before = now - ORIGIN_AGE_S
        for svc in self.services.values():
            run = origin_run(svc)
            meta = {"model": svc.model, "purpose": f"fine-tuning that produced {svc.model} {svc.version}"}
            self._post("runs", {"job": run, "meta": meta, "started_at": before - 2 * ORIGIN_AGE_S})
            if self._version(svc.model, svc.version, run, ORIGIN_STEP, before - 600.0):
                body = {"service": svc.name, "model": svc.model, "version": svc.version}
                self._post("promotions", body | {"alias": "champion", "at": before})

    def _version(self, model: str, version: str, job: str, step: int, at: float | None) -> bool:
        """Register ``model version`` from checkpoint ``(job, step)`` unless it already is."""
        if (model, version) in self.registered:
            return True
        checkpoint = {"job": job, "step": step, "manifest_hash": manifest_hash(job, step)}
        if not self._post("checkpoints", checkpoint | ({} if at is None else {"at": at - 3600.0})):
            return False
        body = {"model": model, "version": version, "job": job, "step": step}
        if not self._post("versions", body | ({} if at is None else {"at": at})):
            return False
        self.registered.add((model, version))
        return True

    def split(self, batch: Batch) -> tuple[Batch, list[Event]]:
        """``batch`` as the SDKs send it (rank 0's checkpoints with a manifest hash), and the
        promotions in it, which :meth:`promote` makes through the lineage API instead."""
        kept: list[Event] = []
        promotions: list[Event] = []
        for event in batch.events:
            if event.kind == PROMOTED and event.labels.get("service") in self.services:
                promotions.append(event)
                continue
            step = event.data.get("step")
            job = event.labels.get("job")
            rank0 = event.labels.get("rank") == "0"
            if event.kind == "checkpoint_completed" and rank0 and job and isinstance(step, int):
                data = event.data | {"manifest_hash": manifest_hash(job, step)}
                event = dataclasses.replace(event, data=data)
                self.newest = (job, step)
            kept.append(event)
        return dataclasses.replace(batch, events=kept), promotions

    def promote(self, promotions: list[Event]) -> None:
        """Each promotion the scenario makes, of a version made from the newest checkpoint."""
        for event in promotions:
            svc = self.services[event.labels["service"]]
            version = event.labels.get("version") or str(event.data.get("version", ""))
            job, step = self.newest or (origin_run(svc), ORIGIN_STEP)
            if self._version(svc.model, version, job, step, None):
                self._post("promotions", {"service": svc.name, "model": svc.model, "version": version})
