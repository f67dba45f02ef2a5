"""The text of an exporter's ``/metrics`` page, fetched over one keep-alive HTTP client that is
opened on the first scrape and closed with its collector (dcgm-exporter, inference engines)."""

from __future__ import annotations

import httpx


class HttpText:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._client: httpx.Client | None = None

    def get(self, url: str) -> str:
        """The body of ``url``; raises :class:`httpx.HTTPError` on a failed request or an error status."""
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout)
        resp = self._client.get(url)
        resp.raise_for_status()
        return resp.text

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
