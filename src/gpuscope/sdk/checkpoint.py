"""Checkpoint reporting: start and end on the training thread, hashing and manifests off it.

Saving is timed where it happens (the training thread is blocked for exactly that long, which
is goodput lost), then the files are hashed by one worker thread, a manifest is written beside
them and ``checkpoint_completed`` is reported with size, duration and manifest. Every rank that
saves reports, so the hub sees when a checkpoint is complete across ranks. A save that raises
reports ``checkpoint_failed`` and the exception goes on to the caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuscope.model import Event
from gpuscope.sdk.env import Placement
from gpuscope.sdk.goodput import Goodput
from gpuscope.sdk.manifest import (
    ManifestError,
    Verification,
    build_manifest,
    find_manifests,
    manifest_path,
    verify_manifest,
    write_manifest,
)

log = logging.getLogger("gpuscope.sdk.checkpoint")

Emit = Callable[[Event], None]
FileSelector = Callable[[Path], list[Path]]
_MAX_PROBLEMS = 20


class CheckpointReporter:
    """Owns the hashing thread; one per run."""

    def __init__(self, placement: Placement, emit: Emit, goodput: Goodput) -> None:
        self.placement = placement
        self.emit = emit
        self.goodput = goodput
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuscope-ckpt")
        self._futures: list[Future[Any]] = []

    def _event(self, ts: float, kind: str, data: dict[str, Any]) -> None:
        self.emit(Event(ts, kind, self.placement.labels, data))

    def started(self, step: int, path: Path) -> float:
        ts = time.time()
        self._event(ts, "checkpoint_started", {"step": step, "path": str(path)})
        return ts

    def failed(self, step: int, path: Path, started: float, reason: str) -> None:
        ts = time.time()
        self.goodput.add("checkpoint", ts - started)
        self._event(ts, "checkpoint_failed", {"step": step, "path": str(path), "reason": reason[:500]})

    def saved(self, step: int, path: Path, started: float, files: FileSelector | None = None) -> Future[Any]:
        """The save returned: account its time now, hash and report completion in the background."""
        ended = time.time()
        self.goodput.add("checkpoint", ended - started)
        future = self._pool.submit(self._complete, step, path, ended, ended - started, files)
        self._futures.append(future)
        return future

    def _complete(
        self, step: int, path: Path, ended: float, seconds: float, files: FileSelector | None
    ) -> None:
        t0 = time.monotonic()
        try:
            manifest = build_manifest(
                path,
                job=self.placement.job,
                rank=self.placement.rank,
                step=step,
                files=files(path) if files is not None else None,
            )
            where = manifest_path(path, self.placement.rank)
            write_manifest(manifest, where)
        except (OSError, ManifestError) as exc:
            self._event(
                ended, "checkpoint_failed", {"step": step, "path": str(path), "reason": str(exc)[:500]}
            )
            return
        self._event(
            ended,
            "checkpoint_completed",
            {
                "step": step,
                "path": str(path),
                "bytes": manifest.total_bytes,
                "files": len(manifest.files),
                "seconds": seconds,
                "hash_seconds": time.monotonic() - t0,
                "manifest": str(where),
                "manifest_hash": manifest.digest,
            },
        )

    def verify(self, path: Path) -> Future[list[Verification]]:
        """Re-check the manifests of ``path`` in the background; each result becomes an event."""
        return self._pool.submit(self._verify, path)

    def _verify(self, path: Path) -> list[Verification]:
        manifests = find_manifests(path)
        if not manifests:
            self._event(
                time.time(),
                "checkpoint_verified",
                {"path": str(path), "ok": False, "problems": [{"what": "no_manifest", "path": str(path)}]},
            )
            return []
        results = []
        for m in manifests:
            try:
                result = verify_manifest(m)
            except ManifestError as exc:
                self._event(
                    time.time(),
                    "checkpoint_verified",
                    {"path": str(m), "ok": False, "problems": [{"what": "bad_manifest", "detail": str(exc)}]},
                )
                continue
            results.append(result)
            self._event(time.time(), "checkpoint_verified", verification_data(result))
        return results

    def wait(self, timeout: float | None = None) -> None:
        """Wait for hashing and verification in flight (at finish, so no completion is lost)."""
        for future in self._futures:
            future.exception(timeout)
        self._futures.clear()

    def close(self, timeout: float | None = None) -> None:
        self.wait(timeout)
        self._pool.shutdown(wait=True)


def verification_data(result: Verification) -> dict[str, Any]:
    """The ``checkpoint_verified`` event data of one verified manifest."""
    return {
        "step": result.step,
        "ok": result.ok,
        "manifest": str(result.manifest),
        "checkpoint_rank": result.rank,
        "files": result.files,
        "bytes": result.bytes,
        "problems": [
            {"path": p.path, "what": p.what, "detail": p.detail} for p in result.problems[:_MAX_PROBLEMS]
        ],
    }


class CheckpointScope:
    """``with run.checkpoint(step, path):`` around any save; reports start, end or failure."""

    def __init__(
        self, reporter: CheckpointReporter, step: int, path: Path, files: FileSelector | None = None
    ) -> None:
        self.reporter = reporter
        self.step = step
        self.path = path
        self.files = files
        self.started = 0.0
        self.future: Future[Any] | None = None

    def __enter__(self) -> CheckpointScope:
        self.started = self.reporter.started(self.step, self.path)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            self.reporter.failed(self.step, self.path, self.started, f"{type(exc).__name__}: {exc}")
            return
        self.future = self.reporter.saved(self.step, self.path, self.started, self.files)


def dcp_rank_files(rank: int) -> FileSelector:
    """The files ``torch.distributed.checkpoint`` writes for ``rank`` (rank 0 also owns ``.metadata``)."""

    def select(directory: Path) -> list[Path]:
        mine = sorted(p for p in directory.iterdir() if p.is_file() and p.name.startswith(f"__{rank}_"))
        meta = directory / ".metadata"
        if rank == 0 and meta.is_file():
            mine.append(meta)
        return mine

    return select
