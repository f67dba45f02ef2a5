"""Log redaction: known secrets and receivers' URLs never reach a log line.

Every part of the hub logs through the root logger's handlers; :func:`install_redaction` puts one
filter there that replaces each secret of the config file by ``***``. HTTP clients' request lines
are cut to the URL's origin by :func:`scrub_client_logs`. Standard library only, so any layer may
import it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit


def secret_strings(tokens: Sequence[str], raw: Mapping[str, Any]) -> list[str]:
    """Every secret a config holds: plain tokens, and the values of keys that name secrets
    (URLs of receivers, routing keys, DSNs, passwords) anywhere in the file."""
    found = [t for t in tokens if t]
    sensitive = ("url", "key", "dsn", "password", "secret", "token", "authorization")

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, str(k).lower())
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and len(value) >= 8 and any(s in key for s in sensitive):
            found.append(value)
            password = urlsplit(value).password if "://" in value else None
            if password:
                found.append(password)

    walk(dict(raw), "")
    return sorted(set(found), key=len, reverse=True)


class RedactingFilter(logging.Filter):
    """Replaces known secrets in every log record (message, arguments, exception text) by ``***``:
    the last line of defence should some message quote a URL, DSN or token it was handed."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for s in self.secrets:
            if s in text:
                text = text.replace(s, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.msg, record.args = self.redact(message), None
            if record.exc_text:
                record.exc_text = self.redact(record.exc_text)
        return True


def install_redaction(secrets: Iterable[str]) -> RedactingFilter:
    """Put a :class:`RedactingFilter` on every handler of the root logger (where records end up)."""
    flt = RedactingFilter(secrets)
    for handler in logging.getLogger().handlers:
        handler.addFilter(flt)
    return flt


class UrlScrubber(logging.Filter):
    """Cuts URLs in a record's arguments down to their origin: an HTTP client's request log line
    (``httpx`` logs every request at INFO) would otherwise show a receiver's secret path or query."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_origin(a) for a in record.args)
        return True


def _origin(value: Any) -> Any:
    text = str(value)
    if not text.startswith(("http://", "https://")):
        return value
    parts = urlsplit(text)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}/…"


def scrub_client_logs(logger_name: str = "httpx") -> None:
    """Put one :class:`UrlScrubber` on ``logger_name`` (idempotent)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, UrlScrubber) for f in logger.filters):
        logger.addFilter(UrlScrubber())
