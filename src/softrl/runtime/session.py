"""What every runtime sets up the same way: models, tasks, store, Q0, data sources, learner,
run directory, metrics log and checkpoints. A runtime (local.py, ray_runtime.py) only decides where
generation and learning run and how they talk; the pieces live here and below."""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from softrl.annotate.q0 import estimate_q0
from softrl.config import GROUP_ALGORITHMS, ConfigError, RunConfig
from softrl.data import ExperienceStore, GroupSampler, MixtureSampler, TrajectoryPool
from softrl.eval.protocol import evaluate
from softrl.models.loading import encode_prompt, encode_response, tokenizer_fingerprint
from softrl.models.wrappers import PolicyModel, ReferenceModel, ValueModel
from softrl.rollout import RolloutSpec, RolloutWorker
from softrl.train.batch import make_batch
from softrl.train.learner import Learner

BUILTIN_SIZED = ("countdown", "tinycode")


@dataclass
class Progress:
    step: int = 0
    samples: int = 0  # online samples generated
    seconds: float = 0.0  # wall time of the run so far (kept across resumes)


def resolve_model(config: RunConfig) -> str:
    return model_directory(config.model.path, config.task.name)


def model_directory(path: str, task: str) -> str:
    """The model directory: as given, the task's bootstrap reference, or a prepared pretrained model."""
    from softrl.models.prepare import KNOWN, prepare_model

    if path in KNOWN:
        try:
            return str(prepare_model(path))
        except ValueError as e:
            raise ConfigError(f"model.path: {e}") from e
    if path != "bootstrap":
        return path
    from softrl.models.bootstrap import TASKS, bootstrap

    if task not in TASKS:
        raise ConfigError(f"model.path: no bootstrap model for task {task!r}; give a model directory")
    return str(bootstrap(task))


def load_tasks(config: RunConfig):
    """(training task, evaluation task): built-in and gym tasks are generated, the held-out split
    from its own seed; a dataset task's prompts are both (documented in USAGE.md)."""
    from softrl.tasks.registry import load_task

    t = config.task
    try:
        if t.name in BUILTIN_SIZED or t.name.startswith("gym:"):
            return (load_task(t.name, size=t.size, seed=t.seed, **t.options),
                    load_task(t.name, size=t.eval_size, seed=t.eval_seed, **t.options))
        task = load_task(t.name, **t.options)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"task: {e}") from e
    return task, task


def rollout_spec(config: RunConfig, task, model, tokenizer, source: str) -> RolloutSpec:
    """Sampling `model` on `task` with the run's decoding settings."""
    from softrl.models.bootstrap import MAX_NEW_TOKENS

    s = config.sampling
    return RolloutSpec.for_model(task, model, tokenizer, s.max_new_tokens or MAX_NEW_TOKENS.get(config.task.name, 256),
                                 temperature=s.temperature, temperature_range=s.temperature_range, top_p=s.top_p,
                                 source=source, run_id=config.name)


def optional_sinks(config: RunConfig) -> list:
    """Openers of the optional metric sinks (TensorBoard, Weights & Biases); each returns a
    `write(step, numbers)`. Checked up front so that a missing package creates nothing."""
    sinks = []
    if config.log.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ConfigError("log.tensorboard needs TensorBoard: pip install 'softrl[tensorboard]'") from e

        def tensorboard(run_dir: Path, cfg: RunConfig):
            writer = SummaryWriter(str(run_dir / "tensorboard"))

            def write(step: int, numbers: dict) -> None:
                for key, value in numbers.items():
                    writer.add_scalar(key, value, step)
                writer.flush()

            return write

        sinks.append(tensorboard)
    if config.log.wandb:
        try:
            import wandb
        except ImportError as e:
            raise ConfigError("log.wandb needs Weights & Biases: pip install 'softrl[wandb]'") from e

        def weights_and_biases(run_dir: Path, cfg: RunConfig):
            run = wandb.init(project=cfg.log.wandb_project, name=cfg.name, dir=str(run_dir),
                             config=cfg.model_dump(mode="json"), resume="allow")
            return lambda step, numbers: run.log(numbers, step=step)

        sinks.append(weights_and_biases)
    return sinks


