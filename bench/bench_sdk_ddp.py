"""Training SDK cost on a real DDP loop under torchrun: the same loop with and without the SDK.

Each rank (gloo, CPU) alternates rounds of the same seeded loop: ``plain`` (DDP alone; the anchor)
and ``sdk`` (``gpuscope.init`` as in the README: ``run.step``, ``run.log`` every step, collective
timing installed by itself on the DDP model, last words, shipping to a real hub process). Both
modes start each round from the same weights and data, so their losses must be bit-identical.
Two step sizes: ``slow`` (0.3 s steps: a small model plus a wait standing in for a bigger one) and
``fast`` (about 20 ms of compute per step). Budgets: slowdown ≤ 1 % at 0.3 s, ≤ 3 % at 20 ms.

usage: python bench/bench_sdk_ddp.py [--ranks 2] [--rounds 4] [--steps 40] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BUDGETS = {"slow": 0.01, "fast": 0.03}
#: (hidden width, sleep seconds per step)
SHAPES = {"slow": (256, 0.29), "fast": (1536, 0.0)}
#: gpuscope.init options under study (BENCH_SDK_OPTIONS='{"collectives": false}'); README defaults
OPTIONS: dict[str, Any] = json.loads(os.environ.get("BENCH_SDK_OPTIONS", "{}"))
#: step sizes to run (BENCH_SHAPES=fast)
RUN_SHAPES = os.environ.get("BENCH_SHAPES", ",".join(SHAPES)).split(",")


def worker(out: Path, rounds: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import gpuscope

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result: dict[str, Any] = {}
    for shape in RUN_SHAPES:
        width, pause = SHAPES[shape]
        for r in range(rounds):
            for mode in ("plain", "sdk") if r % 2 == 0 else ("sdk", "plain"):
                torch.manual_seed(0)
                net = nn.Sequential(nn.Linear(512, width), nn.ReLU(), nn.Linear(width, 1))
                model = DistributedDataParallel(net)
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                gen = torch.Generator().manual_seed(rank)
                run = gpuscope.init(job=f"bench-ddp-{shape}-{r}", **OPTIONS) if mode == "sdk" else None
                losses: list[float] = []
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                for step in range(steps):
                    x, y = torch.randn(64, 512, generator=gen), torch.randn(64, 1, generator=gen)
                    with run.step(step) if run is not None else contextlib.nullcontext():
                        if pause:
                            time.sleep(pause)
                        loss = nn.functional.mse_loss(model(x), y)
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                        value = loss.item()
                    if run is not None:
                        run.log(step, loss=value)
                    losses.append(value)
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                if run is not None:
                    run.finish()
                row = result.setdefault(shape, {"plain": [], "sdk": [], "cpu": {"plain": [], "sdk": []}})
                row.setdefault("losses", {})
                row[mode].append(seconds / steps)
                row["cpu"][mode].append(cpu / steps)
                row["losses"].setdefault(str(r), {})[mode] = losses
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4, help="rounds per mode and step size")
    parser.add_argument("--steps", type=int, default=40, help="steps per round")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.rounds, args.steps)
        return 0
    sys.path.insert(0, str(Path(__file__).parent))
    from common import gpuscope_hub

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        with gpuscope_hub(tmp / "hub.duckdb") as (url, _):
            env = {**os.environ, "GPUSCOPE_HUB": url, "XDG_STATE_HOME": str(tmp / "state")}
            env["OMP_NUM_THREADS"] = "1"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            cmd += ["--nproc-per-node", str(args.ranks), __file__, "--worker", str(tmp)]
            cmd += ["--rounds", str(args.rounds), "--steps", str(args.steps)]
            load_before = os.getloadavg()[0]
            subprocess.run(cmd, env=env, check=True)
            load_after = os.getloadavg()[0]
        ranks = [json.loads((tmp / f"rank-{r}.json").read_text()) for r in range(args.ranks)]
    figures: dict[str, Any] = {"load_average": [round(load_before, 2), round(load_after, 2)]}
    ok = True
    for shape in RUN_SHAPES:
        plain = statistics.median(t for rk in ranks for t in rk[shape]["plain"])
        sdk = statistics.median(t for rk in ranks for t in rk[shape]["sdk"])
        identical = all(pair["plain"] == pair["sdk"] for rk in ranks for pair in rk[shape]["losses"].values())
        slowdown = sdk / plain - 1.0
        cpu_plain = statistics.median(t for rk in ranks for t in rk[shape]["cpu"]["plain"])
        cpu_sdk = statistics.median(t for rk in ranks for t in rk[shape]["cpu"]["sdk"])
        within = slowdown <= BUDGETS[shape]
        ok = ok and identical
        figures[shape] = {
            "plain_step_seconds": round(plain, 5),
            "sdk_step_seconds": round(sdk, 5),
            "slowdown": round(slowdown, 4),
            "plain_cpu_seconds_per_step": round(cpu_plain, 5),
            "sdk_cpu_seconds_per_step": round(cpu_sdk, 5),
            "budget": BUDGETS[shape],
            "within_budget": within,
            "losses_bit_identical": identical,
        }
        print(
            f"{shape}: no SDK {plain * 1e3:.2f} ms/step (anchor), SDK {sdk * 1e3:.2f} ms/step, "
            f"slowdown {slowdown:+.2%} (budget {BUDGETS[shape]:.0%}), losses identical: {identical}; "
            f"CPU per step (all threads) {cpu_plain * 1e3:.2f} -> {cpu_sdk * 1e3:.2f} ms"
        )
    print(f"load average (1 min) before/after: {load_before:.2f} / {load_after:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
