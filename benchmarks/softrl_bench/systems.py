"""`softrl bench systems`: what the machine does with the same model and batch.

- learner step time, peak memory and its time split (forward, backward, optimizer) of SPO vs PPO
  (with its value model) vs GRPO, alternately for `pairs` rounds (ratios round by round), each in a fresh process (CPU: peak resident memory over the
  steps above the process before any model loaded; CUDA: PyTorch's peak allocation);
- achieved training FLOP/s of those steps against the device's measured matmul peak;
- end-to-end samples/s of the local runtime, sync and async, and, with TRL installed, its
  GRPOTrainer in each generation setting asked for, on the same model, prompts, group size,
  generation length, learning rate and beta, run alternately (`pairs` rounds) with ratios round by
  round against TRL's fastest setting. Fixed work (the default): EOS is never drawn on either side,
  so every sample is `max_new_tokens` long;
- training wall time of the Ray runtime with `model_update_interval` 1 vs 10;
- weight sync (softrl_bench/sync.py): seconds per update to the Ray workers, object store vs broadcast.

The end-to-end sides (softrl's local runtime, TRL) and their round-by-round ratios: softrl_bench/end_to_end.py.

`systems.json` holds everything and a `ratios` object: softrl_over_trl (and _steady), async_over_sync,
spo_over_ppo_time, spo_over_ppo_memory, learner_of_peak (and ray_interval10_over_1_time,
broadcast_over_object_store_update, ray_interval10_over_1_time_METHOD).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import torch

import softrl.objectives as registry
from softrl_bench.end_to_end import against_trl, alternate, end_to_end, pair_ratios, runtime_settings, trl_grpo
from softrl_bench.sync import sync_part, update_seconds

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

    from softrl.assemble import task_model
    from softrl.rollout import Context, rollouts

    s = task_model(task, model_path, size=prompts, max_new_tokens=max_new_tokens, source="online", device=device)
    contexts = [Context(p, s.encode_prompt(p.text)) for p in s.task.prompts()]
    spec = replace(s.spec, ignore_eos=fixed)
    return [{**r.to_row(), "mix_source": "online"} for r in rollouts(spec, contexts, samples_per_prompt, seed)]


def batch_rows_to_file(rows_file: str, **kwargs) -> dict:
    """`batch_rows(**kwargs)` written to a JSON file; how many rows."""
    rows = batch_rows(**kwargs)
    Path(rows_file).write_text(json.dumps(rows, default=str))
    return {"rows": len(rows)}


def learner_setup(method: str, model_path: str, rows: list[dict], samples_per_prompt: int, store: str,
                  device: str = "auto", checkpointing: bool = False, micro_batch_tokens: int = 0):
    """(run, batch): a run of `method` online on `rows`, every prompt's Q0 0.5, and its batch of them;
    `micro_batch_tokens` as `optim.micro_batch_tokens` (0: the whole batch in one pass)."""
    from softrl.assemble import RunParts
    from softrl.config import config_from
    from softrl.runtime.feed import DataFeed

    config = config_from({"data.objective.algorithm": method, "data.mix": {"online": 1.0}, "model.path": model_path,
                          "data.store": store, "sampling.samples_per_prompt": samples_per_prompt,
                          "optim.warmup_steps": 0, "model.device": device,
                          "optim.gradient_checkpointing": checkpointing,
                          "optim.micro_batch_tokens": micro_batch_tokens})
    run = RunParts(config)
    feed = DataFeed(config, run.store, run.train_task, {r["prompt_id"]: 0.5 for r in rows}, run.tokenizer)
    return run, feed.batch(rows)


def learner_step(method: str, model_path: str, rows: list[dict], samples_per_prompt: int, steps: int,
                 store: str, device: str = "auto", checkpointing: bool = False, micro_batch_tokens: int = 0) -> dict:
    """Load the models, take one warm-up step (optimizer state), then time `steps` steps. Memory is
    the peak during all of it: on the CPU the resident size above the process before any model was
    loaded, on CUDA the most memory PyTorch allocated on the device."""
    base = rss_mib()
    peak_was_reset = reset_peak_rss()
    run, batch = learner_setup(method, model_path, rows, samples_per_prompt, store, device, checkpointing,
                               micro_batch_tokens)
    cuda = run.placement.device.type == "cuda"
    first = run.learner.step(batch)
    times, split = [], []
    for _ in range(steps):
        start = time.perf_counter()
        metrics = run.learner.step(batch)
        times.append(time.perf_counter() - start)
        split.append({k: v for k, v in metrics.items() if k.startswith("time/")})
    step_s = median(times)
    if os.environ.get("SOFTRL_PROFILE"):
        profile_step(run, batch, Path(os.environ["SOFTRL_PROFILE"]) / f"{method}-profile.txt", cuda)
    # counted over the micro-batches the learner runs, each padded to its own longest row; the frozen
    # reference always shares prompts, trained models do unless under activation checkpointing
    pieces = [batch.subset(index) for _, index, _ in run.learner.pieces(batch)]
    shared = sum(forward_tokens(p.padded) for p in pieces)
    padded = sum(p.padded.input_ids.numel() for p in pieces)
    trained = padded if checkpointing else shared
    body, head = matmul_params(run.policy.model)
    positions = sum(p.padded.input_ids.shape[0] * p.padded.max_response for p in pieces)
    flops = step_flops(method, body, head, trained, shared, positions)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mib() - base
    return {"method": method, "step_s": step_s, "peak_mib": peak, "peak_of": "cuda allocated" if cuda else "rss",
            "rows": len(rows), "padded_tokens": padded, "forward_tokens": shared, "params": body + head, "head_params": head, "step_flops": flops,
            "achieved_flops": flops / step_s, "threads": torch.get_num_threads(), "peak_was_reset": peak_was_reset,
            "first_loss": first["loss"], "checkpointing": checkpointing, "micro_batch_tokens": micro_batch_tokens,
            "device": str(run.placement.device),
            "split_s": {k.removeprefix("time/"): median([s[k] for s in split]) for k in split[0]}}


def profile_step(run, batch, path: Path, cuda: bool) -> None:
    """One more learner step under torch.profiler, untimed, its operators by self time on the device
    (CUDA) or the CPU into `path`: where a step's time goes when its fraction of the matmul peak is low."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        run.learner.step(batch)
        if cuda:
            torch.cuda.synchronize()
    averages = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(averages.table(sort_by=key, row_limit=40) + "\n\nby input shape:\n"
                    + prof.key_averages(group_by_input_shape=True).table(sort_by=key, row_limit=25))


