"""A learner's share of a data-parallel group: which rows of every batch are its own, its shards
of the trained weights (FSDP2), and how the group's metrics are summed. The learner knows its rank
and the group's size, nothing more; the runtime (runtime/group.py) starts the processes and the
torch.distributed group.

Every rank sees the whole batch and takes whole groups of it; each micro-batch's loss is weighted by
its share of the *whole* batch's rows, so the sum of the ranks' gradients is the one-process step's
gradient, and every rank applies the same update to its shard of the same weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor


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


class Shards(nn.Module):
    """The trained modules of a learner group as FSDP2 shards (`torch.distributed.fsdp.fully_shard`):
    every rank keeps 1/world of each parameter, of its gradient and so of AdamW's state. Each
    transformer block (the model's `_no_split_modules`) is a unit of its own, gathered just for its
    forward and backward; the rest (embeddings, final norm, output layer, value head) is the root's.

    A forward pass runs as `shards(fn, *args)`: the root's parameters are gathered however `fn` calls
    into the models (the learner's log-probs call the decoder and the output layer apart, which the
    model's own forward would have gathered). Gradients are summed across ranks, not averaged: each
    rank's loss is already weighted by its share of the whole batch."""

    def __init__(self, policy: nn.Module, value: nn.Module | None, device: torch.device, world: int):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        super().__init__()
        self.policy, self.value = policy, value
        mesh = init_device_mesh(device.type, (world,))
        blocks = block_classes(self)
        units = [m for m in self.modules() if type(m).__name__ in blocks]
        for unit in units:
            fully_shard(unit, mesh=mesh)
        fully_shard(self, mesh=mesh)
        for unit in units + [self]:
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum

    def forward(self, fn: Callable, *args):
        return fn(*args)

    def publish(self, serving: nn.Module | None) -> None:
        """The whole trained policy into `serving` (rank 0's copy for generation, evaluation and saving;
        None on the other ranks, which only take part in gathering it)."""
        mine = dict(serving.named_parameters()) if serving is not None else {}
        with torch.no_grad():
            for name, p in self.policy.named_parameters():
                if not p.requires_grad:  # frozen (LoRA's base weights): as they were
                    continue
                everything = whole(p)
                if serving is not None:
                    mine[name].copy_(everything)

    def load(self, serving: nn.Module | None, value_state: dict | None) -> None:
        """Rank 0's whole weights (`serving`, and a value model's state) sharded onto every rank."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.policy, serving.state_dict() if serving is not None else {}, options=options)
        if self.value is not None:
            set_model_state_dict(self.value, value_state or {}, options=options)

    def value_state(self) -> dict:
        """The value model's whole state, on the host (every rank takes part; all get it)."""
        return {k: whole(v).cpu() for k, v in self.value.state_dict().items()}

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """AdamW's whole state on rank 0's host, keyed as one process's `optimizer.state_dict()` is (by
        position), so a checkpoint resumes with any number of learners."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        named = get_optimizer_state_dict(self, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() != 0:
            return None
        position = {name: i for i, name in enumerate(self._names(optimizer))}
        return {"state": {position[name]: state for name, state in named["state"].items()},
                "param_groups": [{**g, "params": [position[n] for n in g["params"]]} for g in named["param_groups"]]}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict | None) -> None:
        """`optimizer_state`'s inverse: rank 0's whole state (None elsewhere) sharded onto every rank."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        named = {}
        if state is not None:
            names = self._names(optimizer)
            named = {"state": {names[i]: s for i, s in state["state"].items()},
                     "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
        set_optimizer_state_dict(self, optimizer, named,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

    def _names(self, optimizer: torch.optim.Optimizer) -> list[str]:
        """The optimizer's parameters' names in `self`, in its order."""
        names = {id(p): name for name, p in self.named_parameters()}
        return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def block_classes(module: nn.Module) -> set[str]:
    """The class names of the transformer blocks of the Hugging Face models in `module`."""
    return {name for m in module.modules() for name in (getattr(m, "_no_split_modules", None) or [])}


def same_layout(pieces: list, device: torch.device) -> list:
    """`pieces` (micro-batches, `train.batch.Batch`) with the shared-prompt layout kept only where every
    rank's piece at that place has one. That layout runs the decoder twice (the prompts, then the
    responses from their cache), the padded one once, and the shards' collectives pair up pass by pass
    across ranks. One small all-reduce a step."""
    import dataclasses

    def twice(piece) -> bool:
        shared = piece.padded.shared
        return shared is not None and shared.response_ids.shape[1] > 0

    agreed = torch.tensor([twice(p) for p in pieces], dtype=torch.int32, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return [p if keep else dataclasses.replace(p, padded=dataclasses.replace(p.padded, shared=None))
            for p, keep in zip(pieces, agreed.tolist())]


def whole(t: Tensor) -> Tensor:
    """A sharded (DTensor) tensor as an ordinary one, all of it (every rank takes part)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def same_as_rank_0(modules: list[nn.Module | None]) -> None:
    """Rank 0's weights (and buffers) in every rank's `modules`, before they are sharded: a model built
    on each rank need not be bit-equal (LoRA's random initialisation)."""
    with torch.no_grad():
        for module in filter(None, modules):
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor.data, src=0)
