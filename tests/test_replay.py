"""``gpuscope replay``: recorded training records through the hub's detectors, sim-eval's output."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from gpuscope.cli import main
from gpuscope.simeval.replay import ReplayError, load_records, replay_document

WORLD = 8


def rows(slow_rank: int = 5, slow_from: int = 200, steps: int = 400) -> list[dict[str, object]]:
    """A synchronous job: every rank reports its own compute time; one rank slows 1.3x."""
    rng = np.random.default_rng(7)
    out: list[dict[str, object]] = []
    for k in range(steps):
        for r in range(WORLD):
            factor = 1.3 if r == slow_rank and k >= slow_from else 1.0
            seconds = 1.0 * factor * (1.0 + 0.01 * abs(float(rng.standard_normal())))
            out.append(
                {
                    "ts": float(k),
                    "job": "llm",
                    "rank": r,
                    "step": k,
                    "node": f"n{r // 4}",
                    "gpu": r % 4,
                    "step_seconds": round(seconds, 4),
                    "loss": round(3.0 - k / 1000, 4),
                }
            )
    return out


def write_csv(path: Path, data: list[dict[str, object]], extra: str = "") -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(data[0]))
        w.writeheader()
        w.writerows(data)
        f.write(extra)
    return path


def test_a_csv_straggler_is_found_in_sim_evals_output_shape(tmp_path: Path) -> None:
    doc = replay_document(write_csv(tmp_path / "run.csv", rows()))
    assert {"scenario", "simulated_seconds", "alerts"} <= set(doc) and doc["scenario"] == "run"
    assert doc["records"] == 400 * WORLD and doc["refused"] == []
    stragglers = [a for a in doc["alerts"] if a["rule"] == "training_straggler"]
    assert [a["entity"] for a in stragglers] == [{"job": "llm", "rank": "5", "node": "n1", "gpu": "1"}]
    assert 200 <= stragglers[0]["started_at"] <= 215
    assert {
        "rule",
        "severity",
        "started_at",
        "resolved_at",
        "entity",
        "summary",
        "incident",
        "cost_per_hour",
    } == set(stragglers[0])


def test_bad_rows_are_refused_with_file_line_and_field_and_the_rest_kept(tmp_path: Path) -> None:
    data = rows(steps=50)
    path = write_csv(
        tmp_path / "bad.csv",
        data,
        "51,llm,x,51,n0,0,1.0,2.9\n52,llm,0,52,n0,0,fast,2.9\nsoon,llm,0,53,n0,0,1.0,2.9\n54,,0,54,n0,0,1.0,2.9\n",
    )
    loaded = load_records(path)
    assert len(loaded.records) == 50 * WORLD
    first = 50 * WORLD + 2  # the header is line 1
    assert loaded.refused == [
        f"{path}:{first}: rank: 'x' is not a non-negative integer",
        f"{path}:{first + 1}: step_seconds: 'fast' is not a number",
        f"{path}:{first + 2}: ts: 'soon' is not a finite number of seconds",
        f"{path}:{first + 3}: job: is empty",
    ]


def test_a_row_with_more_cells_than_the_header_is_refused(tmp_path: Path) -> None:
    """Seen: ``6,llm,0,6,n0,0,1.0,2.9,7`` was kept with its extra cell dropped; a row short of
    cells keeps what it has (the missing metrics were not reported)."""
    data = rows(steps=5)
    path = write_csv(tmp_path / "wide.csv", data, "5,llm,0,5,n0,0,1.0,2.9,7\n6,llm,0,6,n0,0,1.0\n")
    loaded = load_records(path)
    assert loaded.refused == [f"{path}:{5 * WORLD + 2}: row: 9 cells, the header names 8 columns"]
    assert len(loaded.records) == 5 * WORLD + 1
    assert loaded.records[-1].metrics == {"step_seconds": 1.0}


def test_a_header_without_a_required_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nohead.csv"
    path.write_text("time,job,rank,step_seconds\n1,llm,0,1.0\n")
    with pytest.raises(ReplayError, match=r"nohead.csv:1: the header lacks the column\(s\) ts, step"):
        load_records(path)
    assert main(["replay", str(path), "--json"]) == 2


def test_a_spreadsheet_s_byte_order_mark_is_no_part_of_the_header(tmp_path: Path) -> None:
    """Seen: a CSV saved by a spreadsheet as UTF-8 was refused for lacking the column ts."""
    path = tmp_path / "excel.csv"
    path.write_bytes("ts,job,rank,step,loss\r\n1,llm,0,1,2.5\r\n".encode("utf-8-sig"))
    loaded = load_records(path)
    assert loaded.refused == [] and [(r.ts, r.job, r.metrics) for r in loaded.records] == [
        (1.0, "llm", {"loss": 2.5})
    ]


def test_a_header_in_another_separator_is_shown_as_read(tmp_path: Path) -> None:
    path = tmp_path / "semi.csv"
    path.write_text("ts;job;rank;step;loss\n1;llm;0;1;2.5\n")
    with pytest.raises(ReplayError, match=r"comma-separated; read 'ts;job;rank;step;loss'\)$"):
        load_records(path)


def test_json_lines_of_ingest_records_replay_the_same_and_the_cli_prints_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.jsonl"
    lines = [
        json.dumps(
            {
                "ts": r["ts"],
                "job": r["job"],
                "rank": r["rank"],
                "step": r["step"],
                "metrics": {"step_seconds": r["step_seconds"], "loss": r["loss"]},
                "labels": {"node": r["node"], "gpu": str(r["gpu"])},
            }
        )
        for r in rows()
    ]
    lines.insert(10, '{"ts": 1, "job": "llm", "rank": -1, "step": 0}')
    path.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["refused"] == [f"{path}:11: record.rank: must be a non-negative integer"]
    assert [a["entity"]["rank"] for a in doc["alerts"] if a["rule"] == "training_straggler"] == ["5"]
