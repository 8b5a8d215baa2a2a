"""A learner's share of a data-parallel group: which rows of every batch are its own, and how the
group's gradients and metrics are summed. The learner knows its rank and the group's size, nothing
more; the runtime (runtime/group.py) starts the processes and the torch.distributed group.

Every rank sees the whole batch and takes whole groups of it; each micro-batch's loss is weighted by
its share of the *whole* batch's rows, so the sum of the ranks' gradients is the one-process step's
gradient, and every rank applies the same update to the same weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

BUCKET_ELEMENTS = 2**24  # gradients all-reduced 64 MiB (fp32) at a time: one buffer, not one call per tensor


def my_rows(sources: list[str], rank: int, world: int, group_size: Callable[[str], int]) -> list[int]:
    """Row indices of rank `rank`: each source's groups (runs of `group_size(source)` rows) dealt out
    in `world` contiguous pieces, as even as whole groups allow."""
    mine: list[int] = []
    by_source: dict[str, list[int]] = {}
    for i, source in enumerate(sources):
        by_source.setdefault(source, []).append(i)
    for source, index in by_source.items():
        n = group_size(source)
        groups = [index[g : g + n] for g in range(0, len(index), n)]
        lo, hi = rank * len(groups) // world, (rank + 1) * len(groups) // world
        mine += sum(groups[lo:hi], [])
    return sorted(mine)


def sum_gradients(params: list[Tensor]) -> None:
    """Each gradient becomes the sum of the group's, in buckets. A parameter no rank has a gradient for
    keeps none (AdamW then skips it, as one process would); one that only some ranks have a gradient
    for gets zeros from the others."""
    device = params[0].device if params else torch.device("cpu")
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
    dist.all_reduce(has, op=dist.ReduceOp.MAX)
    used = [p for p, anyone in zip(params, has.tolist()) if anyone]
    for p in used:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for bucket in _buckets([p.grad for p in used]):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat)
        for g, part in zip(bucket, flat.split([g.numel() for g in bucket])):
            g.copy_(part.view_as(g))


def _buckets(grads: list[Tensor]) -> list[list[Tensor]]:
    buckets: list[list[Tensor]] = []
    size = 0
    for g in grads:
        if not buckets or size + g.numel() > BUCKET_ELEMENTS or buckets[-1][0].dtype != g.dtype:
            buckets.append([])
            size = 0
        buckets[-1].append(g)
        size += g.numel()
    return buckets


def sum_metrics(metrics: dict[str, Tensor]) -> dict[str, Tensor]:
    """The group's metrics: each rank's share summed (a rank may lack a key: its source was not in
    its rows), maxima (`.../max`) maximised. One exchange per step, on the host."""
    mine = {k: float(v) for k, v in metrics.items()}
    everyone: list[dict[str, float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    out: dict[str, float] = {}
    for part in everyone:
        for key, value in (part or {}).items():
            if key not in out:
                out[key] = value
            else:
                out[key] = max(out[key], value) if key.endswith("/max") else out[key] + value
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in out.items()}
