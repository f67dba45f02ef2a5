"""Checkpoint content manifests: per-file sizes and SHA-256, written beside the checkpoint.

A checkpoint that was written completely but later damaged (bit rot, a truncated copy, a
half-finished upload) loads garbage or fails hours into a restart. The manifest records what was
written, so ``gpuscope verify-checkpoint`` can prove, before a restart relies on it, that the bytes
are still those bytes. A file checkpoint ``X`` gets ``X.gpuscope-manifest.json``; a directory
checkpoint (torch.distributed.checkpoint) gets one ``.gpuscope-manifest-rank<R>.json`` per rank,
each covering the files that rank wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "gpuscope-checkpoint-manifest/1"
FILE_SUFFIX = ".gpuscope-manifest.json"
DIR_PREFIX = ".gpuscope-manifest-rank"
_CHUNK = 1 << 20


class ManifestError(ValueError):
    """A manifest cannot be read or does not describe a checkpoint."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str  # relative to the manifest's directory
    bytes: int
    sha256: str


@dataclass(slots=True)
class Manifest:
    job: str
    rank: int
    step: int
    files: list[FileEntry]
    created: float = field(default_factory=time.time)

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def digest(self) -> str:
        """The checkpoint's identity in lineage: sha256 over its files' paths and hashes, so the
        same bytes saved again give the same hash and any changed file gives another."""
        lines = sorted(f"{f.path}\0{f.sha256}" for f in self.files)
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "job": self.job,
            "rank": self.rank,
            "step": self.step,
            "created": self.created,
            "files": [{"path": f.path, "bytes": f.bytes, "sha256": f.sha256} for f in self.files],
        }


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    what: str  # "missing", "size", "sha256", "unreadable"
    detail: str


@dataclass(frozen=True, slots=True)
class Verification:
    manifest: Path
    job: str
    rank: int
    step: int
    files: int
    bytes: int
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems


def sha256_file(path: Path) -> tuple[int, str]:
    """(size, hex digest) of a file, read in 1 MiB chunks (hashlib releases the GIL on them)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def manifest_path(checkpoint: Path, rank: int) -> Path:
    """Where the manifest of ``checkpoint`` (a file or a directory) written by ``rank`` goes."""
    if checkpoint.is_dir():
        return checkpoint / f"{DIR_PREFIX}{rank}.json"
    return checkpoint.with_name(checkpoint.name + FILE_SUFFIX)


def _is_manifest(path: Path) -> bool:
    return path.name.endswith(FILE_SUFFIX) or (path.name.startswith(DIR_PREFIX) and path.suffix == ".json")


def build_manifest(
    checkpoint: Path, *, job: str, rank: int, step: int, files: Iterable[Path] | None = None
) -> Manifest:
    """Hash a checkpoint: the file itself, or ``files`` (default: every file) under the directory."""
    if not checkpoint.exists():
        raise ManifestError(f"checkpoint {checkpoint} does not exist")
    base = checkpoint if checkpoint.is_dir() else checkpoint.parent
    if files is None:
        if checkpoint.is_dir():
            files = sorted(p for p in checkpoint.rglob("*") if p.is_file() and not _is_manifest(p))
        else:
            files = [checkpoint]
    entries = []
    for path in files:
        size, digest = sha256_file(path)
        entries.append(FileEntry(os.path.relpath(path, base), size, digest))
    return Manifest(job=job, rank=rank, step=step, files=entries)


def write_manifest(manifest: Manifest, path: Path) -> None:
    """Write atomically, so a reader never sees half a manifest."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest.to_json(), indent=1))
    os.replace(tmp, path)


def load_manifest(path: Path) -> Manifest:
    try:
        obj = json.loads(path.read_text())
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc}") from None
    except ValueError as exc:
        raise ManifestError(f"manifest {path} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ManifestError(f"{path} is not a gpuscope checkpoint manifest (format {FORMAT})")
    try:
        files = [FileEntry(str(f["path"]), int(f["bytes"]), str(f["sha256"])) for f in obj["files"]]
        return Manifest(
            job=str(obj["job"]),
            rank=int(obj["rank"]),
            step=int(obj["step"]),
            files=files,
            created=float(obj["created"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"manifest {path} is malformed: {exc!r}") from None


def find_manifests(path: Path) -> list[Path]:
    """The manifests that cover ``path``: itself, the one beside a checkpoint file, or all in a directory."""
    if path.is_file() and _is_manifest(path):
        return [path]
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and _is_manifest(p))
    beside = path.with_name(path.name + FILE_SUFFIX)
    return [beside] if beside.is_file() else []


def verify_manifest(path: Path) -> Verification:
    """Re-hash every file a manifest lists and report each difference."""
    manifest = load_manifest(path)
    base = path.parent
    problems: list[Problem] = []
    for entry in manifest.files:
        target = base / entry.path
        if not target.is_file():
            problems.append(Problem(entry.path, "missing", "file is missing"))
            continue
        try:
            size, digest = sha256_file(target)
        except OSError as exc:
            problems.append(Problem(entry.path, "unreadable", str(exc)))
            continue
        if size != entry.bytes:
            problems.append(Problem(entry.path, "size", f"{size} bytes, manifest says {entry.bytes}"))
        elif digest != entry.sha256:
            problems.append(Problem(entry.path, "sha256", f"content hash {digest[:16]}... differs"))
    return Verification(
        manifest=path,
        job=manifest.job,
        rank=manifest.rank,
        step=manifest.step,
        files=len(manifest.files),
        bytes=manifest.total_bytes,
        problems=problems,
    )
