"""Route tree, matchers, durations and config validation (Alertmanager semantics)."""

from __future__ import annotations

import pytest

from gpuscope.alert.durations import parse_duration
from gpuscope.alert.labels import alert_labels, parse_matcher
from gpuscope.alert.routing import find_routes
from gpuscope.alert.settings import parse_alerting
from gpuscope.model import Alert

RECEIVERS = [
    {"name": "pager", "pagerduty": {"routing_key": "k", "url": "http://127.0.0.1:1/pd"}},
    {"name": "platform-hook", "webhook": {"url": "http://127.0.0.1:1/platform"}},
    {"name": "model-chat", "slack": {"url": "http://127.0.0.1:1/slack"}},
    {"name": "all", "webhook": {"url": "http://127.0.0.1:1/all"}},
]


def alert(rule: str, severity: str, owner: str, **entity: str) -> Alert:
    return Alert("al-1", rule, severity, owner, dict(entity), 0.0, "s", 1.0, incident="inc-1")


def receivers_for(cfg: dict[str, object], a: Alert) -> list[str]:
    settings = parse_alerting(cfg)
    return [r.receiver for r in find_routes(settings.routes, alert_labels(a))]


def test_first_match_wins_continue_goes_on_and_children_refine() -> None:
    cfg = {
        "receivers": RECEIVERS,
        "routes": [
            {"receiver": "all", "continue": True},
            {"receiver": "pager", "match": {"severity": "P1"}, "group_wait": "0s"},
            {
                "receiver": "platform-hook",
                "match": {"owner": "platform"},
                "routes": [{"receiver": "model-chat", "matchers": ['node=~"node-[0-3]"', "rule!=gpu_lost"]}],
            },
            {"receiver": "model-chat"},
        ],
    }
    assert receivers_for(cfg, alert("gpu_lost", "P1", "platform", node="node-1", gpu="0")) == ["all", "pager"]
    assert receivers_for(cfg, alert("gpu_thermal_throttle", "P2", "platform", node="node-2", gpu="1")) == [
        "all",
        "model-chat",  # the child matched
    ]
    assert receivers_for(cfg, alert("gpu_thermal_throttle", "P2", "platform", node="node-9", gpu="1")) == [
        "all",
        "platform-hook",  # no child matched: the parent takes it
    ]
    assert receivers_for(cfg, alert("loss_spike", "P2", "model", job="llm")) == ["all", "model-chat"]


def test_children_inherit_timing_and_grouping_and_defaults_route_to_every_receiver() -> None:
    cfg = {
        "receivers": RECEIVERS,
        "routes": [
            {
                "receiver": "pager",
                "group_by": ["job"],
                "group_interval": "2m",
                "repeat_interval": "1h",
                "routes": [{"match": {"severity": "P1"}, "group_wait": "10s"}],
            }
        ],
    }
    (route,) = find_routes(
        parse_alerting(cfg).routes, alert_labels(alert("loss_nan", "P1", "model", job="j"))
    )
    assert route.receiver == "pager" and route.group_by == ("job",)
    assert (route.timing.group_wait, route.timing.group_interval, route.timing.repeat_interval) == (
        10,
        120,
        3600,
    )
    assert route.group_key(alert_labels(alert("loss_nan", "P1", "model", job="j"))).endswith("{job=j}")
    default = parse_alerting({"receivers": RECEIVERS}).routes
    assert sorted(r.receiver for r in find_routes(default, {"severity": "P3"})) == sorted(
        r["name"] for r in RECEIVERS
    )


def test_matchers_and_durations() -> None:
    assert parse_matcher('node=~"node-[12]"').matches({"node": "node-2"})
    assert not parse_matcher("node!~node-.*").matches({"node": "node-2"})
    assert parse_matcher("rule!=gpu_lost").matches({"rule": "loss_nan"})
    assert parse_matcher("absent=").matches({})
    assert (
        parse_duration("1h30m", "x") == 5400
        and parse_duration(45, "x") == 45
        and parse_duration("250ms", "x") == 0.25
    )
    for bad in ("5 minutes", "-1s", "", True):
        with pytest.raises(ValueError, match="x"):
            parse_duration(bad, "x")
    with pytest.raises(ValueError, match="regular expression"):
        parse_matcher("node=~[")


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"receivers": [{"name": "a", "email": {}}]}, r"receivers\[0\] \(a\): needs exactly one of"),
        ({"receivers": [{"name": "a", "webhook": {"url": "ftp://x"}}]}, "webhook.url must be an http"),
        ({"receivers": [{"name": "a", "pagerduty": {}}]}, "routing_key is required"),
        ({"receivers": RECEIVERS, "routes": [{"receiver": "nobody"}]}, r"routes\[0\].receiver: 'nobody'"),
        ({"receivers": RECEIVERS, "routes": [{"receiver": "all", "grop_by": []}]}, "unknown key 'grop_by'"),
        ({"receivers": RECEIVERS, "routes": [{"receiver": "all", "group_wait": "soon"}]}, "group_wait"),
        ({"routes": [{"receiver": "x"}]}, "no receivers"),
        ({"alerting": {"pending": {"gpu_lost": "30s"}}}, "hard fault fires at once"),
        ({"alerting": {"pending": {"no_rule": "30s"}}}, "not a rule"),
        ({"alerting": {"typo": 1}}, r"alerting\.typo: unknown key \(known: escalation"),
        (
            {"receivers": RECEIVERS, "alerting": {"escalation": [{"after": "5m", "receiver": "x"}]}},
            "escalation",
        ),
        ({"alerting": {"maintenance": [{"start": "25:00", "duration": "1h"}]}}, "time of day"),
        (
            {"alerting": {"maintenance": [{"start": "02:00", "duration": "1h", "timezone": "Mars/Base"}]}},
            "zone",
        ),
        ({"alerting": {"flap": {"threshold": 1}}}, "threshold"),
    ],
)
def test_bad_config_is_refused_naming_the_key(cfg: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_alerting(cfg)
