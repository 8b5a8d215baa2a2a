"""`softrl bench systems`: what the machine does with the same model and batch.

- learner step time, peak memory and its time split (forward, backward, optimizer) of SPO vs PPO
  (with its value model) vs GRPO, each in a fresh process (CPU: peak resident memory over the
  steps above the process before any model loaded; CUDA: PyTorch's peak allocation);
- achieved training FLOP/s of those steps against the device's measured matmul peak;
- end-to-end samples/s of the local runtime, sync and async, and, with TRL installed, its
  GRPOTrainer on the same model, prompts, group size, generation length, learning rate and beta,
  run alternately (sync, async, TRL; `pairs` rounds) with ratios round by round. Fixed work (the
  default): EOS is never drawn on either side, so every sample is `max_new_tokens` long;
- training wall time of the Ray runtime with `model_update_interval` 1 vs 10;
- weight sync (bench/sync.py): seconds per update to the Ray workers, object store vs broadcast.

End-to-end samples/s are over each side's whole training clock, and, as `steady_samples_per_s`, over
the steps after the first (without one-off costs: compiling softrl's decode step, first allocations).

`systems.json` holds everything and a `ratios` object: softrl_over_trl (and _steady), async_over_sync,
spo_over_ppo_time, spo_over_ppo_memory, learner_of_peak (and ray_interval10_over_1_time,
broadcast_over_object_store_update, ray_interval10_over_1_time_METHOD).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import torch

import softrl.objectives as registry
from softrl.bench.sync import sync_part, update_seconds

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


# --- the device's physical limits ---------------------------------------------------------------------
def best_seconds(run, repeats: int, cuda: bool) -> float:
    """The fastest of `repeats` timings of `run()`, the device drained before and after each."""
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak_flops(n: int = 2048, reps: int = 10, device: str = "cpu") -> float:
    """Best-of-3 FLOP/s of `reps` n x n matrix products in the learner's compute dtype: fp32 on all of
    torch's threads on the CPU; bf16 (autocast's), n = 8192, on CUDA."""
    from softrl.models.device import resolve_device

    where = resolve_device(device)
    cuda = where.type == "cuda"
    n, dtype = (8192, torch.bfloat16) if cuda else (n, torch.float32)
    a, b = torch.randn(n, n, dtype=dtype, device=where), torch.randn(n, n, dtype=dtype, device=where)
    torch.mm(a, b)  # warm-up
    seconds = best_seconds(lambda: [torch.mm(a, b) for _ in range(reps)], 3, cuda)
    return 2 * n**3 * reps / seconds


def memory_bandwidth(device: torch.device, mib: int = 1024) -> float:
    """Best-of-5 bytes/s of a device-to-device copy of `mib` MiB, counting bytes read and written: what
    a decode step that reads every weight once can move at most."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    return 2 * src.numel() / best_seconds(lambda: dst.copy_(src), 5, device.type == "cuda")


def matmul_params(model) -> tuple[int, int]:
    """(body, head): parameters that take part in matrix products, the decoder's and the output head's
    (the head runs at response positions only). An untied input embedding is a lookup and left out;
    a tied one is counted once, as the head it also is."""
    total = sum(p.numel() for p in model.parameters())
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or embed.weight is not head.weight:
        total -= embed.weight.numel()
    head_params = 0 if head is None else head.weight.numel()
    return total - head_params, head_params


# passes per step of the decoder body over the tokens a forward pass runs, in units of 2 * body * tokens:
# a trained model costs forward + backward = 3 units, the frozen reference 1, PPO's value model 3 more
STEP_PASSES = {name: 3 + 1 + (3 if objective.value_model else 0) for name, objective in registry.REGISTRY.items()}


def step_flops(method: str, body: int, head: int, trained_tokens: int, reference_tokens: int, positions: int) -> int:
    """Matrix-product FLOPs of one learner step: the body over the tokens each model runs (the trained
    ones `trained_tokens`, the reference `reference_tokens`), the output head at the `positions`
    predicting response tokens (policy forward + backward and the reference: 4 passes; the value
    model's scalar head is left out, as attention's own products are)."""
    body_tokens = reference_tokens + (STEP_PASSES[method] - 1) * trained_tokens
    return 2 * (body * body_tokens + 4 * head * positions)


