"""Inference-service faults: slow or failing requests, queues, KV cache, bad versions, model quality."""

from __future__ import annotations

import re

from gpuscope.sim.faults.base import Effect, register


@register
class LatencySpike(Effect):
    kinds = ("latency_spike",)

    def apply(self) -> None:
        self.service.cond.latency *= self.param("factor")


@register
class TtftRegression(Effect):
    kinds = ("ttft_regression",)

    def apply(self) -> None:
        self.service.cond.ttft *= self.param("factor")


@register
class ErrorBurst(Effect):
    kinds = ("error_burst",)

    def apply(self) -> None:
        self.service.cond.error += self.param("error_rate")


@register
class QueueBuildup(Effect):
    """Capacity drops below demand (say a replica set shrank): the queue grows, then latency."""

    kinds = ("queue_buildup",)

    def begin(self, t: float) -> None:
        svc = self.service
        self.capacity = max(svc.mean_demand(t), 0.1) / self.param("overload")

    def apply(self) -> None:
        cond = self.service.cond
        cond.capacity = min(cond.capacity, self.capacity)


@register
class KvCachePressure(Effect):
    kinds = ("kv_cache_pressure",)

    def apply(self) -> None:
        self.service.cond.kv_usage = self.param("usage")


def next_version(version: str) -> str:
    """v7 -> v8; anything else gets a suffix."""
    m = re.fullmatch(r"(.*?)(\d+)", version)
    return f"{m.group(1)}{int(m.group(2)) + 1}" if m else f"{version}-next"


@register
class BadVersion(Effect):
    """A new model version is promoted and serves slower and with more errors; rolled back at the end."""

    kinds = ("bad_version",)

    def begin(self, t: float) -> None:
        svc = self.service
        self.previous = svc.version
        self.version = str(self.fault.params["version"]) or next_version(svc.version)
        svc.promote(t, self.version)

    def apply(self) -> None:
        cond = self.service.cond
        cond.version = self.version
        cond.latency *= self.param("latency_factor")
        cond.ttft *= self.param("latency_factor")
        cond.error += self.param("error_rate")

    def finish(self, t: float) -> None:
        self.service.promote(t, self.previous)


@register
class PredictionDrift(Effect):
    """The model starts predicting one intent far more often (a data or upstream change)."""

    kinds = ("prediction_drift",)

    def apply(self) -> None:
        self.service.cond.quality.prediction_shift += self.param("shift")


@register
class ConfidenceShift(Effect):
    """The model grows less (or more) sure of itself: its confidence logit moves by ``shift``."""

    kinds = ("confidence_shift",)

    def apply(self) -> None:
        self.service.cond.quality.confidence_shift += self.param("shift")


@register
class InputDrift(Effect):
    """Users send different inputs: prompts ``factor`` times as long."""

    kinds = ("input_drift",)

    def apply(self) -> None:
        self.service.cond.quality.input_factor *= self.param("factor")


@register
class BusinessDrop(Effect):
    """A downstream business metric of the service falls to ``factor`` of what it was."""

    kinds = ("business_drop",)

    def apply(self) -> None:
        self.service.cond.quality.business_factor *= self.param("factor")
