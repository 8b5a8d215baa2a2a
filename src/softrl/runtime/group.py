"""A learner group: `runtime.learners` processes in one torch.distributed group, data parallel.

softrl starts the other processes itself (on this machine), the Ray runtime starts them as actors,
or `torchrun --nproc-per-node N -m softrl train ...` starts them all (then every process runs the same command and the group comes from
torchrun's environment). Rank 0 runs the session: Q0, generation, the store, evaluation, the run log
and checkpoints. Every rank holds a shard of the trained weights, of their gradients and of AdamW's
state (FSDP2) and takes its share of whole groups of every batch (`training.data_parallel`); rank 0
hands each batch to the others, and keeps a whole copy of the policy for generation, evaluation and
saving, refreshed after every step. Which backend (gloo on the CPU, NCCL on CUDA) and how
many threads each process uses is decided here and nowhere else.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from softrl.config import ConfigError, RunConfig

# followers wait for rank 0 through its Q0 estimate and evaluations: a long wait is not a failure
WAIT = timedelta(hours=12)


def torchrun_rank() -> int | None:
    """This process's rank when torchrun started it (it sets TORCHELASTIC_RUN_ID), else None."""
    started = all(key in os.environ for key in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"))
    return int(os.environ["RANK"]) if started else None


def backend(config: RunConfig) -> str:
    return "nccl" if config.model.device.startswith("cuda") or (
        config.model.device == "auto" and torch.cuda.is_available()) else "gloo"


def _join(config: RunConfig, rank: int, world: int, init_method: str | None) -> None:
    """Join the group: threads shared out on the CPU, one GPU per process on CUDA."""
    if backend(config) == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(backend(config), init_method=init_method or "env://", rank=rank, world_size=world,
                            timeout=WAIT)


def rendezvous(host: str = "127.0.0.1") -> str:
    """Where the group meets: a free port of `host` (loopback unless the ranks are on other machines)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def _exchange(message=None):
    """Rank 0's `message` on every rank (the others pass None)."""
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def follow(config: RunConfig, rank: int, world: int, init_method: str | None = None) -> dict:
    """A rank other than 0: its replica of the learner, stepping on what rank 0 hands it until told to stop."""
    from softrl.assemble import RunParts

    _join(config, rank, world, init_method)
    try:
        dist.barrier()  # rank 0 has resolved (built, prepared) the model: no two ranks build it at once
        learner = RunParts(config, rank=rank).learner
        while (message := _exchange()) is not None:
            kind, payload = message
            if kind == "step":
                learner.step(payload)
            elif kind == "load":
                learner.load_state_dict(payload)
            elif kind == "save":
                learner.state_dict()
    finally:
        dist.destroy_process_group()
    return {"run_dir": str(config.run_dir), "rank": rank, "steps": learner.version}


class LearnerGroupError(RuntimeError):
    """A learner process of the group died, or the group's exchange with it failed."""


class LearnerGroup:
    """Rank 0's side of the group: starts the other ranks (unless torchrun did), then stands in for
    the run's learner, handing every batch (and a resumed learner state) to them first."""

    def __init__(self, config: RunConfig, init_method: str | None = None):
        """`init_method` (`rendezvous`): the other ranks are started elsewhere (Ray actors) and meet there."""
        from softrl.assemble import resolve_model

        self.world = config.runtime.learners
        self.processes: list[multiprocessing.Process] = []
        resolve_model(config)  # build or prepare the model once, before any other rank loads it
        if torchrun_rank() is not None:
            if int(os.environ["WORLD_SIZE"]) != self.world:
                raise ConfigError(f"runtime.learners: {self.world}, but torchrun started {os.environ['WORLD_SIZE']} "
                                  "processes: make them equal")
            _join(config, 0, self.world, None)
        elif init_method is not None:
            _join(config, 0, self.world, init_method)
        else:
            init_method = rendezvous()
            spawn = multiprocessing.get_context("spawn")
            self.processes = [spawn.Process(target=follow, args=(config, rank, self.world, init_method), daemon=True,
                                            name=f"softrl-learner-{rank}") for rank in range(1, self.world)]
            for p in self.processes:
                p.start()
            _join(config, 0, self.world, init_method)
        dist.barrier()
        self.learner = None

    def lead(self, learner) -> None:
        """Stand in for rank 0's `learner` (built by then, and before the run resumes: that is a step
        of the group's too)."""
        self.learner = learner

    def step(self, batch) -> dict:
        self._check()
        try:
            _exchange(("step", batch))
            return self.learner.step(batch)
        except RuntimeError as e:
            if type(e) is not RuntimeError and not isinstance(e, dist.DistError):
                raise  # the step's own errors (a non-finite loss, out of memory) as they are
            # a collective failed: gloo raises a plain RuntimeError when a peer's connection closes
            self._check(wait=5.0)
            first = next((line for line in str(e).splitlines() if line.strip()), "")
            raise LearnerGroupError(f"the learner group failed: {first}") from e

    def _check(self, wait: float = 0.0) -> None:
        """A learner process softrl started that has died, as one line (after up to `wait` seconds for
        its exit to show)."""
        for rank, p in enumerate(self.processes, 1):
            p.join(timeout=wait)
            if not p.is_alive():
                raise LearnerGroupError(f"learner rank {rank} of {self.world} exited (code {p.exitcode}): "
                                        "`softrl train CONFIG --resume` continues from the last checkpoint")

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's learner state: the other ranks get rank 0's tensors in the load itself."""
        _exchange(("load", {k: v for k, v in state.items() if k not in ("optimizer", "value")}))
        self.learner.load_state_dict(state)

    def state_dict(self) -> dict:
        """The learner's whole state, gathered from every rank's shards."""
        _exchange(("save", None))
        return self.learner.state_dict()

    def __getattr__(self, name):  # version, policy...: rank 0's own learner
        return getattr(self.learner, name)

    def close(self, ok: bool = True) -> None:
        """After a run that went well: tell the other ranks to stop, and wait for those softrl started.
        After an error (they may be anywhere in a step, or gone): stop the processes softrl started
        (torchrun stops its own when this one fails) and leave the group without a last message."""
        if ok and dist.is_initialized():
            _exchange(None)
        for p in self.processes:
            if not ok:
                p.kill()
            p.join(timeout=60)
        if dist.is_initialized():
            dist.destroy_process_group()