def batch_rows(model_path: str, task: str, prompts: int, samples_per_prompt: int, max_new_tokens: int,
               seed: int = 0, fixed: bool = True, device: str = "auto") -> list[dict]:
    """A fixed online batch: the reference's graded samples of `prompts` training prompts (with `fixed`,
    every one exactly `max_new_tokens` long)."""
    from dataclasses import replace

    from softrl.assemble import sampler
    from softrl.rollout import Context, rollouts

    s = sampler(task, model_path, size=prompts, max_new_tokens=max_new_tokens, source="online", device=device)
    contexts = [Context(p, s.encode_prompt(p.text)) for p in s.task.prompts()]
    spec = replace(s.spec, ignore_eos=fixed)
    return [{**r.to_row(), "mix_source": "online"} for r in rollouts(spec, contexts, samples_per_prompt, seed)]


def learner_setup(method: str, model_path: str, rows: list[dict], samples_per_prompt: int, store: str,
                  device: str = "auto", checkpointing: bool = False):
    """(run, batch): a run of `method` online on `rows`, every prompt's Q0 0.5, and its batch of them."""
    from softrl.assemble import Run
    from softrl.config import config_from
    from softrl.runtime.feed import DataFeed

    config = config_from({"data.objective.algorithm": method, "data.mix": {"online": 1.0}, "model.path": model_path,
                          "data.store": store, "sampling.samples_per_prompt": samples_per_prompt,
                          "optim.warmup_steps": 0, "model.device": device,
                          "optim.gradient_checkpointing": checkpointing})
    run = Run(config)
    feed = DataFeed(config, run.store, run.train_task, {r["prompt_id"]: 0.5 for r in rows}, run.tokenizer)
    return run, feed.batch(rows)


def learner_step(method: str, model_path: str, rows: list[dict], samples_per_prompt: int, steps: int,
                 store: str, device: str = "auto", checkpointing: bool = False) -> dict:
    """Load the models, take one warm-up step (optimizer state), then time `steps` steps. Memory is
    the peak during all of it: on the CPU the resident size above the process before any model was
    loaded, on CUDA the most memory PyTorch allocated on the device."""
    base = rss_mib()
    peak_was_reset = reset_peak_rss()
    run, batch = learner_setup(method, model_path, rows, samples_per_prompt, store, device, checkpointing)
    cuda = run.placement.device.type == "cuda"
    first = run.learner.step(batch)
    times, split = [], []
    for _ in range(steps):
        start = time.perf_counter()
        metrics = run.learner.step(batch)
        times.append(time.perf_counter() - start)
        split.append({k: v for k, v in metrics.items() if k.startswith("time/")})
    step_s = median(times)
    # the frozen reference always shares prompts; trained models not under activation checkpointing
    shared, padded = forward_tokens(batch.padded), batch.padded.input_ids.numel()
    trained = padded if checkpointing else shared
    body, head = matmul_params(run.policy.model)
    positions = batch.padded.input_ids.shape[0] * batch.padded.max_response
    flops = step_flops(method, body, head, trained, shared, positions)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mib() - base
    return {"method": method, "step_s": step_s, "peak_mib": peak, "peak_of": "cuda allocated" if cuda else "rss",
            "rows": len(rows), "padded_tokens": padded, "forward_tokens": shared, "params": body + head, "head_params": head, "step_flops": flops,
            "achieved_flops": flops / step_s, "threads": torch.get_num_threads(), "peak_was_reset": peak_was_reset,
            "first_loss": first["loss"], "checkpointing": checkpointing, "device": str(run.placement.device),
            "split_s": {k.removeprefix("time/"): median([s[k] for s in split]) for k in split[0]}}


def forward_tokens(padded) -> int:
    """Tokens a forward pass over the batch runs: each distinct prompt once and every row's response
    when the prompts are shared (`logprobs.SharedPrompts`), else the whole padded batch."""
    shared = padded.shared
    if shared is None:
        return padded.input_ids.numel()
    return shared.prompt_ids.numel() + shared.response_ids.numel()


