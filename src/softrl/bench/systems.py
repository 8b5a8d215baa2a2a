"""`softrl bench systems`: what the machine does with the same tiny model and batch.

- learner step time and peak memory of SPO vs PPO (with its value model) vs GRPO, each measured in
  a fresh process (peak resident memory over the step, above the process before any model loaded);
- achieved training FLOP/s of those steps against this CPU's measured fp32 matmul peak;
- end-to-end samples/s of the local runtime, sync vs async;
- training wall time of the Ray runtime with `model_update_interval` 1 vs 10;
- with TRL installed, its GRPOTrainer on the same model, task, batch and generation length.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import softrl.objectives as registry

STEP_METHODS = ("spo", "ppo", "grpo")


# --- memory of this process (Linux /proc) -------------------------------------------------------
def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def rss_mib() -> float:
    return _status_kib("VmRSS") / 1024


def peak_rss_mib() -> float:
    return _status_kib("VmHWM") / 1024


def reset_peak_rss() -> bool:
    """Writing 5 to clear_refs resets the peak resident set size (Linux >= 4.0); False where /proc
    does not allow it (the peak then also covers the imports before)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


# --- the CPU's physical limit ---------------------------------------------------------------------
def matmul_peak_flops(n: int = 2048, reps: int = 10, dtype=torch.float32) -> float:
    """Best-of-3 FLOP/s of an n x n matrix product on all of torch's threads."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - start) / reps)
    return 2 * n**3 / best


def matmul_params(model) -> int:
    """Parameters that take part in matrix products: all of them, less an untied input embedding
    (a lookup). A tied embedding is counted once, as the output head it also is."""
    total = sum(p.numel() for p in model.parameters())
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or embed.weight is not head.weight:
        total -= embed.weight.numel()
    return total


# passes per step over the padded batch, in units of 2 * params * tokens (a forward pass):
# a trained model costs forward + backward = 3 units, a frozen one (the reference) 1 unit
STEP_PASSES = {name: 3 + 1 + (3 if objective.value_model else 0) for name, objective in registry.REGISTRY.items()}


def batch_rows(model_path: str, task: str, prompts: int, samples_per_prompt: int, max_new_tokens: int,
               seed: int = 0) -> list[dict]:
    """A fixed online batch: the reference's graded samples of `prompts` training prompts."""
    from softrl.assemble import sampler
    from softrl.rollout import Context, rollouts

    s = sampler(task, model_path, size=prompts, max_new_tokens=max_new_tokens, source="online")
    contexts = [Context(p, s.encode_prompt(p.text)) for p in s.task.prompts()]
    return [{**r.to_row(), "mix_source": "online"} for r in rollouts(s.spec, contexts, samples_per_prompt, seed)]


