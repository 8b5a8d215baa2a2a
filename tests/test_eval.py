"""Evaluation: pass@k, distinct answers and token statistics against brute force."""

import copy
import itertools
import json
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch

from softrl.eval.protocol import summarize


def test_summarize_matches_brute_force():
    rng = random.Random(0)
    n, results = 8, []
    for p in range(12):
        rate = rng.random()
        results += [(f"p{p}", rng.choice(["a", "b", " a ", "c", "d"]), rng.random() < rate) for _ in range(n)]
    out = summarize(results, n, ks=tuple(range(1, n + 1)))
    by_prompt = {}
    for pid, text, passed in results:
        by_prompt.setdefault(pid, []).append((text.strip(), passed))
    for k in range(1, n + 1):  # the probability that k of the n samples, drawn without replacement, include a pass
        brute = sum(sum(any(s[1] for s in subset) for subset in itertools.combinations(samples, k))
                    / len(list(itertools.combinations(samples, k))) for samples in by_prompt.values()) / len(by_prompt)
        assert out[f"pass@{k}"] == pytest.approx(brute, abs=1e-12), k
    solved = [{t for t, ok in s if ok} for s in by_prompt.values()]
    solved = [d for d in solved if d]
    assert out["solved_problems"] == len(solved)
    assert out["distinct_correct_per_solved"] == pytest.approx(sum(map(len, solved)) / len(solved))
    assert out["success_per_sample"] == pytest.approx(sum(p for _, _, p in results) / len(results))


def test_token_stats_match_a_direct_computation(tiny):
    from softrl.data import Trajectory
    from softrl.eval.diversity import token_stats

    _, model, tokenizer = tiny
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rows = [Trajectory("p", "", 0.0, False, prompt_tokens=tokenizer(a)["input_ids"], response_tokens=tokenizer(b)["input_ids"])
            for a, b in [("12 + 3", "15"), ("7 7", "49 ok"), ("x", "y")]]
    entropy, kl, count = 0.0, 0.0, 0
    for r in rows:  # one unpadded row at a time
        ids = torch.tensor([r.prompt_tokens + r.response_tokens])
        start = len(r.prompt_tokens)
        logp = torch.log_softmax(model(ids).logits[0, start - 1 : -1].double(), -1)
        logq = torch.log_softmax(other(ids).logits[0, start - 1 : -1].double(), -1)
        entropy += -(logp.exp() * logp).sum().item()
        kl += (logp.exp() * (logp - logq)).sum().item()
        count += len(r.response_tokens)
    out = token_stats(model, rows, tokenizer.pad_token_id, reference=other, batch_size=2)
    assert out["mean_token_entropy"] == pytest.approx(entropy / count, rel=1e-4)
    assert out["kl_to_reference"] == pytest.approx(kl / len(rows), rel=1e-3) and kl > 0
    assert token_stats(model, rows, tokenizer.pad_token_id, reference=model)["kl_to_reference"] == pytest.approx(0, abs=1e-5)


def test_eval_command(tiny):
    softrl = shutil.which("softrl", path=os.path.dirname(sys.executable))
    if softrl is None:
        pytest.skip("softrl console script not installed")
    directory = str(tiny[0])
    proc = subprocess.run([softrl, "eval", "--model", directory, "--reference", directory, "--size", "3", "--samples", "4",
                           "--max-new-tokens", "6", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["problems"] == 3 and out["samples_per_problem"] == 4 and out["kl_to_reference"] == pytest.approx(0, abs=1e-5)
    assert {"pass@1", "pass@10", "mean_token_entropy", "distinct_correct_per_solved"} <= set(out)
    bad = subprocess.run([softrl, "eval", "--model", "/nonexistent/model"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "does not exist" in bad.stderr


def test_eval_command_on_a_math_file_with_default_options(tiny, tmp_path):
    """A dataset task takes no --size/--task-seed (its prompts are the file's): the defaults must not
    reach it (they raised a TypeError about `size`)."""
    softrl = shutil.which("softrl", path=os.path.dirname(sys.executable))
    if softrl is None:
        pytest.skip("softrl console script not installed")
    data = tmp_path / "math.jsonl"
    data.write_text('{"id": "a", "problem": "2+3?", "answer": "5"}\n{"id": "b", "problem": "10-4?", "answer": "6"}\n')
    proc = subprocess.run([softrl, "eval", "--model", str(tiny[0]), "--task", f"math:{data}", "--samples", "2",
                           "--max-new-tokens", "4", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["problems"] == 2


def test_an_episodes_environment_tokens_count_in_neither_entropy_nor_kl(tiny):
    """token_stats over an episode row equals the same statistics over its policy tokens alone."""
    from softrl.data.schema import Trajectory
    from softrl.eval.diversity import token_stats
    from softrl.models.logprobs import pad_masks

    _, model, tokenizer = tiny
    row = Trajectory("p", "t", 0.0, False, prompt_tokens=[5, 6, 7], response_tokens=[8, 9, 10, 11, 12],
                     action_mask=[True, True, False, False, True])
    assert pad_masks([row.action_mask], 6).tolist() == [[1, 1, 0, 0, 1, 0]]  # the policy's, never padding
    masked = token_stats(model, [row], tokenizer.pad_token_id)
    whole = token_stats(model, [Trajectory("p", "t", 0.0, False, prompt_tokens=[5, 6, 7],
                                           response_tokens=[8, 9, 10, 11, 12])], tokenizer.pad_token_id)
    assert masked["mean_token_entropy"] != whole["mean_token_entropy"]
    from softrl.models.logprobs import pad_batch
    from softrl.models.logprobs import token_stats as chunked

    stats = chunked(model, pad_batch([[5, 6, 7]], [[8, 9, 10, 11, 12]], tokenizer.pad_token_id), entropy=True)
    chosen = stats.entropy[0, [0, 1, 4]]
    assert abs(masked["mean_token_entropy"] - chosen.mean().item()) < 1e-5


def test_policy_tokens_count_only_what_the_policy_wrote():
    """Tokens per episode (the multi-turn benchmark's cost) leave the environment's turns out; a row
    without an action mask is all the policy's."""
    from softrl.data import Trajectory
    from softrl.eval.protocol import policy_tokens

    episode = Trajectory("p", "x", 0.0, False, response_tokens=[1, 2, 3, 4, 5, 6], action_mask=[True, True, False,
                                                                                               False, False, True])
    single = Trajectory("p", "y", 1.0, True, response_tokens=[7, 8, 9])
    assert policy_tokens([episode]) == 3 and policy_tokens([episode, single]) == 6
