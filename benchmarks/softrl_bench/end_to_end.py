"""End to end: samples/s of softrl's local runtime and of TRL's GRPOTrainer on the same work, run
alternately round by round (`softrl bench systems --parts e2e,trl`, softrl_bench/systems.py).

samples/s are over each side's whole training clock (setup left out) and, as `steady_samples_per_s`,
over the steps after the first, without one-off costs (compiling softrl's decode step, first
allocations)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import median

import torch


def runtime_settings(root: Path, name: str, task: str, steps: int, prompts: int, samples_per_prompt: int,
                     **overrides) -> dict:
    """Settings (`config_from`) of a run online on `task`'s bootstrap, no periodic evaluation and a
    minimal one before and after; as many training prompts as the steps use (each needs a Q0 estimate
    before the clock starts)."""
    return {
        "name": name, "out_dir": str(root), "data.store": str(root / "store"), "task.name": task,
        "task.size": min(200, prompts * steps), "task.eval_size": 1, "q0.k": 4, "eval.samples": 1, "data.mix": {"online": 1.0},
        "sampling.prompts_per_step": prompts, "sampling.samples_per_prompt": samples_per_prompt,
        "optim.steps": steps, "log.checkpoint_every": steps, "log.keep_checkpoints": 1, **overrides}


def end_to_end(settings: dict) -> dict:
    """Train a run of `settings`; samples/s over the run's training clock (setup and evaluation left
    out), and the median split of a step's time (generation, learner forward, backward, optimizer) over
    the steps after the first."""
    import shutil

    from softrl.config import config_from
    from softrl.runtime import runtime_for

    config = config_from(settings)
    shutil.rmtree(config.run_dir, ignore_errors=True)
    summary = runtime_for(config).train(config, log=lambda m: None)
    records = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "loss" in r]
    steps = records[1:] or records
    split = {k.removeprefix("time/"): median([r.get(k, 0.0) for r in steps])
             for k in sorted({k for r in steps for k in r if k.startswith("time/")})}
    return {"name": config.name, "steps": summary["steps"], "samples": summary["samples"],
            "seconds": summary["seconds"], "samples_per_s": summary["samples"] / max(summary["seconds"], 1e-9),
            "steady_samples_per_s": steady_rate([(r["time"], r["samples"]) for r in records]), "split_s": split}


def steady_rate(ends: list[tuple[float, int]]) -> float | None:
    """samples/s over the steps after the first, from each step's (clock, cumulative samples) at its end:
    the rate a long run settles at, without the first step's one-off costs (torch.compile and CUDA-graph
    capture of the decode step, allocator growth). None with fewer than two steps."""
    if len(ends) < 2 or ends[-1][0] <= ends[0][0]:
        return None
    return (ends[-1][1] - ends[0][1]) / (ends[-1][0] - ends[0][0])


# TRL's generation settings without vLLM: transformers' generate with its default (dynamic) cache, with
# a static cache, or transformers' continuous batching (paged attention)
TRL_GENERATION = {"dynamic": {}, "static": {"cache_implementation": "static"},
                  "paged": {"use_transformers_continuous_batching": True}}


def trl_grpo(model_path: str, task: str, steps: int, prompts: int, samples_per_prompt: int, max_new_tokens: int,
             root: Path, lr: float = 1e-4, beta: float | None = None, fixed: bool = True,
             device: str = "auto", generation: str = "dynamic") -> dict | None:
    """TRL's GRPOTrainer on the same model, task, batch, generation length, learning rate and beta, its
    `generation` setting one of TRL_GENERATION; None without TRL. With `fixed`, EOS is suppressed until
    `max_new_tokens` (so every completion is that long, as softrl's `sampling.ignore_eos`). samples/s
    over TRL's own train_runtime (its setup left out, as softrl's is)."""
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        return None
    from softrl.algorithms.common import SPO_BETA
    from softrl.assemble import task_model
    from softrl.models.loading import quiet_transformers

    root = Path(root)
    s = task_model(task, model_path, size=200, device=device)
    task_obj, model, tokenizer = s.task, s.model, s.tokenizer
    on_cpu = model.device.type == "cpu"
    by_id = {p.id: p for p in task_obj.prompts()}

    def reward(prompts, completions, prompt_id, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]  # conversational: messages
        grades = task_obj.grade_many([(by_id[i], t) for i, t in zip(prompt_id, texts)])
        return [g.reward for g in grades]

    # a tokenizer with a chat template: conversational prompts, so TRL renders the same user turn softrl does
    chat = bool(getattr(tokenizer, "chat_template", None))
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p.text}] if chat else p.text, "prompt_id": p.id}
                              for p in task_obj.prompts()])
    args = GRPOConfig(output_dir=str(root / "trl"), per_device_train_batch_size=prompts * samples_per_prompt,
                      num_generations=samples_per_prompt, max_completion_length=max_new_tokens, max_steps=steps,
                      learning_rate=lr, temperature=1.0, use_cpu=on_cpu, bf16=not on_cpu, report_to=[],
                      save_strategy="no", logging_steps=max(1, steps), seed=0, disable_tqdm=True,
                      generation_kwargs={"min_new_tokens": max_new_tokens} if fixed else None,
                      # the same work as softrl's GRPO: a KL term to a frozen reference, no recomputation
                      beta=SPO_BETA if beta is None else beta, gradient_checkpointing=False,
                      **TRL_GENERATION[generation])
    quiet_transformers()
    ends: list[tuple[float, int]] = []
    batch = prompts * samples_per_prompt

    class StepEnds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            ends.append((time.perf_counter(), state.global_step * batch))

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer,
                          callbacks=[StepEnds()])
    result = trainer.train()
    seconds = result.metrics["train_runtime"]
    samples = steps * batch
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {"name": f"trl-{generation}", "steps": steps, "samples": samples, "seconds": seconds,
            "samples_per_s": samples / seconds, "steady_samples_per_s": steady_rate(ends),
            "completion_tokens": median(lengths) if lengths else None}


def alternate(sides: dict, pairs: int, phase=lambda name: None, after_round=lambda results: None) -> dict:
    """Run every side once per round, in the same order, for `pairs` rounds (A B A B ...): each side's
    results in round order. `sides`: name -> a callable returning a result with `samples_per_s`. A side
    that fails (RuntimeError, as `in_fresh_process` raises) is kept as {"error": ...} and the others go on;
    each result gains `wall_s`, the seconds the side took in all; `after_round` gets the results so far
    after every round (a benchmark cut off keeps them)."""
    results: dict[str, list[dict]] = {name: [] for name in sides}
    for i in range(pairs):
        for name, run in sides.items():
            phase(f"round {i + 1}/{pairs}: {name}")
            started = time.perf_counter()
            try:
                result = run()
            except RuntimeError as e:
                result = {"error": str(e)}
            # the side's whole cost, its process's start, setup and evaluation too: what a lease pays for it
            results[name].append({**result, "wall_s": time.perf_counter() - started})
        after_round(results)
    return results


def median_speed(runs: list[dict]) -> float | None:
    """Median samples/s of the runs that finished; None if none did."""
    speeds = [r["samples_per_s"] for r in runs if r.get("samples_per_s")]
    return median(speeds) if speeds else None


def pair_ratios(results: dict[str, list[dict]], top: str, bottom: str, key: str = "samples_per_s") -> dict:
    """`key` (samples/s) of `top` over `bottom`, round by round, and their median."""
    by_pair = [a[key] / b[key] for a, b in zip(results[top], results[bottom]) if a.get(key) and b.get(key)]
    return {"by_pair": by_pair, "median": median(by_pair) if by_pair else None}


def against_trl(rounds: dict[str, list[dict]]) -> dict:
    """softrl's modes against TRL's fastest generation setting (median samples/s over the rounds), round by
    round, over the whole clock (`vs_trl`) and after the first step (`vs_trl_steady`); `softrl_fastest`
    the mode whose whole-clock median ratio is higher. Sides that never finished are left out; {} when
    no softrl or no TRL side did."""
    trl = [name for name in rounds if name.startswith("trl-") and median_speed(rounds[name])]
    modes = [name.removeprefix("softrl-") for name in rounds if name.startswith("softrl-") and median_speed(rounds[name])]
    if not trl or not modes:  # one side never finished: nothing to compare
        return {}
    fastest = max(trl, key=lambda name: median_speed(rounds[name]))
    vs = {mode: pair_ratios(rounds, f"softrl-{mode}", fastest) for mode in modes}
    return {"trl_fastest": fastest, "vs_trl": vs, "softrl_fastest": max(vs, key=lambda m: vs[m]["median"] or 0),
            "vs_trl_steady": {mode: pair_ratios(rounds, f"softrl-{mode}", fastest, "steady_samples_per_s")
                              for mode in modes}}