class Session:
    """One run: everything a runtime needs, set up in the order that fails fast and creates nothing
    on bad input (the model is loaded before the run directory exists)."""

    def __init__(self, config: RunConfig, resume: bool = False, log=print):
        self.config, self.log, self.resume = config, log, resume
        run_dir = config.run_dir
        if run_dir.exists() and not resume and any(run_dir.iterdir()):
            raise ConfigError(f"run directory {run_dir} exists: pass --resume, or another name=...")
        if resume and not (run_dir / "checkpoints").is_dir():
            raise ConfigError(f"nothing to resume in {run_dir} (no checkpoints/)")
        self.sinks = optional_sinks(config)  # fail before anything is created when a package is missing
        self.model_path = resolve_model(config)
        self.policy = PolicyModel.load(self.model_path, config.model.dtype, config.model.lora)
        self.reference = ReferenceModel.from_policy(self.policy)
        self.tokenizer = self.policy.tokenizer
        self.fingerprint = tokenizer_fingerprint(self.tokenizer)
        self.train_task, self.eval_task = load_tasks(config)
        self.prompts = self.train_task.prompts()
        uses = {config.data.objective_for(s).algorithm for s in config.data.mix}
        self.value = ValueModel(self.reference.model) if "ppo" in uses else None
        self.store = ExperienceStore(config.data.store)
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        self.learner = Learner(self.policy, self.reference, config, self.value)
        self.progress = Progress()
        self.prompt_rng = random.Random(config.seed)
        self.metrics_path = run_dir / "metrics.jsonl"
        self.earlier_seconds = 0.0  # wall time of the sessions before a resume
        self.eval_seconds = 0.0  # evaluation is not training: left out of the run's wall time
        self.writers = [open_sink(run_dir, config) for open_sink in self.sinks]

    # --- pieces -------------------------------------------------------------------------------
    def encode_prompt(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    def encode_response(self, text: str) -> list[int]:
        return encode_response(self.tokenizer, text)

    def spec(self, model, source: str, task=None) -> RolloutSpec:
        return rollout_spec(self.config, task or self.train_task, model, self.tokenizer, source)

    def worker(self, model) -> RolloutWorker:
        return RolloutWorker(self.spec(model, "online"), self.encode_prompt, self.store)

    def estimate_q0(self, progress=None) -> dict[str, float]:
        """Q0 success of every training prompt (sampled from the reference now where missing)."""
        rows = estimate_q0(self.spec(self.reference.model, "reference"), self.prompts, self.encode_prompt,
                           self.store, self.config.q0.k, self.config.beta, str(Path(self.model_path).resolve()),
                           seed=self.config.seed, progress=progress)
        self.q0_success = {pid: row["q0_success"] for pid, row in rows.items()}
        return self.q0_success

    def offline_sources(self) -> MixtureSampler | None:
        """The non-online sources of the mix, drawn from the store (rows of the training prompts);
        also kept as `self.mixture` (its RNG state is checkpointed)."""
        cfg = self.config.data
        wanted = {s: w for s, w in cfg.mix.items() if s != "online" and w > 0}
        self.mixture = None
        if not wanted:
            return None
        known = set(self.q0_success)
        sources = {}
        for source in wanted:
            if source == "offline":
                table = self.store.trajectories(task=self.train_task.name, source=cfg.offline_sources,
                                                passed=True if cfg.offline_passed_only else None)
            else:  # mc: rows annotated by `softrl pts`
                table = self.store.trajectories(task=self.train_task.name)
            rows = [r for r in table.to_pylist() if r["prompt_id"] in known and (source != "mc" or r["mc_targets"])]
            pool = TrajectoryPool(rows)
            if cfg.objective_for(source).algorithm in GROUP_ALGORITHMS:
                pool = GroupSampler(pool, self.config.sampling.samples_per_prompt, seed=self.config.seed)
            sources[source] = pool
            self.log(f"{source} pool: {len(rows)} trajectories")
        if not any(len(getattr(src, "pool", src)) for src in sources.values()):
            where = f"{', '.join(wanted)} in {cfg.store}"
            if cfg.mix.get("online", 0) <= 0:
                raise ConfigError(f"data.mix: no trajectories for {where} and no online share: import data "
                                  "(softrl data import), run softrl q0, or give online a weight")
            self.log(f"warning: no trajectories for {where}; training on online samples only")
            return None
        self.mixture = MixtureSampler(sources, wanted, seed=self.config.seed)
        return self.mixture

    def extra_rows(self, online_rows: int) -> list[dict]:
        """Rows of the other sources in proportion to their weight against online's."""
        mix, mixture = self.config.data.mix, self.mixture
        if mixture is None:
            return []
        online_weight = mix.get("online", 0.0)
        if online_weight > 0:
            count = round(online_rows * sum(w for s, w in mix.items() if s != "online") / online_weight)
        else:
            count = self.config.sampling.prompts_per_step * self.config.sampling.samples_per_prompt
        return mixture.sample(count) if count else []

    def batch(self, rows: list[dict]):
        return make_batch(rows, self.fingerprint, self.tokenizer.pad_token_id, self.encode_prompt,
                          self.encode_response, self.q0_success, self.config.beta)

    def next_prompts(self):
        return self.prompt_rng.sample(self.prompts, min(self.config.sampling.prompts_per_step, len(self.prompts)))

    def generation_seed(self, step: int) -> int:
        return self.config.seed * 1_000_003 + step

    def evaluate(self, model) -> dict:
        e, started = self.config.eval, time.time()
        result = evaluate(self.spec(model, "eval", self.eval_task), self.eval_task.prompts(), self.encode_prompt,
                          e.samples, e.temperature, e.top_p, seed=self.config.seed + 17, stats=e.stats,
                          reference=self.reference.model)
        self.eval_seconds += time.time() - started
        return {f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float)) and v is not None}

    # --- the run's phases, as every runtime drives them ----------------------------------------
    def prepare(self, progress=None) -> None:
        """Q0, the offline sources, then the newest checkpoint (resume) or the evaluation before training."""
        self.estimate_q0(progress)
        self.offline_sources()
        if self.resume:
            self.restore()
        else:
            before = self.evaluate(self.policy.model)
            self.write_metrics({"step": 0, "samples": 0, "time": 0.0, **before})
        self.eval_seconds = 0.0  # the run's clock starts after this

    def learn(self, online: list[dict], elapsed: float) -> dict:
        """One learner step on the online rows plus the other sources' share; logs the step,
        evaluates and checkpoints when due. Returns the step's record. `elapsed`: the runtime's wall
        time so far, of which the evaluations during training are not counted."""
        cfg, p = self.config, self.progress
        elapsed -= self.eval_seconds
        batch = self.batch(online + self.extra_rows(len(online)))
        metrics = self.learner.step(batch)
        p.step += 1
        p.samples += len(online)
        p.seconds = elapsed
        record = {"step": p.step, "samples": p.samples, "time": round(elapsed, 2),
                  "samples_per_s": p.samples / max(elapsed, 1e-9), "batch_rows": len(batch),
                  "online_pass_rate": sum(r["passed"] for r in online) / max(len(online), 1), **metrics}
        if cfg.eval.every and p.step % cfg.eval.every == 0 and p.step < cfg.optim.steps:
            record.update(self.evaluate(self.policy.model))
        self.write_metrics(record)
        if p.step % cfg.log.checkpoint_every == 0 or p.step == cfg.optim.steps:
            self.checkpoint()
        return record

    def finish(self) -> dict:
        """The evaluation after training, final weights, plots and summary.json."""
        from softrl.plots import plot_run

        after = self.evaluate(self.policy.model)
        self.write_metrics({"step": self.progress.step, "samples": self.progress.samples,
                            "time": round(self.progress.seconds, 2), **after})
        self.policy.save(self.run_dir / "final")
        plots = plot_run(self.run_dir)
        records = [json.loads(line) for line in self.metrics_path.read_text().splitlines()]
        before = next((r for r in records if r["step"] == 0 and "eval/pass@1" in r), {})
        summary = {
            "run_dir": str(self.run_dir), "steps": self.progress.step, "samples": self.progress.samples,
            "seconds": round(self.progress.seconds, 1),
            "pass@1_before": before.get("eval/pass@1"), "pass@10_before": before.get("eval/pass@10"),
            "pass@1_after": after.get("eval/pass@1"), "pass@10_after": after.get("eval/pass@10"),
            "plots": [str(p) for p in plots], "threads": torch.get_num_threads(),
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    # --- logging and checkpoints --------------------------------------------------------------
    def write_metrics(self, record: dict) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        for write in self.writers:
            write(record["step"], numbers)

    def sampler_states(self) -> dict:
        if self.mixture is None:
            return {}
        return {"mixture": self.mixture.rng.getstate(),
                **{name: src.rng.getstate() for name, src in self.mixture.sources.items() if hasattr(src, "rng")}}

    def set_sampler_states(self, states: dict) -> None:
        if self.mixture is None:
            return
        self.mixture.rng.setstate(states["mixture"])
        for name, src in self.mixture.sources.items():
            if name in states and hasattr(src, "rng"):
                src.rng.setstate(states[name])

    def checkpoint(self) -> Path:
        """policy weights + learner, sampler and RNG state + progress, written atomically."""
        root = self.run_dir / "checkpoints"
        final = root / f"step-{self.progress.step:06d}"
        work = root / f".{final.name}.tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        self.policy.model.save_pretrained(work / "policy")
        torch.save({"learner": self.learner.state_dict(), "progress": vars(self.progress),
                    "rng": {"samplers": self.sampler_states(), "prompts": self.prompt_rng.getstate(),
                            "torch": torch.get_rng_state()}},
                   work / "state.pt")
        shutil.rmtree(final, ignore_errors=True)
        work.rename(final)
        for old in sorted(p for p in root.iterdir() if p.name.startswith("step-"))[: -self.config.log.keep_checkpoints]:
            shutil.rmtree(old)
        return final

    def restore(self) -> None:
        """Load the newest checkpoint (after `offline_sources`); drop metrics logged after it."""
        root = self.run_dir / "checkpoints"
        latest = sorted(p for p in root.iterdir() if p.name.startswith("step-"))[-1]
        from transformers import AutoModelForCausalLM

        weights = AutoModelForCausalLM.from_pretrained(latest / "policy", dtype=self.policy.model.dtype).state_dict()
        self.policy.model.load_state_dict(weights)
        state = torch.load(latest / "state.pt", weights_only=False)
        self.learner.load_state_dict(state["learner"])
        self.progress = Progress(**state["progress"])
        self.earlier_seconds = self.progress.seconds
        self.prompt_rng.setstate(state["rng"]["prompts"])
        torch.set_rng_state(state["rng"]["torch"])
        self.set_sampler_states(state["rng"]["samplers"])
        if self.metrics_path.exists():
            kept = [line for line in self.metrics_path.read_text().splitlines()
                    if json.loads(line).get("step", 0) <= self.progress.step]
            self.metrics_path.write_text("".join(line + "\n" for line in kept))
        self.log(f"resumed from {latest.name}")

    def elapsed(self, started: float) -> float:
        return self.earlier_seconds + time.time() - started
