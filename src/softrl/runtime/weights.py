"""The learner's weights to rollout workers over torch.distributed, in buckets.

Each worker has its own two-process group with the learner (rank 0 the learner, rank 1 the worker;
gloo, or NCCL where both ends are on CUDA), met through a TCP store the learner hosts. A worker that
dies takes only its own channel down; when Ray restarts it, it opens a new channel (a new store
prefix) and receives the current weights. Both ends walk the same model's parameters in the same
order (tied weights once), so only the raw tensors travel: no pickling, no object store.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

BUCKET_ELEMENTS = 2**24  # 64 MiB of fp32 a broadcast
# a worker takes the weights after the batch it is generating: a broadcast may wait that long (a worker
# that dies ends its channel at once: its connection closes)
TIMEOUT = timedelta(minutes=30)


def weight_tensors(model) -> list[Tensor]:
    """The trained tensors of `model`, in a fixed order (a tied weight once; buffers such as rotary
    frequencies never change in training and are left out)."""
    # detached, not .data: a copy into them then counts as a change of the parameter (its _version), which a
    # generator's prefix session reads before reusing keys and values (models/static_generation.py)
    return [p.detach() for p in model.parameters()]


def buckets(tensors: list[Tensor]) -> list[list[Tensor]]:
    """Consecutive tensors, at most BUCKET_ELEMENTS a bucket (a larger tensor alone), split without
    regard to dtype: the same split at both ends, whatever dtype each end stores the weights in."""
    out: list[list[Tensor]] = []
    size = 0
    for t in tensors:
        if not out or size + t.numel() > BUCKET_ELEMENTS:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return out


def _group(store, prefix: str, rank: int, nccl: bool):
    prefixed = dist.PrefixStore(prefix, store)
    if nccl:
        return dist.ProcessGroupNCCL(prefixed, rank, 2)
    return dist.ProcessGroupGloo(prefixed, rank, 2, TIMEOUT)


def _broadcast(group, flat: Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([flat], options).wait()


class WeightSender:
    """The learner's end: hosts the store, one channel per worker."""

    def __init__(self, host: str = "127.0.0.1"):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        self.address = (host, port)
        self.store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        self.channels: dict[int, object] = {}

    def open(self, worker: int, epoch: int, dtype: torch.dtype, nccl: bool = False) -> None:
        """Meet worker `worker`, which stores its weights in `dtype` (blocks until it calls
        `WeightReceiver` with the same epoch)."""
        self.channels.pop(worker, None)
        self.channels[worker] = (_group(self.store, f"worker{worker}-epoch{epoch}", 0, nccl), dtype)

    def send(self, model, workers: list[int]) -> dict[int, bool]:
        """`model`'s weights, in each worker's dtype, to each of `workers` with an open channel; whether
        each got them (a dead worker's channel is closed; it gets a new one when it is back)."""
        pieces = buckets(weight_tensors(model))
        flats: dict[torch.dtype, list[Tensor]] = {}
        done = {}
        for worker in workers:
            group, dtype = self.channels.get(worker, (None, None))
            try:
                if group is None:
                    raise RuntimeError("no channel")
                if dtype not in flats:
                    flats[dtype] = [torch.cat([t.reshape(-1).to(dtype) for t in bucket]) for bucket in pieces]
                for flat in flats[dtype]:
                    _broadcast(group, flat if _on_cuda(group) else flat.cpu())
                done[worker] = True
            except RuntimeError:  # the worker died mid-way: gloo reports the closed connection
                self.channels.pop(worker, None)
                done[worker] = False
        return done


def _on_cuda(group) -> bool:
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    return nccl is not None and isinstance(group, nccl)


class WeightReceiver:
    """A worker's end of its channel."""

    def __init__(self, address: tuple[str, int], worker: int, epoch: int, nccl: bool = False):
        host, port = address
        self.store = dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT)
        self.group = _group(self.store, f"worker{worker}-epoch{epoch}", 1, nccl)

    def receive(self, model, dtype: torch.dtype) -> None:
        """The learner's weights (sent as `dtype`) into `model`, the same architecture as the learner's."""
        nccl = _on_cuda(self.group)
        with torch.no_grad():
            for bucket in buckets(weight_tensors(model)):
                device = bucket[0].device if nccl else torch.device("cpu")
                flat = torch.empty(sum(t.numel() for t in bucket), dtype=dtype, device=device)
                _broadcast(self.group, flat)
                for t, part in zip(bucket, flat.split([t.numel() for t in bucket])):
                    t.copy_(part.view_as(t))
