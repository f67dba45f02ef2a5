"""A cluster member tells its listeners (the demo's view, the terminal, anything added with
``Hub.add_listener``) every alert that fires or resolves on its shards, as a single hub does."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from alert.rig import Scripted, lost
from gpuscope.alert.engine import AlertChange
from gpuscope.config import load_config
from gpuscope.detect.engine import DetectionEngine
from gpuscope.runtime import assemble
from gpuscope.store.duckdb import DuckDBStore
from support import wait_until

SHARDS = 8


def test_listeners_hear_fired_and_resolved_on_a_cluster_member(postgres_dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "hub.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "cluster": {
                    "hub_id": "hub-l",
                    "peer_token": "peer-token-for-the-test-0123",
                    "shards": SHARDS,
                },
                "state": {"postgres_dsn": postgres_dsn},
            }
        )
    )
    runtime = assemble(
        load_config(path), store=DuckDBStore(":memory:", durable=False), serve=False, evaluate_interval=None
    )
    member = runtime.cluster
    assert member is not None
    hub = runtime.hub
    script = Scripted()
    hub.detection = DetectionEngine([script])
    hub.alerts.resolve_after = 0.0
    heard: list[AlertChange] = []
    hub.add_listener(heard.append)
    runtime.start()
    try:
        wait_until(lambda: len(member.node.owned) == SHARDS, 10, "the member to own every shard")
        now = time.time()
        script.findings = [lost()]
        fired = hub.evaluate(now)
        assert runtime.alerting.drain(10.0)
        assert [(c.kind, c.alert.rule) for c in fired] == [("fired", "gpu_lost")]
        script.findings = []
        resolved = hub.evaluate(now + 1)
        assert runtime.alerting.drain(10.0)
        assert [c.kind for c in resolved] == ["resolved"]
        assert [(c.kind, c.alert.id) for c in heard] == [
            ("fired", fired[0].alert.id),
            ("resolved", fired[0].alert.id),
        ]
        # the cluster's state answers; the member's own store keeps no copy (pages read the state)
        assert [(a.id, a.firing) for a in hub.stored_alerts()] == [(fired[0].alert.id, False)]
        assert hub.store.alerts() == []
        # alerting is a listener on a member as on a single hub: each transition recorded once
        # (with no routes configured, the alert is recorded as unrouted, as a single hub does)
        what = [h["what"] for h in runtime.alerting.history(fired[0].alert.id)]
        assert what == ["fired", "unrouted", "resolved"]
    finally:
        runtime.stop()
