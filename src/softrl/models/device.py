"""Where the models of a run live and in what precision: the one seam between softrl and the
accelerator. Everything CUDA-specific (TF32, bf16 autocast, fused AdamW, pinned non-blocking copies,
out-of-memory advice) is decided here, from the device's type, so the CPU tests run the same code.

Precision (docs/USAGE.md, "Running on a GPU"): the trained weights, their gradients and AdamW's
state stay in `model.dtype` (fp32 by default: bf16 weights lose updates smaller than 2^-8 of the
weight, which AdamW at 1e-6..1e-4 mostly makes); forward passes run under bf16 autocast where the
device does bf16 matmuls fast (CUDA); frozen copies (the reference, a generation copy) are stored in
the compute dtype, since nothing ever updates them.
"""

from __future__ import annotations

import os

import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from softrl.config import DEVICE_NAMES, DEVICE_PATTERN

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    """`auto` is the first CUDA device when PyTorch sees one, else the CPU."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise ValueError(f"device must be {DEVICE_NAMES}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: this PyTorch sees no CUDA device (torch {torch.__version__}); "
                             "use device: cpu, or install a CUDA build of PyTorch")
        if (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def fast_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls are the fast path on `device` (CUDA with bf16 support; not the CPU)."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


@dataclass(frozen=True)
class Placement:
    """The device of a run's models and the dtypes they compute and are stored in."""

    device: torch.device
    weights: torch.dtype  # the trained model's parameters (and so its gradients and AdamW state)
    compute: torch.dtype | None  # autocast dtype of forward passes; None: the weights' own

    @classmethod
    def create(cls, device: str = "auto", dtype: str = "float32", autocast: str = "auto") -> Placement:
        """`autocast`: auto (bf16 where the device is fast at it), off, or bfloat16."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if autocast not in ("auto", "off", "bfloat16"):
            raise ValueError(f"autocast must be auto, off or bfloat16, got {autocast!r}")
        where = resolve_device(device)
        weights = DTYPES[dtype]
        wanted = autocast == "bfloat16" or (autocast == "auto" and fast_bf16(where))
        compute = torch.bfloat16 if wanted and weights != torch.bfloat16 else None
        if where.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 for what stays in fp32
        return cls(where, weights, compute)

    def deterministic(self, on: bool) -> None:
        """Same seed, same machine, same numbers: PyTorch's deterministic algorithms where it has them
        (on the CPU too: a parallel reduction's order otherwise varies from run to run in the last
        bits, and 300 steps of sampling make that another run). cuBLAS then needs a fixed workspace,
        set before its first call; an op without a deterministic kernel warns instead of failing."""
        if on and self.device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(on, warn_only=True)

    @property
    def frozen(self) -> torch.dtype:
        """The dtype of copies that are never trained: the compute dtype."""
        return self.compute or self.weights

    def autocast(self):
        """The forward passes' context: bf16 autocast, or nothing."""
        if self.compute is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute)

    def place(self, module, frozen: bool = False):
        """`module` on the device, in the frozen or the trained dtype."""
        return module.to(device=self.device, dtype=self.frozen if frozen else self.weights)

    def to_device(self, tensor: Tensor) -> Tensor:
        """A host tensor on the device: through pinned memory, without blocking the host, on CUDA."""
        if tensor.device == self.device:
            return tensor
        if self.device.type == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor.to(self.device)

    def host_allocator(self, lean: bool = False) -> bool:
        """On the CPU with glibc, the allocator policy of a training process (True where it was set).

        Fast (the default): blocks under 256 MiB come from the heap and freed memory stays in it (trim
        threshold 1 GiB), so a step reuses the last step's pages. With glibc's own policy, tensors from
        its growing mmap threshold (up to 32 MiB) up are mapped afresh and the heap's top is given back
        as it frees: about 300,000 page faults, 15% of a SmolLM2-135M SPO step.
        Lean (under activation checkpointing: memory before speed): a fixed 1 MiB mmap threshold, so
        every larger tensor has its own mapping, returned to the system when freed, where glibc's heap
        would keep it and fragment: about 490 MiB less peak on that step, 25% slower.
        (docs/USAGE.md, "Running on a GPU")"""
        if self.device.type != "cpu":
            return False
        settings = {M_MMAP_THRESHOLD: 1 << 20, M_TRIM_THRESHOLD: 128 << 10} if lean else \
            {M_MMAP_THRESHOLD: 256 << 20, M_TRIM_THRESHOLD: 1 << 30}
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            # the mmap threshold first: where this glibc refuses it, nothing else is changed either
            return all(libc.mallopt(key, value) for key, value in settings.items())
        except (OSError, AttributeError):  # not glibc
            return False

    def clock(self) -> PhaseClock:
        """A clock of the phases of one step on this device."""
        return PhaseClock(self.device.type == "cuda")

    def optimizer(self, params: list, lr: float, weight_decay: float) -> torch.optim.AdamW:
        """AdamW, fused where this PyTorch has a fused kernel for the device (CUDA; the CPU since 2.4):
        one pass over each parameter instead of `foreach` passes over all of them, which also allocate
        temporaries as large as the weights (about 0.5 GB at the optimizer step for a 135M model in fp32)."""
        from torch.optim import optimizer as base

        supported = getattr(base, "_get_fused_kernels_supported_devices", lambda: ["cuda"])()
        fused = self.device.type in supported and all(p.is_floating_point() for p in params)
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **({"fused": True} if fused else {}))


class PhaseClock:
    """Seconds spent in named phases (summed over repeats). On CUDA the marks are events recorded on
    the stream, so timing a phase never makes the host wait; `seconds()` waits once, for the last mark."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks: list[tuple[str, object, object]] = []  # (phase, start, end)

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @contextmanager
    def phase(self, name: str):
        start = self._now()
        yield
        self.marks.append((name, start, self._now()))

    def seconds(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        if self.cuda and self.marks:
            self.marks[-1][2].synchronize()
        for name, start, end in self.marks:
            totals[name] += start.elapsed_time(end) / 1000 if self.cuda else end - start
        return dict(totals)


CPU = Placement(torch.device("cpu"), torch.float32, None)


def out_of_memory_advice(error: BaseException) -> str:
    """A CUDA out-of-memory error as one line that names the settings that make a step fit."""
    first = str(error).splitlines()[0] if str(error) else "out of memory"
    return (f"the accelerator ran out of memory ({first[:160]}): lower optim.micro_batch_tokens (or raise "
            "optim.grad_accum), set optim.gradient_checkpointing: true, lower sampling.prompts_per_step or "
            "max_new_tokens, or train LoRA adapters (model.lora)")
