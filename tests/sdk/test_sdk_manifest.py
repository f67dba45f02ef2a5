"""Checkpoint manifests and ``gpuscope verify-checkpoint``: written files re-checked byte for byte."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gpuscope.sdk import verify
from gpuscope.sdk.manifest import (
    ManifestError,
    build_manifest,
    find_manifests,
    load_manifest,
    manifest_path,
    verify_manifest,
    write_manifest,
)


def _args(path: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    verify.add_arguments(parser)
    return parser.parse_args([str(path), "--json"])


def test_file_checkpoint_round_trip_and_corruption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(bytes(range(256)) * 5000)
    m = build_manifest(ckpt, job="j", rank=0, step=7)
    where = manifest_path(ckpt, 0)
    write_manifest(m, where)
    assert where.name == "model.pt.gpuscope-manifest.json"
    assert load_manifest(where).files == m.files and m.total_bytes == 1_280_000
    assert verify.run(_args(ckpt)) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True

    data = bytearray(ckpt.read_bytes())
    data[1000] ^= 1
    ckpt.write_bytes(bytes(data))
    assert verify.run(_args(ckpt)) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["manifests"][0]["problems"][0]["what"] == "sha256"

    ckpt.write_bytes(bytes(data[:10]))
    assert [p.what for p in verify_manifest(where).problems] == ["size"]
    ckpt.unlink()
    assert [p.what for p in verify_manifest(where).problems] == ["missing"]


def test_directory_checkpoint_has_one_manifest_per_rank(tmp_path: Path) -> None:
    d = tmp_path / "step-10"
    d.mkdir()
    for rank in range(2):
        (d / f"__{rank}_0.distcp").write_bytes(b"x" * (rank + 1) * 100)
        m = build_manifest(d, job="j", rank=rank, step=10, files=[d / f"__{rank}_0.distcp"])
        write_manifest(m, manifest_path(d, rank))
    assert [p.name for p in find_manifests(d)] == [
        ".gpuscope-manifest-rank0.json",
        ".gpuscope-manifest-rank1.json",
    ]
    assert all(verify_manifest(p).ok for p in find_manifests(d))
    assert verify.run(_args(d)) == 0


def test_nothing_to_check_and_bad_manifests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"abc")
    assert verify.run(_args(ckpt)) == 2
    assert "no gpuscope manifest" in json.loads(capsys.readouterr().out)["errors"][0]
    bad = tmp_path / "model.pt.gpuscope-manifest.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(ManifestError, match="not a gpuscope checkpoint manifest"):
        load_manifest(bad)
    with pytest.raises(ManifestError, match="does not exist"):
        build_manifest(tmp_path / "nope", job="j", rank=0, step=0)
