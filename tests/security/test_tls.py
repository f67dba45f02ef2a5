"""TLS with certificates made at test time: a real hub over https, agents' sender verifying it,
client certificates, and the agent's own /metrics endpoint."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpuscope.agent.metrics_endpoint import MetricsEndpoint
from gpuscope.agent.sender import Backoff, Sender
from gpuscope.agent.spool import Spool
from gpuscope.config import ConfigError, load_config
from gpuscope.hub import Hub
from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Batch, Event
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.tls import TlsSettings, client_context
from gpuscope.web.auth import AuthSettings
from gpuscope.web.server import HubServer
from security.pki import Pki

TOKEN = "a-tls-test-token-0123456789"


def tls_hub(pki: Pki, client_ca: bool = False) -> HubServer:
    tls = TlsSettings(str(pki.server_cert), str(pki.server_key), str(pki.ca) if client_ca else None)
    hub = Hub(DuckDBStore(":memory:", durable=False))
    server = HubServer(hub, "127.0.0.1", 0, auth=AuthSettings.from_plain([TOKEN]), tls=tls)
    server.start()
    return server


@pytest.fixture
def hub(pki: Pki) -> Iterator[HubServer]:
    server = tls_hub(pki)
    yield server
    server.stop()


def body(k: int) -> bytes:
    event = Event(1000.0 + k, "xid", {"node": "n1", "gpu": "0"}, {"code": 13})
    return encode_batch(Batch(source="n1", batch_id=f"b{k}", events=[event]))


def sender(url: str, tmp: Path, **kw: object) -> Sender:
    spool = Spool(tmp / "spool", max_bytes=1 << 20, fsync=False)
    return Sender(url, spool=spool, token=TOKEN, backoff=Backoff(initial=60), **kw)  # type: ignore[arg-type]


def test_agents_ingest_over_https_verifying_the_hub(hub: HubServer, pki: Pki, tmp_path: Path) -> None:
    assert hub.url.startswith("https://127.0.0.1:")
    s = sender(hub.url, tmp_path / "a", ca_file=str(pki.ca))
    s.submit(body(0))
    assert s.counters.get("batches_sent") == 1 and s.backlog == 0
    s.close()
    assert [e.labels for e in hub.hub.store.events(0, 2000, "xid", None, 10)] == [{"node": "n1", "gpu": "0"}]

    # an unknown CA: the batch is not sent but kept, and retried later
    untrusted = sender(hub.url, tmp_path / "b", ca_file=str(pki.other_ca))
    untrusted.submit(body(1))
    assert untrusted.counters.get("batches_sent") == 0 and untrusted.backlog == 1
    assert untrusted.counters.get("send_failures") == 1
    untrusted.close()


def test_the_ca_file_comes_from_the_environment(
    hub: HubServer, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSCOPE_CA_FILE", str(pki.ca))
    s = sender(hub.url, tmp_path)
    s.submit(body(0))
    assert s.counters.get("batches_sent") == 1
    s.close()


def test_plain_http_to_the_tls_port_is_refused(hub: HubServer) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(hub.url.replace("https://", "http://") + "/api/v1/health", timeout=5)
    # and verification is on by default: the system store does not know the test CA
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(hub.url + "/api/v1/health", timeout=5)


def test_client_certificates_when_the_hub_asks_for_them(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    server = tls_hub(pki, client_ca=True)
    try:
        url = server.url + "/api/v1/health"
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, verify=client_context(str(pki.ca)), timeout=5)
        monkeypatch.setenv("GPUSCOPE_CLIENT_CERT", str(pki.client_cert))
        monkeypatch.setenv("GPUSCOPE_CLIENT_KEY", str(pki.client_key))
        assert httpx.get(url, verify=client_context(str(pki.ca)), timeout=5).status_code == 200
    finally:
        server.stop()


def test_tls_config_is_checked_when_loaded(pki: Pki, tmp_path: Path) -> None:
    config = tmp_path / "hub.yaml"
    config.write_text(f"tls: {{cert_file: {pki.server_cert}, key_file: {pki.server_key}}}\n")
    assert load_config(config).tls == TlsSettings(str(pki.server_cert), str(pki.server_key))
    config.write_text(f"tls: {{cert_file: {pki.server_cert}}}\n")
    with pytest.raises(ConfigError, match=r"tls\.key_file: is required"):
        load_config(config)
    config.write_text(f"tls: {{cert_file: {tmp_path / 'missing.pem'}, key_file: {pki.server_key}}}\n")
    with pytest.raises(ConfigError, match=r"tls\.cert_file: .* is not a readable file"):
        load_config(config)
    swapped = TlsSettings(str(pki.server_key), str(pki.server_cert))
    with pytest.raises(ValueError, match=r"tls\.cert_file/key_file: cannot load"):
        swapped.server_context()


def test_the_agents_metrics_endpoint_serves_tls(pki: Pki) -> None:
    endpoint = MetricsEndpoint("127.0.0.1", 0, tls=TlsSettings(str(pki.server_cert), str(pki.server_key)))
    endpoint.start()
    try:
        host, port = endpoint.address
        r = httpx.get(f"https://{host}:{port}/metrics", verify=client_context(str(pki.ca)), timeout=5)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://{host}:{port}/metrics", timeout=5)
        bad = ssl.create_default_context(cafile=str(pki.other_ca))
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://{host}:{port}/metrics", verify=bad, timeout=5)
        # still serving after refused handshakes
        again = httpx.get(f"https://{host}:{port}/metrics", verify=client_context(str(pki.ca)), timeout=5)
        assert again.status_code == 200
    finally:
        endpoint.close()
