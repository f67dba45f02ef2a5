"""PromQL text built safely, and the PromQL HTTP API read back (``/api/v1/query``, ``query_range``).

Label values come from senders and users, so every value is written as a PromQL string literal
with its quotes, backslashes and control characters escaped: a hostile label cannot end the string
and add matchers or operators. Metric and label *names* are never escaped, they are checked
against Prometheus' name syntax instead and refused when they do not fit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import httpx

from gpuscope.store.errors import StoreError

METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def quote(value: str) -> str:
    """``value`` as a double-quoted PromQL string. JSON's escapes (``\\"``, ``\\\\``, ``\\n``,
    ``\\uXXXX``) are a subset of the Go escapes PromQL accepts; non-ASCII stays UTF-8."""
    return json.dumps(value, ensure_ascii=False)


def check_label_name(name: str) -> str:
    if not LABEL_NAME_RE.fullmatch(name) or name.startswith("__"):
        raise ValueError(f"label {name!r} is not a valid label name")
    return name


def selector(metric: str, labels: Mapping[str, str]) -> str:
    """``{__name__="metric", k="v", ...}``: equality matchers only, every value quoted."""
    if not METRIC_NAME_RE.fullmatch(metric):
        raise ValueError(f"metric {metric!r} is not a valid Prometheus metric name")
    parts = [f"__name__={quote(metric)}"]
    parts += [f"{check_label_name(k)}={quote(v)}" for k, v in sorted(labels.items())]
    return "{" + ", ".join(parts) + "}"


def names_selector(metrics: list[str]) -> str:
    """Any of several metrics (names already checked: no regex metacharacters but ``:``)."""
    for m in metrics:
        if not METRIC_NAME_RE.fullmatch(m):
            raise ValueError(f"metric {m!r} is not a valid Prometheus metric name")
    return "{__name__=~" + quote("|".join(metrics)) + "}"


def duration(ms: int) -> str:
    """A PromQL range duration in whole milliseconds (at least 1 ms)."""
    return f"{max(1, int(ms))}ms"


class PromQL:
    """A client of one Prometheus-compatible query API (base URL without ``/api/v1``)."""

    def __init__(self, client: httpx.Client, base_url: str) -> None:
        self.client = client
        self.base = base_url.rstrip("/")

    def _get(self, path: str, form: dict[str, str], post: bool = True) -> Any:
        """POST (form) keeps long selectors out of URL length limits; label values are GET only."""
        url = f"{self.base}{path}"
        try:
            r = self.client.post(url, data=form) if post else self.client.get(url, params=form)
        except httpx.HTTPError as exc:
            raise StoreError(f"query API {url} unreachable: {exc}") from None
        try:
            doc = r.json()
        except ValueError:
            doc = {}
        if r.status_code != 200 or doc.get("status") != "success":
            msg = doc.get("error") or r.text[:300]
            raise StoreError(f"query API {url} answered {r.status_code}: {msg}")
        return doc["data"]

    def instant(self, query: str, at: float) -> list[dict[str, Any]]:
        """An instant vector: ``[{"metric": {...}, "value": [t, "v"]}]``."""
        data = self._get("/api/v1/query", {"query": query, "time": f"{at:.3f}"})
        return list(data.get("result") or [])

    def range(self, query: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """A range matrix: ``[{"metric": {...}, "values": [[t, "v"], ...]}]``. ``nocache`` also
        stops VictoriaMetrics from aligning start and end to the step."""
        form = {
            "query": query,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step_s:.3f}",
            "nocache": "1",
        }
        data = self._get("/api/v1/query_range", form)
        return list(data.get("result") or [])

    def label_values(self, label: str, start: float, end: float) -> list[str]:
        data = self._get(
            f"/api/v1/label/{check_label_name(label) if label != '__name__' else label}/values",
            {"start": f"{start:.3f}", "end": f"{end:.3f}"},
            post=False,
        )
        return [str(v) for v in data or []]