def median_round(rounds: list[dict]) -> dict:
    """A method's numbers from the round with its median step time, with the median peak memory."""
    middle = sorted(rounds, key=lambda r: r["step_s"])[len(rounds) // 2]
    return {**middle, "peak_mib": median(r["peak_mib"] for r in rounds), "rounds": len(rounds)}


def forward_tokens(padded) -> int:
    """Tokens a forward pass over the batch runs: each distinct prompt once and every row's response
    when the prompts are shared (`logprobs.SharedPrompts`), else the whole padded batch."""
    shared = padded.shared
    if shared is None:
        return padded.input_ids.numel()
    return shared.prompt_ids.numel() + shared.response_ids.numel()


def learner_step_from_file(method: str, model_path: str, rows_file: str, samples_per_prompt: int, steps: int,
                           device: str = "auto", checkpointing: bool = False, micro_batch_tokens: int = 0) -> dict:
    """`learner_step` on the rows of a JSON file, with its store beside the file."""
    rows = json.loads(Path(rows_file).read_text())
    return learner_step(method, model_path, rows, samples_per_prompt, steps, str(Path(rows_file).parent / "store"),
                        device, checkpointing, micro_batch_tokens)


def release_device_memory() -> None:
    """Give the blocks PyTorch's caching allocator holds back to the GPU (nothing on the CPU; a compiled
    CUDA-graph function's pools stay while it lives)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def in_fresh_process(function: str, **kwargs) -> dict | None:
    """`function(**kwargs)` (one of FRESH_PROCESS) in a fresh Python, so that each side's peak memory,
    allocator policy (`Placement.host_allocator`) and caches are its own. With faulthandler on, a
    process that crashes (a segfault in a CUDA graph, say) leaves the Python frames where it did."""
    out = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "softrl_bench.systems", function,
                          json.dumps(kwargs, default=str)],
                         capture_output=True, text=True, check=False, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if out.returncode != 0:
        raise RuntimeError(f"{function} failed: {failure(out.stderr, out.returncode)}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def failure(stderr: str, returncode: int = 1) -> str:
    """A failed process's error on one line: the last line of its stderr and, after a traceback, the
    frame that raised it (a bare `AssertionError` names nothing else). A process killed by a signal
    leaves no traceback, and its last line is whatever it printed before (a warning, on the GPU
    lease of 2026-11-28): then the signal, faulthandler's innermost frame of the crashing thread and
    of each other thread."""
    lines = stderr.strip().splitlines() or ["no output"]
    if returncode < 0:
        def innermost(start: int) -> str | None:
            return next((line.strip() for line in lines[start + 1:] if line.lstrip().startswith('File "')), None)

        crashed = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), None)
        frame = innermost(crashed) if crashed is not None else None
        # where the other threads were (async's generation thread, say): the lease's crashes came while one ran
        others = [f for i, line in enumerate(lines) if line.startswith("Thread 0x") and (f := innermost(i))]
        return (f"killed by {signal.Signals(-returncode).name}" + (f" in {frame}" if frame else " (no Python frame)")
                + (f"; other threads in {'; '.join(others)}" if others else ""))
    frames = [line.strip() for line in lines if line.lstrip().startswith('File "')]
    return lines[-1] + (f" ({frames[-1]})" if frames else "")


def run_systems(model_path: str, task: str, root: Path, parts: set[str], prompts: int = 16, samples_per_prompt: int = 4,
                max_new_tokens: int = 24, timed_steps: int = 10, e2e_steps: int = 40, ray_steps: int = 30,
                trl_steps: int = 20, pairs: int = 3, lr: float = 1e-4, fixed: bool = True, device: str = "auto",
                checkpointing: bool = False, micro_batch_tokens: int = 0, trl_generation: tuple[str, ...] = ("dynamic",),
                modes: tuple[str, ...] = ("sync", "async"), phase=lambda name: None,
                on_progress=lambda partial: None) -> dict:
    """Each part the set names (learner, e2e, ray, trl): the numbers of the module docstring. e2e and
    trl run alternately, `pairs` rounds of softrl in each of its runtime `modes`, then TRL in each of
    its `trl_generation` settings; softrl is compared with the fastest of them (median samples/s).
    `on_progress` gets the result so far after every learner method and every round."""
    from softrl.algorithms.common import SPO_BETA

    root.mkdir(parents=True, exist_ok=True)
    out: dict = {"model": model_path, "task": task, "batch": f"{prompts} prompts x {samples_per_prompt} samples",
                 "max_new_tokens": max_new_tokens, "fixed_work": fixed, "lr": lr, "beta": SPO_BETA,
                 "threads": torch.get_num_threads(), "cpu": cpu_name(), "device": device, "ratios": {}}
    ratios = out["ratios"]
    if "learner" in parts:
        phase("matmul peak")
        out["matmul_peak_flops"] = matmul_peak_flops(device=device)
        release_device_memory()  # the steps run in fresh processes: what this one cached would crowd them
        rows_file = root / "batch.json"
        # generated in a process of its own too: a compiled decode keeps its CUDA-graph pools while it lives
        in_fresh_process("batch_rows_to_file", rows_file=rows_file, model_path=model_path, task=task, prompts=prompts,
                         samples_per_prompt=samples_per_prompt, max_new_tokens=max_new_tokens, fixed=fixed,
                         device=device)
        rounds: dict[str, list[dict]] = {m: [] for m in STEP_METHODS}
        for k in range(pairs):  # the methods alternately, round by round, each step in a fresh process
            for method in STEP_METHODS:
                phase(f"learner step: {method} (round {k + 1} of {pairs})")
                r = in_fresh_process("learner_step_from_file", method=method, model_path=model_path,
                                     rows_file=rows_file, samples_per_prompt=samples_per_prompt, steps=timed_steps,
                                     device=device, checkpointing=checkpointing,
                                     micro_batch_tokens=micro_batch_tokens)
                rounds[method].append({**r, "of_peak": r["achieved_flops"] / out["matmul_peak_flops"]})
            out["learner"] = {m: median_round(rs) for m, rs in rounds.items() if rs}
            on_progress(out)
        by_round = {f"spo_over_ppo_{what}": [a[key] / b[key] for a, b in zip(rounds["spo"], rounds["ppo"])]
                    for what, key in (("time", "step_s"), ("memory", "peak_mib"))}
        out["learner_rounds"] = {**by_round, "step_s": {m: [r["step_s"] for r in rs] for m, rs in rounds.items()},
                                 "peak_mib": {m: [r["peak_mib"] for r in rs] for m, rs in rounds.items()}}
        ratios.update({k: median(v) for k, v in by_round.items()}, learner_of_peak=out["learner"]["spo"]["of_peak"])
    common = dict(task=task, prompts=prompts, samples_per_prompt=samples_per_prompt)
    grpo = {"data.objective": {"algorithm": "grpo"}, "sampling.max_new_tokens": max_new_tokens, "model.path": model_path,
            "sampling.ignore_eos": fixed, "optim.lr": lr, "beta": SPO_BETA, "model.device": device,
            "optim.micro_batch_tokens": micro_batch_tokens}
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
        out["rounds"] = alternate(sides, pairs, phase, lambda rounds: on_progress({**out, "rounds": rounds}))
        rounds = out["rounds"]
        if {"softrl-sync", "softrl-async"} <= set(rounds):
            ratios["async_over_sync"] = pair_ratios(rounds, "softrl-async", "softrl-sync")["median"]
        out.update(against_trl(rounds))
        if "vs_trl" in out:
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
                 "update_seconds": update_seconds, "batch_rows_to_file": batch_rows_to_file}

if __name__ == "__main__":  # the subprocess of in_fresh_process
    function, kwargs = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(FRESH_PROCESS[function](**kwargs)))
