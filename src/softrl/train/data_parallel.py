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


def groups_by_source(sources: list[str], group_size: Callable[[str], int]) -> dict[str, list[list[int]]]:
    """Each source's row indices in groups: runs of `group_size(source)` of its rows, in order."""
    by_source: dict[str, list[int]] = {}
    for i, source in enumerate(sources):
        by_source.setdefault(source, []).append(i)
    return {source: [index[g : g + group_size(source)] for g in range(0, len(index), group_size(source))]
            for source, index in by_source.items()}


def my_rows(sources: list[str], rank: int, world: int, group_size: Callable[[str], int]) -> list[int]:
    """Row indices of rank `rank`: each source's groups dealt out in `world` contiguous pieces, as even
    as whole groups allow."""
    mine: list[int] = []
    for groups in groups_by_source(sources, group_size).values():
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
    for bucket in buckets([p.grad for p in used], BUCKET_ELEMENTS, split_dtypes=True):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat)
        for g, part in zip(bucket, flat.split([g.numel() for g in bucket])):
            g.copy_(part.view_as(g))


def buckets(tensors: list[Tensor], max_elements: int, split_dtypes: bool = False) -> list[list[Tensor]]:
    """Consecutive tensors, at most `max_elements` a bucket (a larger tensor alone), and with
    `split_dtypes` one dtype a bucket (a bucket is concatenated into one buffer)."""
    out: list[list[Tensor]] = []
    size = 0
    for t in tensors:
        if not out or size + t.numel() > max_elements or (split_dtypes and out[-1][0].dtype != t.dtype):
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return out


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
