"""A whole learner step (SPO, and AGRO with the exact token KL) on a random model with a 150k
vocabulary (Qwen's, Llama 3's size): its peak memory must grow much more slowly with the batch than
one `[B, T, V]` fp32 tensor does. Each measurement runs in a fresh Python, whose peak resident size
is read from /proc after a warm-up step (so AdamW's state is there before the peak is reset)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

V, T, PROMPT = 150_000, 32, 8

SCRIPT = r"""
import json, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from softrl_bench.systems import peak_rss_mib, reset_peak_rss, rss_mib
from softrl.config import load_config
from softrl.models.wrappers import PolicyModel, ReferenceModel
from softrl.training.batch import make_batch
from softrl.training.learner import Learner

rows_count, vocab, T, prompt = (int(a) for a in sys.argv[1:5])
algorithm = sys.argv[5]
torch.manual_seed(0)
torch.set_num_threads(1)
model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
class Tok:  # what the learner reads of a tokenizer
    pad_token_id = 0
policy = PolicyModel(model, Tok())
reference = ReferenceModel.from_policy(policy)
options = ["data.mix={online: 1}", "sampling.samples_per_prompt=4", "optim.warmup_steps=0",
           f"data.objective.algorithm={algorithm}"] + (["data.objective.estimator=g3"] if algorithm == "agro-off" else [])
config = load_config(None, options)
learner = Learner(policy, reference, config)
g = torch.Generator().manual_seed(1)
rows = [{"prompt_id": f"p{i // 4}", "prompt_tokens": torch.randint(1, vocab, (prompt,), generator=g).tolist(),
         "response_tokens": torch.randint(1, vocab, (T,), generator=g).tolist(), "tokenizer": "t",
         "reward": float(i % 2), "mix_source": "online"} for i in range(rows_count)]
batch = make_batch(rows, "t", 0, None, None, {f"p{i}": 0.5 for i in range(rows_count)})
learner.step(batch)  # AdamW's state exists from here on
base = rss_mib()
assert reset_peak_rss()
metrics = learner.step(batch)
print(json.dumps({"peak_above_mib": peak_rss_mib() - base, "loss": metrics["loss"]}))
"""


def step_peak(rows: int, algorithm: str) -> float:
    # every allocation over 64 KiB its own mapping, returned when freed: the resident size then follows
    # what is alive (glibc's moving threshold otherwise keeps freed blocks, about 100 MiB of noise here)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(rows), str(V), str(T), str(PROMPT), algorithm],
                         capture_output=True, text=True, check=False, cwd=Path(__file__).parent, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loss"] == result["loss"]
    return result["peak_above_mib"]


@pytest.mark.parametrize("algorithm", ["spo", "agro-off"])
def test_learner_step_memory_grows_much_slower_than_the_full_distribution(algorithm):
    from softrl_bench.systems import reset_peak_rss

    if not reset_peak_rss():
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak resident size")
    small, large = 4, 16
    grown = step_peak(large, algorithm) - step_peak(small, algorithm)  # MiB
    full_distribution = (large - small) * T * V * 4 / 2**20  # one [B, T, V] fp32 tensor more: 234 MiB
    assert grown < 0.25 * full_distribution, (grown, full_distribution)
