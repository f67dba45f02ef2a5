"""TLS for the hub and the agent's endpoints, and verification on the sending side.

Config (``tls:`` of the hub's file)::

    tls:
      cert_file: /etc/gpuscope/hub.pem      # certificate chain, PEM
      key_file: /etc/gpuscope/hub-key.pem
      client_ca_file: /etc/gpuscope/ca.pem  # optional: require client certificates signed by it

Clients (agent, SDKs, CLIs) verify the hub's certificate by default, against the system store or
the CA file given with ``--ca-file`` / ``GPUSCOPE_CA_FILE``; a client certificate for a hub that
asks for one comes from ``GPUSCOPE_CLIENT_CERT`` / ``GPUSCOPE_CLIENT_KEY``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CA_FILE_ENV = "GPUSCOPE_CA_FILE"
CLIENT_CERT_ENV = "GPUSCOPE_CLIENT_CERT"
CLIENT_KEY_ENV = "GPUSCOPE_CLIENT_KEY"


@dataclass(frozen=True, slots=True)
class TlsSettings:
    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def server_context(self) -> ssl.SSLContext:
        """A server context (TLS 1.2 at least); ValueError naming the file that cannot be used."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"tls.cert_file/key_file: cannot load {self.cert_file}: {_why(exc)}") from None
        if self.client_ca_file:
            try:
                ctx.load_verify_locations(self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"tls.client_ca_file: cannot load {self.client_ca_file}: {_why(exc)}"
                ) from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def _why(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or type(exc).__name__


def parse_tls(section: Mapping[str, Any] | None) -> TlsSettings | None:
    """The ``tls:`` section; files must exist (ValueError naming the key)."""
    if not section:
        return None
    unknown = set(section) - {"cert_file", "key_file", "client_ca_file"}
    if unknown:
        raise ValueError(f"tls: unknown key {sorted(unknown)[0]!r} (cert_file, key_file, client_ca_file)")
    files: dict[str, str | None] = {}
    for key in ("cert_file", "key_file", "client_ca_file"):
        value = section.get(key)
        if value is None and key != "client_ca_file":
            raise ValueError(f"tls.{key}: is required")
        if value is not None and (not isinstance(value, str) or not Path(value).is_file()):
            raise ValueError(f"tls.{key}: {value!r} is not a readable file")
        files[key] = value
    return TlsSettings(str(files["cert_file"]), str(files["key_file"]), files["client_ca_file"])


def client_context(ca_file: str | None = None) -> ssl.SSLContext:
    """Verifying client context: the CA file given (or ``GPUSCOPE_CA_FILE``), else the system's,
    with the client certificate of ``GPUSCOPE_CLIENT_CERT``/``_KEY`` when set."""
    ca_file = ca_file or os.environ.get(CA_FILE_ENV) or None
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"--ca-file: cannot load {ca_file}: {_why(exc)}") from None
    cert, key = os.environ.get(CLIENT_CERT_ENV), os.environ.get(CLIENT_KEY_ENV)
    if cert:
        try:
            ctx.load_cert_chain(cert, key or None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"{CLIENT_CERT_ENV}: cannot load {cert}: {_why(exc)}") from None
    return ctx
