"""A training script written from the README's SDK section, launched by real torchrun.

Nothing but ``gpuscope.init``, ``run.step``, ``run.log`` and ``run.finish``: collective timing and
last words come by themselves. ``MODE`` injects a fault into rank ``FAULT_RANK`` at step
``FAULT_STEP``: ``raise`` (an uncaught RuntimeError), ``kill`` (SIGKILL), ``slow`` (late to every
step's collective by ``SLOW``), ``wait`` (train until terminated from outside), ``clean``.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import gpuscope


def main() -> None:
    mode, steps = os.environ["MODE"], int(os.environ["STEPS"])
    fault_rank, fault_step = int(os.environ.get("FAULT_RANK", "-1")), int(os.environ.get("FAULT_STEP", "-1"))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = gpuscope.init(flush_interval=0.1)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    # one fixed batch per rank: the loss falls smoothly, so no loss rule has anything to say
    x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 1, generator=gen)
    for step in range(steps):
        with run.step(step):
            if rank == fault_rank and step == fault_step:
                if mode == "raise":
                    raise RuntimeError(f"injected fault at step {step}")
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
            if rank == fault_rank and mode == "slow":
                time.sleep(float(os.environ["SLOW"]))
            time.sleep(0.05)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        run.log(step, loss=loss.item())
    run.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
