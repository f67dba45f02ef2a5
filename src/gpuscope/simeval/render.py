"""Rich rendering of an evaluation report (stderr; stdout carries the JSON contract)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from gpuscope.simeval.report import Report


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def print_report(report: Report, console: Console) -> None:
    table = Table(title="faults injected", show_lines=False)
    for col in ("kind", "target", "at", "rule", "detected", "time to detect"):
        table.add_column(col)
    for o in report.outcomes:
        target = ",".join(f"{k}={v}" for k, v in o.fault.target.items())
        mark = "[green]yes[/green]" if o.alert_id else "[red]MISSED[/red]"
        if o.missed_because:
            mark += f" ({o.missed_because})"
        table.add_row(o.fault.kind, target, f"{o.fault.at:.0f}", o.rule, mark, _fmt(o.time_to_detect))
    if report.outcomes:
        console.print(table)
    for alert in report.unexplained:
        console.print(
            f"[yellow]unexplained {alert.severity} {alert.rule}[/yellow] at {alert.started_at:.0f}s "
            f"{alert.entity}: {alert.summary}"
        )
    console.print(
        f"recall {report.recall:.2f}  precision {report.precision:.2f}  alerts {report.alerts}  "
        f"hard-fault TTD p50 {_fmt(report.percentile(0.5))} p95 {_fmt(report.percentile(0.95))}  "
        f"false P1/P2 {len(report.false_p1p2)}"
        + (
            f" ({report.false_per_1000_gpu_hours():.2f} per 1,000 healthy GPU-hours)"
            if report.healthy_gpu_hours
            else ""
        )
    )


def print_gpu_hours(hours: dict[str, Any], console: Console) -> None:
    """GPU-hours per state, measured by the hub vs the simulator's truth."""
    table = Table(title=f"GPU-hours per state ({hours['total_gpu_hours']:.2f} in all)")
    for col in ("state", "true", "measured", "error (% of all)"):
        table.add_column(col)
    for state, row in hours["states"].items():
        table.add_row(state, f"{row['true']:.3f}", f"{row['measured']:.3f}", f"{row['error_pct']:.2f}")
    console.print(table)
