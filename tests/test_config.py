"""The config file: defaults, the keys it reads, and refusals that name the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuscope.cli import main
from gpuscope.config import DEFAULT_PORT, ConfigError, load_config, parse_listen


def test_defaults_bind_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSCOPE_CONFIG", raising=False)
    monkeypatch.delenv("GPUSCOPE_TOKEN", raising=False)
    cfg = load_config(None)
    assert (cfg.host, cfg.port) == ("127.0.0.1", DEFAULT_PORT)
    assert cfg.tokens == [] and cfg.storage_backend == "duckdb"


def test_full_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSCOPE_TOKEN", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text(
        "listen: 0.0.0.0:9999\n"
        "storage: {backend: duckdb, path: /data/g.duckdb}\n"
        "auth: {tokens: ['0123456789abcdef-token']}\n"
        "pricing: {price_per_gpu_hour: 4}\n"
        "limits: {max_body_bytes: 1000, max_entities: 10}\n"
        "retention: {raw_seconds: 3600}\n"
        "receivers: [{name: hook, webhook: {url: 'http://127.0.0.1:9/x'}}]\n"
    )
    monkeypatch.setenv("GPUSCOPE_CONFIG", str(path))
    cfg = load_config()
    assert (cfg.host, cfg.port) == ("0.0.0.0", 9999)
    assert cfg.storage_path == "/data/g.duckdb"
    assert cfg.tokens == ["0123456789abcdef-token"]
    assert cfg.price_per_gpu_hour == 4.0 and cfg.max_body_bytes == 1000 and cfg.max_entities == 10
    assert cfg.raw_retention_s == 3600


def test_env_token_is_added(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCOPE_TOKEN", "from-the-environment")
    assert load_config(None).tokens == ["from-the-environment"]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("listne: 1\n", "listne"),
        ("listen: nowhere\n", "listen"),
        ("storage: {backend: cassandra}\n", "storage.backend"),
        ("auth: {tokens: [short]}\n", "auth.tokens"),
        ("pricing: {price_per_gpu_hour: -1}\n", "pricing.price_per_gpu_hour"),
        ("limits: []\n", "limits"),
        ("- just a list\n", "mapping"),
        ("key: [unclosed\n", "not valid YAML"),
        ("slos: [{service: chat, availability: 1.5}]\n", "slos[0]"),
        ("slos: {chat: 0.99}\n", "slos"),
        ("receivers: [{name: hook}]\n", "receivers[0]"),
        ("alerting: {flap: {threshold: 1}}\n", "alerting.flap.threshold"),
        ("routes: [{receiver: nobody}]\n", "routes"),
        ("cluster: {peer_token: short}\n", "cluster.postgres_dsn"),
        ("detection: {warmup_s: -5}\n", "detection.warmup_s"),
        ("detection: {finished_job_retention_s: forever}\n", "detection.finished_job_retention_s"),
        ("storage: {memory_limit: lots}\n", "storage.memory_limit"),
        ('storage: {memory_limit: "1GB\'; DROP TABLE x"}\n', "storage.memory_limit"),
        ("limits: {malloc_arenas: 1.5}\n", "limits.malloc_arenas"),
        ("limits: {malloc_arenas: -1}\n", "limits.malloc_arenas"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("alerting: {pending: {loss_plateau: soon}}\n", "alerting.pending.loss_plateau"),
        ("alerting: {pending: {no_such_rule: 1m}}\n", "alerting.pending.no_such_rule"),
        ("alerting: {pending: {gpu_lost: 5m}}\n", "alerting.pending.gpu_lost"),
        ("pricing: {price_per_gpu_hour: -1}\n", "pricing.price_per_gpu_hour"),
        ("listen: nowhere\n", "listen"),
        ("slos: [{service: chat, availability: 1.5}]\n", "slos[0]"),
    ],
)
def test_each_error_names_the_file_and_the_field_once(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {field}")
    assert message.count(str(path)) == 1 and message.count(field) == 1


def test_a_yaml_error_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("listen: 127.0.0.1:7000\nalerting: {pending: [\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: not valid YAML at line 3, column 1: ")
    assert "<unicode string>" not in message and message.count(str(path)) == 1


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_parse_listen_ipv6() -> None:
    assert parse_listen("[::1]:7470") == ("::1", 7470)
    with pytest.raises(ConfigError):
        parse_listen("host:99999")


def test_every_section_is_parsed_once_into_its_typed_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUSCOPE_TOKEN", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text(
        "listen: 127.0.0.1:7000\n"
        "slos: [{service: chat, availability: 0.99}]\n"
        "receivers: [{name: hook, webhook: {url: 'http://127.0.0.1:9/x'}}]\n"
        "alerting: {pending: {gpu_thermal_throttle: 2m}}\n"
        "detection: {warmup_s: 60, finished_job_retention_s: 120}\n"
        "cluster: {postgres_dsn: 'postgresql://h/db', peer_token: 'a-long-peer-token-123'}\n"
    )
    cfg = load_config(path, listen="127.0.0.1:7100")
    assert [(s.service, s.kind, s.objective) for s in cfg.slos] == [("chat", "availability", 0.99)]
    assert set(cfg.alerting.notifiers) == {"hook"}
    assert cfg.alerting.pending_for == {"gpu_thermal_throttle": 120.0}
    assert cfg.warmup_s == 60.0 and cfg.finished_job_retention_s == 120.0
    # the cluster's defaults follow --listen, which overrides the file before the sections are read
    assert cfg.cluster is not None and cfg.cluster.advertise_url == "http://127.0.0.1:7100"
    assert cfg.port == 7100


def test_a_bad_section_is_a_config_error_with_exit_2_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("slos: [{service: chat, availabilty: 0.99}]\n")
    code = main(["hub", "--config", str(path), "--db", str(tmp_path / "h.duckdb")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"config: {path}: slos[0].availabilty: unknown key" in err.replace("\n", "")
    assert "Traceback" not in err
    assert not (tmp_path / "h.duckdb").exists()  # refused before anything was opened
