"""A checkpoint a run saves is in lineage at once: a model version can be registered from it
without registering the checkpoint by hand (or knowing what a manifest hash is)."""

from __future__ import annotations

from pathlib import Path

import httpx

import gpuscope
from gpuscope.sdk import Run
from gpuscope.sdk.manifest import build_manifest
from gpuscope.web.server import HubServer
from support import wait_until


def test_saved_checkpoint_is_registered_in_lineage_automatically(
    tmp_path: Path, local_hub: HubServer
) -> None:
    run: Run = gpuscope.init(job="auto", hub=local_hub.url, state_dir=tmp_path / "state", flush_interval=0.05)
    path = tmp_path / "model.bin"
    with run.checkpoint(3, path) as scope:
        path.write_bytes(b"weights" * 1000)
    assert scope.future is not None
    scope.future.result(10)
    run.finish()
    body = {"model": "chat", "version": "v9", "job": "auto", "step": 3}

    def registered() -> bool:
        return httpx.post(f"{local_hub.url}/api/v1/lineage/versions", json=body).status_code == 200

    wait_until(registered, timeout=10, what="a version registered from the saved checkpoint")
    version = httpx.get(f"{local_hub.url}/api/v1/lineage/versions/chat/v9").json()
    expected = build_manifest(path, job="auto", rank=0, step=3).digest
    assert version["checkpoint"]["step"] == 3
    assert version["checkpoint"]["manifest_hash"] == expected
