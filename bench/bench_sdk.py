"""Training SDK cost: ``run.log`` with 3 metrics beside ``wandb.log`` (offline) and ``mlflow.log_metrics``,
all in this run; then the slowdown of a real small PyTorch training loop that reports every step.

Budgets (DESIGN §6): ``log`` ≤ 2 µs on the training thread; slowdown of the loop ≤ 1 %. The SDK
ships to a real hub process over HTTP, so its background thread runs (and competes for the GIL)
as in production. wandb, mlflow and torch are optional: each missing one
is reported as skipped.

usage: python bench/bench_sdk.py [--calls 200000] [--steps 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import gpuscope_hub, per_call_us, print_table

LOG_BUDGET_US = 2.0
SLOWDOWN_BUDGET = 0.01


@contextlib.contextmanager
def hub_process(tmp: Path) -> Iterator[str]:
    """A real hub in its own process, as in production (not competing for this process's GIL)."""
    with gpuscope_hub(tmp / "hub.duckdb") as (url, _):
        yield url


def bench_gpuscope(hub: str, tmp: Path, calls: int) -> float:
    import gpuscope

    run = gpuscope.init(job="bench-log", hub=hub, state_dir=tmp / "sdk", capacity=10 * calls)

    def loop(n: int) -> None:
        log = run.log
        for i in range(n):
            log(i, loss=0.5, learning_rate=3e-4, grad_norm=1.25)

    us = per_call_us(loop, calls)
    run.finish()
    if run.stats()["dropped_records"]:
        raise RuntimeError(f"gpuscope dropped records in the benchmark: {run.stats()}")
    return us


def bench_wandb(tmp: Path, calls: int) -> float | None:
    if importlib.util.find_spec("wandb") is None:
        return None
    import wandb

    os.environ["WANDB_SILENT"] = "true"
    run = wandb.init(mode="offline", dir=str(tmp), project="bench")

    def loop(n: int) -> None:
        for _ in range(n):
            run.log({"loss": 0.5, "learning_rate": 3e-4, "grad_norm": 1.25})

    us = per_call_us(loop, calls, repeats=3)
    run.finish()
    return us


def bench_mlflow(tmp: Path, calls: int, synchronous: bool) -> float | None:
    if importlib.util.find_spec("mlflow") is None:
        return None
    import mlflow

    logging.getLogger("mlflow").setLevel(logging.ERROR)
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # a local file store: no server, no database to install
    mlflow.set_tracking_uri((tmp / "mlruns").as_uri())
    with mlflow.start_run():

        def loop(n: int) -> None:
            for i in range(n):
                mlflow.log_metrics(
                    {"loss": 0.5, "learning_rate": 3e-4, "grad_norm": 1.25}, step=i, synchronous=synchronous
                )

        us = per_call_us(loop, calls, repeats=3)
        if not synchronous:
            mlflow.flush_async_logging()
    return us


def bench_training(hub: str, tmp: Path, steps: int, rounds: int = 24) -> dict[str, Any] | None:
    """Alternating rounds of the same loop without and with the SDK; median time per step of each."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    import gpuscope

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(128, 512), torch.randn(128, 512)

    def step() -> Any:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    run = gpuscope.init(job="bench-loop", hub=hub, state_dir=tmp / "loop", memory_interval=None)
    plain, with_sdk = [], []
    for _ in range(20):
        step()  # warm up
    for r in range(rounds):
        for use_sdk in (r % 2 == 0, r % 2 == 1):
            t0 = time.perf_counter()
            for i in range(steps):
                if use_sdk:
                    with run.step(samples=128):
                        loss = step()
                    run.log(r * steps + i, loss=loss.detach(), learning_rate=1e-3)
                else:
                    loss = step()
            (with_sdk if use_sdk else plain).append((time.perf_counter() - t0) / steps)
    run.finish()
    base, sdk = statistics.median(plain), statistics.median(with_sdk)
    return {"step_ms": base * 1e3, "step_ms_sdk": sdk * 1e3, "slowdown": sdk / base - 1.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="log calls per gpuscope round")
    parser.add_argument("--anchor-calls", type=int, default=2_000, help="log calls per wandb/mlflow round")
    parser.add_argument("--steps", type=int, default=50, help="training steps per round")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with hub_process(tmp) as hub:
            results["gpuscope_log_us"] = bench_gpuscope(hub, tmp, args.calls)
            results["wandb_offline_log_us"] = bench_wandb(tmp, args.anchor_calls)
            results["mlflow_async_log_us"] = bench_mlflow(tmp, args.anchor_calls, synchronous=False)
            results["mlflow_sync_log_us"] = bench_mlflow(tmp, args.anchor_calls // 4, synchronous=True)
            results["training"] = bench_training(hub, tmp, args.steps)

    def us(v: float | None) -> str:
        return "skipped (not installed)" if v is None else f"{v:,.2f} µs"

    rows = [
        ["gpuscope run.log (3 metrics)", us(results["gpuscope_log_us"]), f"≤ {LOG_BUDGET_US} µs"],
        ["wandb.log, offline", us(results["wandb_offline_log_us"]), "anchor"],
        ["mlflow.log_metrics, async", us(results["mlflow_async_log_us"]), "anchor"],
        ["mlflow.log_metrics, sync", us(results["mlflow_sync_log_us"]), "anchor"],
    ]
    training = results["training"]
    if training is None:
        rows.append(["training loop slowdown", "skipped (torch not installed)", "≤ 1 %"])
    else:
        rows.append(
            [
                "training loop slowdown",
                f"{training['slowdown'] * 100:+.2f} % "
                f"({training['step_ms']:.2f} → {training['step_ms_sdk']:.2f} ms per step)",
                "≤ 1 %",
            ]
        )
    print_table("Training SDK: cost on the training thread", ["what", "measured", "budget"], rows)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    ok = results["gpuscope_log_us"] <= LOG_BUDGET_US and (
        training is None or training["slowdown"] <= SLOWDOWN_BUDGET
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
