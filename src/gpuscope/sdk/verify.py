"""``gpuscope verify-checkpoint PATH``: re-hash a checkpoint against its manifests.

Run it before a restart trusts a checkpoint, or periodically over stored ones. Exit status: 0 when
every file matches, 1 when anything is missing or differs, 2 when there is nothing to check (no
manifest, unreadable manifest). With ``--hub`` the results are also reported as
``checkpoint_verified`` events, so a corrupt checkpoint raises an alert.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from gpuscope.agent.sender import INGEST_PATH
from gpuscope.huburl import hub_url
from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Batch, Event
from gpuscope.sdk.checkpoint import verification_data
from gpuscope.sdk.manifest import ManifestError, Verification, find_manifests, verify_manifest
from gpuscope.tls import client_context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="checkpoint file or directory, or a manifest")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument(
        "--hub",
        type=hub_url,  # also checks $GPUSCOPE_HUB: argparse converts a default given as text
        default=os.environ.get("GPUSCOPE_HUB"),
        help="also report the results to this hub (default: $GPUSCOPE_HUB)",
    )
    parser.add_argument("--token", default=None, help="hub write token (or GPUSCOPE_TOKEN)")


def verify_path(path: Path) -> tuple[list[Verification], list[str]]:
    """Every manifest covering ``path`` checked: (results, errors of manifests that could not be read)."""
    manifests = find_manifests(path)
    if not manifests:
        return [], [f"no gpuscope manifest found for {path}"]
    results, errors = [], []
    for m in manifests:
        try:
            results.append(verify_manifest(m))
        except ManifestError as exc:
            errors.append(str(exc))
    return results, errors


def _report(hub: str, token: str | None, results: list[Verification]) -> None:
    events = [
        Event(time.time(), "checkpoint_verified", {"job": r.job, "rank": str(r.rank)}, verification_data(r))
        for r in results
    ]
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = encode_batch(Batch(source="gpuscope-verify", events=events))
    verify = client_context() if hub.startswith("https://") else True  # GPUSCOPE_CA_FILE
    resp = httpx.post(hub.rstrip("/") + INGEST_PATH, content=body, headers=headers, timeout=10, verify=verify)
    resp.raise_for_status()


def _as_json(results: list[Verification], errors: list[str]) -> dict[str, Any]:
    return {
        "ok": bool(results) and not errors and all(r.ok for r in results),
        "errors": errors,
        "manifests": [verification_data(r) | {"job": r.job} for r in results],
    }


def run(args: argparse.Namespace) -> int:
    results, errors = verify_path(args.path)
    hub = args.hub
    if hub and results:
        try:
            _report(hub, args.token or os.environ.get("GPUSCOPE_TOKEN"), results)
        except httpx.HTTPError as exc:
            errors.append(f"could not report to {hub}: {exc}")
    if args.json:
        sys.stdout.write(orjson.dumps(_as_json(results, errors)).decode() + "\n")
    else:
        for r in results:
            state = "OK" if r.ok else "FAILED"
            print(
                f"{state}  {r.manifest}  job {r.job} rank {r.rank} step {r.step}: "
                f"{r.files} files, {r.bytes} bytes"
            )
            for p in r.problems:
                print(f"  {p.what:<10} {p.path}: {p.detail}")
        for e in errors:
            print(f"error: {e}", file=sys.stderr)
    if not results:
        return 2
    return 0 if all(r.ok for r in results) and not errors else 1
