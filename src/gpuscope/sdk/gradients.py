"""Gradient norm of one rank, computed without leaving the device (no sync on the training thread)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def grad_norm(parameters: Iterable[Any]) -> Any:
    """The L2 norm over all gradients of ``parameters`` (a module's ``.parameters()``), as a tensor.

    Same value as ``torch.nn.utils.clip_grad_norm_`` returns, without clipping.
    """
    import torch

    norms = [p.grad.detach().norm(2) for p in parameters if getattr(p, "grad", None) is not None]
    if not norms:
        return torch.tensor(0.0)
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))
