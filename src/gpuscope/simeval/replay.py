"""``gpuscope replay``: recorded training records through the hub's detectors in virtual time.

Users evaluate a past incident by replaying what their jobs reported. The input is either

* CSV with the columns ``ts,job,rank,step``, optional ``node,gpu``, and one column per metric
  (``step_seconds``, ``loss``, ``grad_norm``, ...; an empty cell is a metric not reported), or
* JSON Lines, one training record of the ingest payload per line (``{"ts":..., "job":...,
  "rank":..., "step":..., "metrics": {...}, "labels": {...}}``), parsed by the ingest code.

A bad row is refused with the file, line and field named and counted; the other rows are kept.
Records are fed in time order through the same hub code as ``sim-eval`` (wire round trip,
ingest, detection, alerting), evaluating at every distinct second of the data, and the output has
``sim-eval --json``'s shape (DESIGN §5) plus what was refused.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

import orjson

from gpuscope.hub import Hub
from gpuscope.ingest.payload import PayloadError, batch_to_json, parse_batch, parse_training
from gpuscope.model import Alert, Batch, TrainingRecord
from gpuscope.simeval.runner import alerts_document, notices
from gpuscope.store.duckdb import DuckDBStore

REQUIRED = ("ts", "job", "rank", "step")
PLACEMENT = ("node", "gpu")
_BATCH = 5000  # records per ingested batch (well under the ingest limit)


class ReplayError(ValueError):
    """The file cannot be replayed at all (unreadable, or a CSV header without a required column)."""


@dataclass(slots=True)
class Records:
    records: list[TrainingRecord] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # "file:line: field: problem"


def _refuse(out: Records, path: Path, line: int, fieldname: str, problem: str) -> None:
    out.refused.append(f"{path}:{line}: {fieldname}: {problem}")


def _number(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text!r} is infinite")
    return value


def _csv(path: Path, lines: Iterator[str], out: Records) -> None:
    reader = csv.DictReader(lines)
    header = reader.fieldnames or []
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        needs = ",".join(REQUIRED)
        raise ReplayError(
            f"{path}:1: the header lacks the column(s) {', '.join(missing)} (needs {needs}, "
            f"comma-separated; read {','.join(header)!r})"
        )
    metrics = [c for c in header if c not in REQUIRED and c not in PLACEMENT]
    for row in reader:
        line = reader.line_num
        if None in row:  # more cells than the header names: which column a value belongs to is a guess
            cells = len(header) + len(row[None])
            _refuse(out, path, line, "row", f"{cells} cells, the header names {len(header)} columns")
            continue
        try:
            ts = _number(row["ts"] or "")
        except ValueError:
            ts = math.nan
        if not math.isfinite(ts):
            _refuse(out, path, line, "ts", f"{row['ts']!r} is not a finite number of seconds")
            continue
        job = (row["job"] or "").strip()
        if not job:
            _refuse(out, path, line, "job", "is empty")
            continue
        ints: dict[str, int] = {}
        for name in ("rank", "step"):
            text = (row[name] or "").strip()
            if not text.isdigit():
                _refuse(out, path, line, name, f"{text!r} is not a non-negative integer")
                break
            ints[name] = int(text)
        if len(ints) < 2:
            continue
        values: dict[str, float] = {}
        bad = None
        for name in metrics:
            text = (row.get(name) or "").strip()
            if not text:
                continue
            try:
                values[name] = _number(text)
            except ValueError:
                bad = (name, f"{text!r} is not a number")
                break
        if bad is not None:
            _refuse(out, path, line, *bad)
            continue
        labels = {k: str(row[k]).strip() for k in PLACEMENT if k in header and (row[k] or "").strip()}
        out.records.append(TrainingRecord(ts, job, ints["rank"], ints["step"], values, labels))


def _jsonl(path: Path, lines: Iterator[str], out: Records) -> None:
    for line, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            out.records.append(parse_training(orjson.loads(text), "record"))
        except orjson.JSONDecodeError as exc:
            _refuse(out, path, line, "record", f"not JSON ({exc})")
        except PayloadError as exc:
            _refuse(out, path, line, exc.field, exc.message)


def load_records(path: Path) -> Records:
    """Every record of a CSV or JSON Lines file, and every row refused with its place and field."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # spreadsheets write a byte-order mark first
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplayError(f"{path}: cannot be read ({exc})") from exc
    out = Records()
    lines = iter(text.splitlines())
    if path.suffix in (".jsonl", ".ndjson") or text.lstrip().startswith("{"):
        _jsonl(path, lines, out)
    else:
        _csv(path, lines, out)
    return out


def replay(records: list[TrainingRecord]) -> tuple[list[Alert], dict[str, int]]:
    """Feed the records in time order through a hub; every alert raised and the hub's counters."""
    store = DuckDBStore(":memory:", durable=False)
    hub = Hub(store)
    try:
        ordered = sorted(records, key=lambda r: r.ts)
        for second, group in groupby(ordered, key=lambda r: math.floor(r.ts)):
            chunk = list(group)
            for i in range(0, len(chunk), _BATCH):
                hub.ingest(parse_batch(batch_to_json(Batch("replay", training=chunk[i : i + _BATCH]))))
            hub.evaluate(float(second) + 1.0)
        if ordered:
            hub.evaluate(math.floor(ordered[-1].ts) + 1.0)
        alerts = sorted(hub.alerts.all(), key=lambda a: (a.started_at, a.id))
        return alerts, hub.counters.snapshot()
    finally:
        store.close()


def replay_document(path: Path) -> dict[str, Any]:
    """``gpuscope replay FILE --json``: sim-eval's output shape, with what was refused."""
    loaded = load_records(path)
    alerts, _ = replay(loaded.records)
    times = [r.ts for r in loaded.records]
    span = max(times) - min(times) if times else 0.0
    doc = alerts_document(path.stem, span, notices(alerts))
    doc["records"] = len(loaded.records)
    doc["refused"] = loaded.refused
    return doc
