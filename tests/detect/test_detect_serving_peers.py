"""A young service is held to its established peers (the services serving the same model and
version): one slower than them from its first report is found, though its own baseline would learn
the slowness as its normal; one at their level is not; other models and versions, young peers and
alerting peers are no reference; without peers a young service is judged as before."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from gpuscope.detect.services import Snapshot
from gpuscope.detect.serving import LATENCY, TTFT, ServingDetector
from gpuscope.model import Finding
from support import chat_snapshot, onsets

JOINS = 700.0  # when the new service sends its first report; its peers report from 0
END = 1100.0

#: a service's latency/TTFT factor at a time: (name, model, version, first report, factor)
Plan = tuple[str, str, str, float, Callable[[float], float]]


def steady(factor: float) -> Callable[[float], float]:
    return lambda _ts: factor


def run(plans: list[Plan], seed: int = 3) -> dict[str, list[tuple[float, str]]]:
    """Each service's onsets (time, rule): one detector judging every service each second; each
    service's latency and TTFT are ``chat``'s times its factor."""
    rng = np.random.default_rng(seed)
    detector = ServingDetector()
    results: dict[str, list[tuple[float, list[Finding]]]] = {name: [] for name, *_ in plans}
    for k in range(int(END)):
        ts = float(k)
        snaps: dict[str, Snapshot] = {}
        for name, model, version, first, factor in plans:
            if ts >= first:
                f = factor(ts)
                snap = chat_snapshot(ts, rng, latency=f, ttft=f, requests=50.0)
                snaps[name] = dataclasses.replace(snap, model=model, version=version)
        found = detector.judge(ts, snaps)
        for name in results:
            results[name].append((ts, [x for x in found if x.entity.get("service") == name]))
    return {name: onsets(got) for name, got in results.items()}


def established(model: str = "chat", version: str = "v1") -> list[Plan]:
    return [
        ("chat-a", model, version, 0.0, steady(1.0)),
        ("chat-b", model, version, 0.0, steady(1.0)),
        ("chat-c", model, version, 0.0, steady(1.05)),
    ]


def test_a_new_service_twice_as_slow_as_its_established_peers_is_flagged() -> None:
    for seed in range(2):
        got = run([*established(), ("chat-new", "chat", "v1", JOINS, steady(2.0))], seed)
        new = got.pop("chat-new")
        assert sorted(rule for _, rule in new) == [LATENCY, TTFT], (seed, new)
        # within its warm-up and the rule's hold, and it stays found (its slowness is not learned)
        assert all(JOINS < t <= JOINS + 120.0 for t, _ in new), (seed, new)
        assert got == {"chat-a": [], "chat-b": [], "chat-c": []}, seed


def test_the_alert_names_the_peers_it_was_held_to() -> None:
    rng = np.random.default_rng(5)
    detector = ServingDetector()
    found: list[Finding] = []
    for k in range(int(JOINS) + 200):
        ts = float(k)
        snaps = {name: chat_snapshot(ts, rng, requests=50.0) for name in ("chat-a", "chat-b")}
        if ts >= JOINS:
            snaps["chat-new"] = chat_snapshot(ts, rng, latency=2.0, ttft=2.0, requests=50.0)
        found = detector.judge(ts, snaps)
    latency = next(f for f in found if f.rule == LATENCY)
    assert latency.entity == {"service": "chat-new"}
    assert "2 established service(s) serving chat v1" in latency.summary
    assert latency.value is not None and 1.8 < latency.value < 2.2


def test_a_new_service_at_its_peers_level_raises_nothing() -> None:
    for seed, factor in enumerate((1.0, 0.8, 1.15)):
        got = run([*established(), ("chat-new", "chat", "v1", JOINS, steady(factor))], seed)
        assert got == {"chat-a": [], "chat-b": [], "chat-c": [], "chat-new": []}, (seed, factor)


def test_services_of_another_model_or_version_are_no_reference() -> None:
    alone = run([("chat-new", "chat", "v1", JOINS, steady(2.0))])["chat-new"]
    for model, version in (("chat", "v2"), ("other", "v1")):
        got = run([*established(model, version), ("chat-new", "chat", "v1", JOINS, steady(2.0))])
        assert got["chat-new"] == alone, (model, version)


def test_without_peers_a_young_service_is_judged_as_before() -> None:
    # sick from its first report and alone: nothing healthy to compare with, as before
    assert run([("chat-new", "chat", "v1", JOINS, steady(2.0))])["chat-new"] == []
    # a spike after its first minutes is found against its own young baseline, as before
    spike = run([("chat-new", "chat", "v1", JOINS, lambda ts: 2.0 if ts >= JOINS + 260 else 1.0)])
    assert sorted(r for _, r in spike["chat-new"]) == [LATENCY, TTFT]


def test_young_or_alerting_peers_are_no_reference() -> None:
    # peers that started with it are young too: two services sick from their first report
    together = [("chat-a", "chat", "v1", 0.0, steady(1.0)), ("chat-new", "chat", "v1", 0.0, steady(2.0))]
    assert run(together)["chat-new"] == []
    # peers that are alerting (the whole model regressed 2x at 640 s, their references frozen at
    # the healthy level) are no reference: the new service, as slow as they are now, is not blamed
    fleet = lambda ts: 2.0 if ts >= 640.0 else 1.0  # noqa: E731
    plans = [(name, "chat", "v1", 0.0, fleet) for name in ("chat-a", "chat-b", "chat-c")]
    got = run([*plans, ("chat-new", "chat", "v1", JOINS, steady(2.0))])
    assert got["chat-new"] == [], got
    assert all(sorted(r for _, r in got[name]) == [LATENCY, TTFT] for name in ("chat-a", "chat-b")), got
