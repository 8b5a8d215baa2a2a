"""The machine of the GPU measurements (benchmarks/gpu/measure.sh env): versions, the GPU, its measured
bf16 matmul peak and device-to-device copy bandwidth, as JSON on stdout."""

import json
import platform
import subprocess

import torch
import transformers

from softrl_bench.systems import matmul_peak_flops, memory_bandwidth


def version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


cuda = torch.cuda.is_available()
def nvidia_smi() -> str | None:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                               "--format=csv,noheader"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return None


smi = nvidia_smi() if cuda else None
print(json.dumps({
    "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
    "transformers": transformers.__version__,
    **{name: version(name) for name in ("trl", "datasets", "accelerate", "peft", "pydantic", "reasoning_gym")},
    "gpu": torch.cuda.get_device_name(0) if cuda else None, "nvidia_smi": smi,
    "bf16_matmul_peak_flops": matmul_peak_flops(device="cuda") if cuda else None,
    "copy_bytes_per_s": memory_bandwidth(torch.device("cuda")) if cuda else None,
}, indent=1))