def learner_step_from_file(method: str, model_path: str, rows_file: str, samples_per_prompt: int, steps: int,
                           device: str = "auto", checkpointing: bool = False) -> dict:
    """`learner_step` on the rows of a JSON file, with its store beside the file."""
    rows = json.loads(Path(rows_file).read_text())
    return learner_step(method, model_path, rows, samples_per_prompt, steps, str(Path(rows_file).parent / "store"),
                        device, checkpointing)


def in_fresh_process(function: str, **kwargs) -> dict | None:
    """`function(**kwargs)` (one of FRESH_PROCESS) in a fresh Python, so that each side's peak memory,
    allocator policy (`Placement.host_allocator`) and caches are its own."""
    out = subprocess.run([sys.executable, "-m", "softrl.bench.systems", function, json.dumps(kwargs, default=str)],
                         capture_output=True, text=True, check=False, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if out.returncode != 0:
        raise RuntimeError(f"{function} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- end to end -----------------------------------------------------------------------------------
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
    from softrl.assemble import sampler
    from softrl.models.loading import quiet_transformers

    root = Path(root)
    s = sampler(task, model_path, size=200, device=device)
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


def alternate(sides: dict, pairs: int, phase=lambda name: None) -> dict:
    """Run every side once per round, in the same order, for `pairs` rounds (A B A B ...): each side's
    results in round order. `sides`: name -> a callable returning a result with `samples_per_s`."""
    results: dict[str, list[dict]] = {name: [] for name in sides}
    for i in range(pairs):
        for name, run in sides.items():
            phase(f"round {i + 1}/{pairs}: {name}")
            results[name].append(run())
    return results


def pair_ratios(results: dict[str, list[dict]], top: str, bottom: str, key: str = "samples_per_s") -> dict:
    """`key` (samples/s) of `top` over `bottom`, round by round, and their median."""
    by_pair = [a[key] / b[key] for a, b in zip(results[top], results[bottom]) if a.get(key) and b.get(key)]
    return {"by_pair": by_pair, "median": median(by_pair) if by_pair else None}


def against_trl(rounds: dict[str, list[dict]]) -> dict:
    """softrl's modes against TRL's fastest generation setting (median samples/s over the rounds), round by
    round, over the whole clock (`vs_trl`) and after the first step (`vs_trl_steady`); `softrl_fastest`
    the mode whose whole-clock median ratio is higher."""
    speed = lambda name: median(r["samples_per_s"] for r in rounds[name])  # noqa: E731
    fastest = max((name for name in rounds if name.startswith("trl-")), key=speed)
    modes = [name.removeprefix("softrl-") for name in rounds if name.startswith("softrl-")]
    vs = {mode: pair_ratios(rounds, f"softrl-{mode}", fastest) for mode in modes}
    return {"trl_fastest": fastest, "vs_trl": vs, "softrl_fastest": max(vs, key=lambda m: vs[m]["median"]),
            "vs_trl_steady": {mode: pair_ratios(rounds, f"softrl-{mode}", fastest, "steady_samples_per_s")
                              for mode in modes}}


def run_systems(model_path: str, task: str, root: Path, parts: set[str], prompts: int = 16, samples_per_prompt: int = 4,
                max_new_tokens: int = 24, timed_steps: int = 10, e2e_steps: int = 40, ray_steps: int = 30,
                trl_steps: int = 20, pairs: int = 3, lr: float = 1e-4, fixed: bool = True, device: str = "auto",
                checkpointing: bool = False, trl_generation: tuple[str, ...] = ("dynamic",),
                modes: tuple[str, ...] = ("sync", "async"), phase=lambda name: None) -> dict:
    """Each part the set names (learner, e2e, ray, trl): the numbers of the module docstring. e2e and
    trl run alternately, `pairs` rounds of softrl in each of its runtime `modes`, then TRL in each of
    its `trl_generation` settings; softrl is compared with the fastest of them (median samples/s)."""
    from softrl.algorithms.common import SPO_BETA

    root.mkdir(parents=True, exist_ok=True)
    out: dict = {"model": model_path, "task": task, "batch": f"{prompts} prompts x {samples_per_prompt} samples",
                 "max_new_tokens": max_new_tokens, "fixed_work": fixed, "lr": lr, "beta": SPO_BETA,
                 "threads": torch.get_num_threads(), "cpu": cpu_name(), "device": device, "ratios": {}}
    ratios = out["ratios"]
    if "learner" in parts:
        phase("matmul peak")
        out["matmul_peak_flops"] = matmul_peak_flops(device=device)
        rows_file = root / "batch.json"
        rows_file.write_text(json.dumps(batch_rows(model_path, task, prompts, samples_per_prompt, max_new_tokens,
                                                   fixed=fixed, device=device), default=str))
        out["learner"] = {}
        for method in STEP_METHODS:
            phase(f"learner step: {method}")
            r = in_fresh_process("learner_step_from_file", method=method, model_path=model_path, rows_file=rows_file,
                                 samples_per_prompt=samples_per_prompt, steps=timed_steps, device=device,
                                 checkpointing=checkpointing)
            out["learner"][method] = {**r, "of_peak": r["achieved_flops"] / out["matmul_peak_flops"]}
        spo, ppo = out["learner"]["spo"], out["learner"]["ppo"]
        ratios.update(spo_over_ppo_time=spo["step_s"] / ppo["step_s"], spo_over_ppo_memory=spo["peak_mib"] / ppo["peak_mib"],
                      learner_of_peak=spo["of_peak"])
    common = dict(task=task, prompts=prompts, samples_per_prompt=samples_per_prompt)
    grpo = {"data.objective": {"algorithm": "grpo"}, "sampling.max_new_tokens": max_new_tokens, "model.path": model_path,
            "sampling.ignore_eos": fixed, "optim.lr": lr, "beta": SPO_BETA, "model.device": device}
    sides = {}
    if "e2e" in parts:
        for mode in modes:
            sides[f"softrl-{mode}"] = lambda mode=mode: in_fresh_process("end_to_end", settings=runtime_settings(
                root, f"local-{mode}", steps=e2e_steps, **{"runtime.mode": mode, **grpo}, **common))
    if "trl" in parts:
        import importlib.util

        if importlib.util.find_spec("trl") is not None:
            for generation in trl_generation:
                sides[f"trl-{generation}"] = lambda generation=generation: in_fresh_process(
                    "trl_grpo", model_path=model_path, task=task, steps=trl_steps, prompts=prompts,
                    samples_per_prompt=samples_per_prompt, max_new_tokens=max_new_tokens, root=root, lr=lr,
                    beta=SPO_BETA, fixed=fixed, device=device, generation=generation)
    if sides:
        out["rounds"] = alternate(sides, pairs, phase)
        rounds = out["rounds"]
        if {"softrl-sync", "softrl-async"} <= set(rounds):
            ratios["async_over_sync"] = pair_ratios(rounds, "softrl-async", "softrl-sync")["median"]
        if any(name.startswith("trl-") for name in rounds) and any(name.startswith("softrl-") for name in rounds):
            out.update(against_trl(rounds))
            ratios.update(softrl_over_trl=out["vs_trl"][out["softrl_fastest"]]["median"],
                          softrl_over_trl_mode=out["softrl_fastest"])
            steady = out["vs_trl_steady"][out["softrl_fastest"]]["median"]
            if steady is not None:
                ratios["softrl_over_trl_steady"] = steady
    if "sync" in parts:
        phase("weight sync")
        out["sync"], sync_ratios = sync_part(root, model_path, runtime_settings, grpo, common, ray_steps, in_fresh_process)
        ratios.update(sync_ratios)
    if "ray" in parts and ray_steps:
        out["ray"] = {}
        for interval in (1, 10):
            phase(f"end to end: ray, model_update_interval {interval}")
            out["ray"][interval] = in_fresh_process("end_to_end", settings=runtime_settings(
                root, f"ray-interval{interval}", steps=ray_steps, **{"runtime.kind": "ray", "runtime.workers": 2,
                                                                     "runtime.model_update_interval": interval, **grpo},
                **common))
        ratios["ray_interval10_over_1_time"] = out["ray"][10]["seconds"] / out["ray"][1]["seconds"]
    return out


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


FRESH_PROCESS = {"learner_step_from_file": learner_step_from_file, "end_to_end": end_to_end, "trl_grpo": trl_grpo,
                 "update_seconds": update_seconds}

if __name__ == "__main__":  # the subprocess of in_fresh_process
    function, kwargs = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(FRESH_PROCESS[function](**kwargs)))
