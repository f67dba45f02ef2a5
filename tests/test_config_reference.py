"""Every config section refuses typos by name; the reference page, the parsers and the checker agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope import cli
from gpuscope.alert.maintenance import WINDOW_KEYS
from gpuscope.alert.notify import load_notifiers
from gpuscope.alert.routing import ROUTE_KEYS
from gpuscope.alert.settings import ALERTING_KEYS
from gpuscope.cluster.config import KNOWN as CLUSTER_KEYS
from gpuscope.config import (
    DETECTION_KEYS,
    HUB_KEYS,
    KNOWN_KEYS,
    LIMITS_KEYS,
    PRICING_KEYS,
    RETENTION_KEYS,
    ConfigError,
    load_config,
)
from gpuscope.config_check import check_config
from gpuscope.config_reference import SECTIONS
from gpuscope.docgen import PAGES
from gpuscope.quality.slo import SLO_KEYS
from gpuscope.store.settings import KEYS as STORAGE_KEYS

ROOT = Path(__file__).resolve().parents[1]

# the parsers' own key sets: a key added there without a line in config_reference fails here
PARSED = {
    "storage": STORAGE_KEYS,
    "pricing": PRICING_KEYS,
    "limits": LIMITS_KEYS,
    "retention": RETENTION_KEYS,
    "detection": DETECTION_KEYS,
    "hub": HUB_KEYS,
    "routes": ROUTE_KEYS,
    "alerting": ALERTING_KEYS,
    "slos": SLO_KEYS,
    "cluster": CLUSTER_KEYS,
}


def _check(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return check_config(path)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_generated_pages_match_the_code(page: str) -> None:
    """Run ``python -m gpuscope.docgen`` after changing a section, a rule or a playbook."""
    assert (ROOT / page).read_text() == PAGES[page](), f"{page} is stale: python -m gpuscope.docgen"


def test_every_section_is_in_the_reference_with_the_keys_its_parser_knows() -> None:
    assert {s.name for s in SECTIONS} == KNOWN_KEYS
    documented = {s.name: {k.name for k in s.keys} for s in SECTIONS}
    for name, keys in PARSED.items():
        assert documented[name] == set(keys), name


@pytest.mark.parametrize("section", [s for s in SECTIONS if s.example], ids=lambda s: s.name)
def test_every_example_passes_config_check(
    tmp_path: Path, section: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUSCOPE_TOKEN", raising=False)
    assert _check(tmp_path, section.example)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # before: these four started the hub with the default (new-user trial)
        (
            "pricing: {price_per_gpu_hr: 2.5}\n",
            "pricing.price_per_gpu_hr: unknown key (known: price_per_gpu_hour)",
        ),
        ("limits: {max_body_byte: 100}\n", "limits.max_body_byte: unknown key"),
        ("retention: {raw_second: 100}\n", "retention.raw_second: unknown key (known: raw_seconds)"),
        (
            "detection: {warmup: 10}\n",
            "detection.warmup: unknown key (known: finished_job_retention_s, warmup_s)",
        ),
        ("slos: [{service: chat, objective: 0.9}]\n", "slos[0].objective: unknown key (known: availability"),
        ("slos: {service: chat}\n", "slos: must be a list"),
        ("storage: {pth: x}\n", "storage.pth: unknown key"),
        ("auth: {scope: x}\n", "auth: unknown key 'scope'"),
        ("tls: {cert: x}\n", "tls: unknown key 'cert'"),
        ("cluster: {shard: 3}\n", "cluster.shard: unknown key"),
        ("state: {dsn: x}\n", "state.dsn: unknown key"),
        ("alerting: {flapping: {}}\n", "alerting.flapping: unknown key"),
        (
            "alerting: {flap: {treshold: 3}}\n",
            "alerting.flap.treshold: unknown key (known: threshold, window)",
        ),
        ("alerting: {outbox: {max_ag: 1d}}\n", "alerting.outbox.max_ag: unknown key"),
        (
            "alerting: {silences: [{matchers: [a=b], comments: x}]}\n",
            "alerting.silences[0].comments: unknown",
        ),
        (
            "alerting: {maintenance: [{matchers: {node: a}, start: '02:00', duration: 1h, weekday: [1]}]}\n",
            "alerting.maintenance[0].weekday: unknown key",
        ),
        (
            "receivers: [{name: p, pagerduty: {routing_key: k}}]\n"
            "alerting: {escalation: [{aftr: 1m, receiver: p}]}\n",
            "alerting.escalation[0].aftr: unknown key",
        ),
        (
            "receivers: [{name: s, slack: {url: 'https://h.example/x', chanel: '#a'}}]\n",
            "receivers[0].slack.chanel: unknown key (known: channel, url)",
        ),
        (
            "receivers: [{name: w, webhook: {url: 'http://h/x'}}]\nroutes: [{reciever: w}]\n",
            "unknown key 'reciever'",
        ),
    ],
)
def test_a_typo_in_any_section_is_refused_by_name(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _check(tmp_path, text)
    assert message in str(refused.value)


def test_every_receiver_kind_documents_its_keys() -> None:
    section = next(s for s in SECTIONS if s.name == "receivers")
    for kind, notifier in load_notifiers().items():
        documented = section.text.split(f"`{kind}: {{", 1)[1].split("}`", 1)[0]
        assert set(documented.split(", ")) == set(notifier.keys), kind


def test_maintenance_keys_are_documented() -> None:
    alerting = next(s for s in SECTIONS if s.name == "alerting")
    text = next(k.text for k in alerting.keys if k.name == "maintenance")
    assert all(key in text for key in WINDOW_KEYS - {"match"})


def test_config_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "pricing: {price_per_gpu_hour: 3}\nreceivers: [{name: w, webhook: {url: 'http://h/x'}}]\n"
    )
    assert cli.main(["config", "check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "receivers w" in out and f"{good}: ok" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("retention: {raw_second: 100}\n")
    assert cli.main(["config", "check", str(bad)]) == 2
    assert "retention.raw_second: unknown key" in capsys.readouterr().err


def test_a_bad_slos_section_is_a_config_error_when_the_hub_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``ValueError: slos[0]: unknown key(s) objective`` as a traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("slos: [{service: chat, objective: 0.9}]\n")
    code = cli.main(
        ["hub", "--config", str(bad), "--db", str(tmp_path / "h.duckdb"), "--listen", "127.0.0.1:1"]
    )
    assert code == 2
    assert f"config: {bad}: slos[0].objective: unknown key" in capsys.readouterr().err.replace("\n", "")


def test_reference_command_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "reference"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs/configuration.md").read_text()


def test_the_readme_routing_example_passes_config_check(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Routing alerts to people", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    lines = _check(tmp_path, example)
    assert "receivers audit, ml-team, oncall, platform; 4 route(s)" in lines


def test_the_readmes_ingest_workers_setting_and_flag_are_the_hubs(tmp_path: Path) -> None:
    """README's "One hub on more cores" names a setting the hub reads and a flag ``gpuscope hub`` takes."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### One hub on more cores", 1)[1].split("\n### ", 1)[0]
    assert "`hub: {ingest_workers: N}`" in section and "`gpuscope hub --ingest-workers N`" in section
    path = tmp_path / "c.yaml"
    path.write_text("hub: {ingest_workers: 3}\n")
    assert load_config(path).ingest_workers == 3
    assert cli.build_parser().parse_args(["hub", "--ingest-workers", "3"]).ingest_workers == 3
