"""Reading back what a hub stored, for the SDK tests."""

from __future__ import annotations

from typing import Any

import httpx


def records(hub: str, job: str) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"job": job, "start": 0, "end": 4e9, "limit": 100_000}
    return list(httpx.get(f"{hub}/api/v1/training", params=params, timeout=10).json()["records"])


def events(hub: str, job: str, kind: str) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"kind": kind, "start": 0, "end": 4e9, "job": job, "limit": 100_000}
    return list(httpx.get(f"{hub}/api/v1/events", params=params, timeout=10).json()["events"])
