"""The ranks of a small DDP job over gloo, reporting through the SDK (run by test_sdk_ddp.py).

One process imports torch and the SDK, then forks one process per rank (``RANKS``: JSON of rank ->
[node, local rank, log file]): three imports of torch on two cores cost more than the rest of a
test. Each rank sees the environment torchrun gives its ranks (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) with GPUSCOPE_HUB / GPUSCOPE_JOB / GPUSCOPE_NODE set, before it calls
``gpuscope.init``. The parent writes ``rank exit-code`` to ``STATUS_FILE`` as each rank ends (a
signal's exit code is minus its number) and exits when all have. ``MODE`` injects the fault under test into
rank ``FAULT_RANK``: ``hang`` (alive but stuck before the step's collective), ``kill`` (SIGKILL
mid-step), ``slow`` (late to every collective), ``healthy`` (none).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import gpuscope


def main() -> int:
    mode, steps = os.environ["MODE"], int(os.environ["STEPS"])
    fault_rank, fault_step = int(os.environ.get("FAULT_RANK", "-1")), int(os.environ.get("FAULT_STEP", "-1"))
    step_sleep = float(os.environ.get("STEP_SLEEP", "0.08"))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    run = gpuscope.init(flush_interval=0.1, peak_flops=1e12, flops_per_step=1e9)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    run.track_collectives(grad_norm=True).install(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    ckpt_dir = os.environ.get("CKPT_DIR")
    try:
        for step in range(steps):
            with run.step(step, samples=16):
                with run.data_wait():
                    x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 1, generator=gen)
                if rank == fault_rank and step >= fault_step:
                    if mode == "hang" and step == fault_step:
                        time.sleep(600)  # alive (heartbeats go on) but never reaches the collective
                    if mode == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                if rank == fault_rank and mode == "slow":
                    time.sleep(0.15)
                time.sleep(step_sleep)
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            run.log(step, loss=loss.item(), learning_rate=0.01)
            if ckpt_dir and step == steps // 2:
                run.dcp_save(
                    {"model": model.module.state_dict()}, os.path.join(ckpt_dir, f"step-{step}"), step
                )
    except RuntimeError as exc:  # a peer died: wait like an NCCL job would, still heartbeating
        print(f"rank {rank}: collective failed: {exc}", file=sys.stderr, flush=True)
        time.sleep(float(os.environ.get("HOLD_AFTER_ERROR", "120")))
        return 1
    run.finish()
    dist.destroy_process_group()
    return 0


def launch() -> None:
    if os.environ.get("CKPT_DIR"):
        # what run.dcp_save imports, once for the three ranks
        importlib.import_module("torch.distributed.checkpoint")
    # a fork copies only the calling thread: a thread started by an import would be missing in the ranks
    assert threading.active_count() == 1, threading.enumerate()
    pids: dict[int, int] = {}
    for rank, (node, local, log) in json.loads(os.environ["RANKS"]).items():
        pid = os.fork()
        if pid == 0:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.environ.update(RANK=rank, LOCAL_RANK=str(local), GPUSCOPE_NODE=node)
            code = 1
            try:
                code = main()
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids[pid] = int(rank)
    with open(os.environ["STATUS_FILE"], "a") as status:
        while pids:
            pid, wait_status = os.wait()
            status.write(f"{pids.pop(pid)} {os.waitstatus_to_exitcode(wait_status)}\n")
            status.flush()


if __name__ == "__main__":
    launch()
