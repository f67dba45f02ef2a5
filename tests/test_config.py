"""The config file: defaults, the keys it reads, and refusals that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_parse_listen_ipv6() -> None:
    assert parse_listen("[::1]:7470") == ("::1", 7470)
    with pytest.raises(ConfigError):
        parse_listen("host:99999")