def learner_step(method: str, model_path: str, rows: list[dict], samples_per_prompt: int, steps: int,
                 store: str) -> dict:
    """Load the models, take one warm-up step (optimizer state), then time `steps` steps. Memory is
    the peak resident size during all of it above the process before any model was loaded."""
    from softrl.assemble import Run
    from softrl.config import config_from
    from softrl.runtime.feed import DataFeed

    base = rss_mib()
    peak_was_reset = reset_peak_rss()
    config = config_from({"data.objective.algorithm": method, "data.mix": {"online": 1.0}, "model.path": model_path,
                          "data.store": store, "sampling.samples_per_prompt": samples_per_prompt,
                          "optim.warmup_steps": 0})
    run = Run(config)
    feed = DataFeed(config, run.store, run.train_task, {r["prompt_id"]: 0.5 for r in rows}, run.tokenizer)
    batch = feed.batch(rows)
    run.learner.step(batch)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run.learner.step(batch)
        times.append(time.perf_counter() - start)
    step_s = sorted(times)[len(times) // 2]
    tokens = batch.padded.input_ids.numel()
    params = matmul_params(run.policy.model)
    flops = STEP_PASSES[method] * 2 * params * tokens
    return {"method": method, "step_s": step_s, "peak_mib": peak_rss_mib() - base, "rows": len(rows),
            "padded_tokens": tokens, "params": params, "step_flops": flops,
            "achieved_flops": flops / step_s, "threads": torch.get_num_threads(), "peak_was_reset": peak_was_reset}


def learner_step_in_subprocess(method: str, model_path: str, rows_file: Path, samples_per_prompt: int,
                               steps: int) -> dict:
    """`learner_step` in a fresh Python, so each method's peak memory is its own."""
    out = subprocess.run([sys.executable, "-m", "softrl.bench.systems", method, model_path, str(rows_file),
                          str(samples_per_prompt), str(steps), str(rows_file.parent / "store")],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"learner step of {method} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- end to end -----------------------------------------------------------------------------------
def runtime_config(root: Path, name: str, task: str, steps: int, prompts: int, samples_per_prompt: int,
                   **overrides):
    """Online on `task`'s bootstrap, no periodic evaluation and a minimal one before and after."""
    from softrl.config import config_from

    return config_from({
        "name": name, "out_dir": str(root), "data.store": str(root / "store"), "task.name": task,
        "task.size": 200, "task.eval_size": 1, "q0.k": 4, "eval.samples": 1, "data.mix": {"online": 1.0},
        "sampling.prompts_per_step": prompts, "sampling.samples_per_prompt": samples_per_prompt,
        "optim.steps": steps, "log.checkpoint_every": steps, "log.keep_checkpoints": 1, **overrides})


def end_to_end(config) -> dict:
    """Train; samples/s over the run's training clock (setup and evaluation left out)."""
    import shutil

    from softrl.runtime import runtime_for

    shutil.rmtree(config.run_dir, ignore_errors=True)
    summary = runtime_for(config).train(config, log=lambda m: None)
    return {"name": config.name, "steps": summary["steps"], "samples": summary["samples"],
            "seconds": summary["seconds"], "samples_per_s": summary["samples"] / max(summary["seconds"], 1e-9)}


def trl_grpo(model_path: str, task: str, steps: int, prompts: int, samples_per_prompt: int, max_new_tokens: int,
             root: Path, lr: float = 1e-4) -> dict | None:
    """TRL's GRPOTrainer on the same model, task, batch and generation length; None without TRL.
    samples/s over TRL's own train_runtime (its setup left out, as softrl's is)."""
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        return None
    from softrl.algorithms.common import SPO_BETA
    from softrl.assemble import sampler
    from softrl.models.loading import quiet_transformers

    s = sampler(task, model_path, size=200)
    task_obj, model, tokenizer = s.task, s.model, s.tokenizer
    by_id = {p.id: p for p in task_obj.prompts()}

    def reward(prompts, completions, prompt_id, **_):
        grades = task_obj.grade_many([(by_id[i], c) for i, c in zip(prompt_id, completions)])
        return [g.reward for g in grades]

    data = Dataset.from_list([{"prompt": p.text, "prompt_id": p.id} for p in task_obj.prompts()])
    args = GRPOConfig(output_dir=str(root / "trl"), per_device_train_batch_size=prompts * samples_per_prompt,
                      num_generations=samples_per_prompt, max_completion_length=max_new_tokens, max_steps=steps,
                      learning_rate=lr, temperature=1.0, use_cpu=True, bf16=False, report_to=[], save_strategy="no",
                      logging_steps=max(1, steps), seed=0, disable_tqdm=True,
                      # the same work as softrl's GRPO: a KL term to a frozen reference, no recomputation
                      beta=SPO_BETA, gradient_checkpointing=False)
    quiet_transformers()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer)
    result = trainer.train()
    seconds = result.metrics["train_runtime"]
    samples = steps * prompts * samples_per_prompt
    return {"name": "trl-grpo", "steps": steps, "samples": samples, "seconds": seconds, "samples_per_s": samples / seconds}


def run_systems(model_path: str, task: str, root: Path, parts: set[str], prompts: int = 16, samples_per_prompt: int = 4,
                max_new_tokens: int = 24, timed_steps: int = 10, e2e_steps: int = 40, ray_steps: int = 30,
                trl_steps: int = 20, phase=lambda name: None) -> dict:
    """Each part the set names (learner, e2e, ray, trl): the numbers of the module docstring."""
    root.mkdir(parents=True, exist_ok=True)
    out: dict = {"model": model_path, "task": task, "batch": f"{prompts} prompts x {samples_per_prompt} samples",
                 "max_new_tokens": max_new_tokens, "threads": torch.get_num_threads(), "cpu": cpu_name()}
    if "learner" in parts:
        phase("matmul peak")
        out["matmul_peak_flops"] = matmul_peak_flops()
        rows_file = root / "batch.json"
        rows_file.write_text(json.dumps(batch_rows(model_path, task, prompts, samples_per_prompt, max_new_tokens),
                                        default=str))
        out["learner"] = {}
        for method in STEP_METHODS:
            phase(f"learner step: {method}")
            r = learner_step_in_subprocess(method, model_path, rows_file, samples_per_prompt, timed_steps)
            out["learner"][method] = {**r, "of_peak": r["achieved_flops"] / out["matmul_peak_flops"]}
    common = dict(task=task, prompts=prompts, samples_per_prompt=samples_per_prompt)
    grpo = {"data.objective": {"algorithm": "grpo"}, "sampling.max_new_tokens": max_new_tokens, "model.path": model_path}
    if "e2e" in parts:
        out["e2e"] = {}
        for mode in ("sync", "async"):
            phase(f"end to end: local {mode}")
            out["e2e"][mode] = end_to_end(runtime_config(root, f"local-{mode}", steps=e2e_steps,
                                                         **{"runtime.mode": mode, **grpo}, **common))
    if "ray" in parts:
        out["ray"] = {}
        for interval in (1, 10):
            phase(f"end to end: ray, model_update_interval {interval}")
            out["ray"][interval] = end_to_end(runtime_config(
                root, f"ray-interval{interval}", steps=ray_steps, **{"runtime.kind": "ray", "runtime.workers": 2,
                                                                     "runtime.model_update_interval": interval, **grpo},
                **common))
    if "trl" in parts:
        phase("TRL GRPOTrainer")
        out["trl"] = trl_grpo(model_path, task, trl_steps, prompts, samples_per_prompt, max_new_tokens, root)
    return out


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def markdown(result: dict) -> str:
    """The systems numbers as markdown tables, with the targets' ratios."""
    lines = [f"Model `{result['model']}`, task {result['task']}, batch {result['batch']}, "
             f"{result['max_new_tokens']} new tokens, {result['threads']} torch threads, {result['cpu']}.", ""]
    learner = result.get("learner")
    if learner:
        peak = result["matmul_peak_flops"]
        lines += [f"Measured fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s.", "",
                  "| learner step | time (s) | peak memory (MiB) | FLOP per step | achieved GFLOP/s | of matmul peak |",
                  "|---|---|---|---|---|---|"]
        for m, r in learner.items():
            lines.append(f"| {m} | {r['step_s']:.3f} | {r['peak_mib']:.0f} | {r['step_flops']:.3g} | "
                         f"{r['achieved_flops'] / 1e9:.2f} | {r['of_peak']:.1%} |")
        if "ppo" in learner and "spo" in learner:
            lines += ["", f"SPO / PPO: step time {learner['spo']['step_s'] / learner['ppo']['step_s']:.2f}x, "
                          f"peak memory {learner['spo']['peak_mib'] / learner['ppo']['peak_mib']:.2f}x (target <= 0.6x)."]
    rows = [(f"softrl local {k}", v) for k, v in result.get("e2e", {}).items()]
    rows += [(f"softrl ray, model_update_interval {k}", v) for k, v in result.get("ray", {}).items()]
    if result.get("trl"):
        rows.append(("TRL GRPOTrainer", result["trl"]))
    if rows:
        lines += ["", "| end to end (GRPO loss) | steps | samples | training wall time (s) | samples/s |",
                  "|---|---|---|---|---|"]
        lines += [f"| {name} | {r['steps']} | {r['samples']} | {r['seconds']:.1f} | {r['samples_per_s']:.1f} |"
                  for name, r in rows]
    e2e, ray, trl = result.get("e2e", {}), result.get("ray", {}), result.get("trl")
    ratios = []
    if "sync" in e2e and "async" in e2e:
        ratios.append(f"async / sync samples/s: {e2e['async']['samples_per_s'] / e2e['sync']['samples_per_s']:.2f}x "
                      "(target >= 1.5x)")
    if 1 in ray and 10 in ray:
        ratios.append(f"ray wall time, interval 10 / interval 1: {ray[10]['seconds'] / ray[1]['seconds']:.2f}x")
    if trl and e2e:
        best = max(e2e.values(), key=lambda r: r["samples_per_s"])
        ratios.append(f"softrl (best local mode) / TRL samples/s: {best['samples_per_s'] / trl['samples_per_s']:.2f}x "
                      "(target >= 2x)")
    if ratios:
        lines += [""] + [f"- {r}" for r in ratios]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # the subprocess of learner_step_in_subprocess
    method, model_path, rows_file, n, steps, store = sys.argv[1:7]
    rows = json.loads(Path(rows_file).read_text())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(json.dumps(learner_step(method, model_path, rows, int(n), int(steps), store)))
