"""What a simulated service's inference SDK reports about model quality: sketches and a business metric.

The real SDK (:mod:`gpuscope.sdk.inference`) sends, per window, a ``quality_sketch`` event per
signal and feature and, for business metrics, a ``model_business_metric`` frame; this module
produces the same payloads. A chat model predicts an intent (categorical), a confidence (logistic
of a normal), and sees two input features: the prompt length (log-normal) and the language
(categorical). Healthy life moves each distribution a little with the day (well under what a
drift test flags); faults move one of them: mass towards one intent (``prediction_shift``), the
confidence logit (``confidence_shift``), the prompt length (``input_factor``) or the business
metric (``business_factor``). Requests are sampled (at most ``MAX_SAMPLES`` per window), as an SDK
that calls ``predict`` on a share of requests does; sketches are built vectorised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuscope.model import Event, Frame, Labels
from gpuscope.quality.sketch import CategorySketch, NumericSketch

SKETCH_INTERVAL = 30.0
BUSINESS_INTERVAL = 60.0
MAX_SAMPLES = 400
ALPHA = 0.01
DAY = 86400.0
INTENTS = ("answer", "clarify", "refuse", "escalate")
INTENT_SHARE = np.array([0.55, 0.25, 0.12, 0.08])
LANGUAGES = ("en", "zh", "es", "de", "fr")
LANGUAGE_SHARE = np.array([0.6, 0.15, 0.1, 0.08, 0.07])
PROMPT_TOKENS = 400.0
PROMPT_SIGMA = 0.6
CONFIDENCE_LOGIT = 1.8
CONFIDENCE_SIGMA = 0.7
BUSINESS_METRIC = "accept_rate"
BUSINESS_RATE = 0.7


@dataclass(slots=True)
class QualityConditions:
    """What faults do to the model's outputs, inputs and downstream metric (neutral by default)."""

    prediction_shift: float = 0.0  # share of predictions moved to the last intent
    confidence_shift: float = 0.0  # added to the confidence logit
    input_factor: float = 1.0  # prompt lengths multiplied
    business_factor: float = 1.0  # business metric multiplied


def numeric_sketch(values: np.ndarray, alpha: float = ALPHA) -> NumericSketch:
    """The sketch ``NumericSketch.extend(values)`` builds, for positive values, in a few numpy calls."""
    v = np.asarray(values, dtype=np.float64)
    if v.size and not (np.isfinite(v).all() and v.min() > 1e-12):
        raise ValueError("numeric_sketch takes finite values above 1e-12")
    gamma_log = math.log((1.0 + alpha) / (1.0 - alpha))
    keys, counts = np.unique(np.ceil(np.log(v) / gamma_log).astype(np.int64), return_counts=True)
    sk = NumericSketch(alpha=alpha)
    sk.pos = {int(k): float(c) for k, c in zip(keys.tolist(), counts.tolist(), strict=True)}
    if v.size:
        sk.count, sk.total, sk.lo, sk.hi = float(v.size), float(v.sum()), float(v.min()), float(v.max())
    return sk


def _next(t: float, due: float, interval: float) -> float:
    """The first window boundary after ``t`` on the grid of ``due`` (ticks may be longer than windows)."""
    return t + interval - (t - due) % interval


def category_sketch(names: tuple[str, ...], counts: np.ndarray) -> CategorySketch:
    sk = CategorySketch()
    for name, c in zip(names, counts.tolist(), strict=True):
        if c:
            sk.add(name, float(c))
    return sk


class ServiceQuality:
    """Accumulates served requests and emits sketches and business frames on window boundaries."""

    def __init__(self, rng: np.random.Generator, peak_at: float, start: float) -> None:
        self.rng = rng
        self.peak_at = peak_at
        self.next_sketch = start + SKETCH_INTERVAL
        self.next_business = start + BUSINESS_INTERVAL
        self.pending = 0.0  # requests served since the last sketch
        self.pending_business = 0.0

    def restart(self, t: float) -> None:
        """A (re)started process begins fresh windows."""
        self.next_sketch, self.next_business = t + SKETCH_INTERVAL, t + BUSINESS_INTERVAL
        self.pending = self.pending_business = 0.0

    def step(
        self, t: float, served: float, labels: Labels, cond: QualityConditions
    ) -> tuple[list[Event], list[Frame]]:
        """Count ``served`` requests at ``t``; the window's events and frames when one closes."""
        self.pending += served
        self.pending_business += served
        events: list[Event] = []
        frames: list[Frame] = []
        day = math.cos(2.0 * math.pi * (t - self.peak_at) / DAY)
        if t >= self.next_sketch:
            self.next_sketch = _next(t, self.next_sketch, SKETCH_INTERVAL)
            n = min(int(self.pending), MAX_SAMPLES)
            self.pending = 0.0
            if n > 0:
                events = self._sketches(t, n, day, labels, cond)
        if t >= self.next_business:
            self.next_business = _next(t, self.next_business, BUSINESS_INTERVAL)
            n = int(self.pending_business)
            self.pending_business = 0.0
            if n > 0:
                frames = [self._business(t, n, day, labels, cond)]
        return events, frames

    def _sketches(self, t: float, n: int, day: float, labels: Labels, cond: QualityConditions) -> list[Event]:
        rng = self.rng
        intents = INTENT_SHARE + 0.015 * day * np.array([1.0, -1.0, 0.0, 0.0])
        s = min(max(cond.prediction_shift, 0.0), 1.0)
        intents = (1.0 - s) * intents + s * np.eye(len(INTENTS))[-1]
        logit = rng.normal(CONFIDENCE_LOGIT + 0.03 * day + cond.confidence_shift, CONFIDENCE_SIGMA, n)
        confidence = np.clip(1.0 / (1.0 + np.exp(-logit)), 1e-6, 1.0 - 1e-6)
        mu = math.log(PROMPT_TOKENS * cond.input_factor) + 0.02 * day
        prompt = np.maximum(np.round(rng.lognormal(mu, PROMPT_SIGMA, n)), 1.0)
        sketches: dict[tuple[str, str], CategorySketch | NumericSketch] = {
            ("prediction", "prediction"): category_sketch(
                INTENTS, rng.multinomial(n, intents / intents.sum())
            ),
            ("confidence", "confidence"): numeric_sketch(confidence),
            ("input", "prompt_tokens"): numeric_sketch(prompt),
            ("input", "language"): category_sketch(LANGUAGES, rng.multinomial(n, LANGUAGE_SHARE)),
        }
        return [
            Event(
                t, "quality_sketch", labels | {"signal": signal, "feature": feature}, {"sketch": sk.to_json()}
            )
            for (signal, feature), sk in sketches.items()
        ]

    def _business(self, t: float, n: int, day: float, labels: Labels, cond: QualityConditions) -> Frame:
        p = min(max(BUSINESS_RATE * (1.0 + 0.02 * day) * cond.business_factor, 0.0), 1.0)
        value = float(self.rng.binomial(n, p)) / n
        return Frame(
            t,
            ["model_business_metric"],
            [labels | {"metric": BUSINESS_METRIC}],
            np.array([[value]], dtype=np.float64),
        )
