"""Run configuration: pydantic models, one YAML file, `key=value` overrides from the command line.

A wrong key or value is a `ConfigError` with one line naming it (`optim.lr: must be > 0, got -1`).
docs/USAGE.md's configuration reference is generated from these models (config_reference.py).
"""

from __future__ import annotations

import copy
import math
import re
import reprlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

import softrl.objectives as registry
from softrl.algorithms.common import SPO_BETA
from softrl.limits import MAX_PROMPTS, MAX_SEED, StrictModel
from softrl.safe_yaml import YAMLInputError, load_yaml

SOURCES = ("online", "offline", "mc", "pts", "replay")


class ConfigError(ValueError):
    """A configuration problem, in one line that names the key."""


Section = StrictModel  # a config section


DEVICE_NAMES = "auto, cpu, cuda or cuda:N"
LORA_KEYS = ("r", "alpha", "dropout", "target_modules")  # models.wrappers.attach_lora
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


class ModelConfig(Section):
    path: str = Field("bootstrap", description="model directory, a hub id, 'bootstrap' for the task's built-in "
                      "reference (bootstrap:TASK for another task's), or a name `softrl model prepare` knows "
                      "(smollm2-135m; llama-0.5b-random, llama-1b-random: random weights, for speed and memory)")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="dtype of the trained weights (and so of "
                                                  "their gradients and AdamW state)")
    device: str = Field("auto", description="auto (CUDA when available), cpu, cuda or cuda:N")
    autocast: Literal["auto", "off", "bfloat16"] = Field(
        "auto", description="forward passes in bf16 with fp32 weights: auto = on CUDA, off on the CPU")
    lora: dict[str, Any] | None = Field(None, description="PEFT LoRA options (r, alpha, ...); needs softrl[hf] + peft")

    @field_validator("lora")
    @classmethod
    def _lora(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        unknown = sorted(set(value or {}) - set(LORA_KEYS))
        if unknown:
            raise ValueError(f"unknown LoRA option {unknown[0]!r} (use {', '.join(LORA_KEYS)})")
        checks = {"r": (lambda v: type(v) is int and v >= 1, "an integer >= 1"),
                  "alpha": (lambda v: type(v) in (int, float) and math.isfinite(v) and v > 0, "a number > 0"),
                  "dropout": (lambda v: type(v) in (int, float) and 0 <= v < 1, "a number in [0, 1)"),
                  "target_modules": (lambda v: isinstance(v, list) and v and all(isinstance(m, str) for m in v),
                                     "a list of module names")}
        for key, given in (value or {}).items():
            ok, wanted = checks[key]
            if not ok(given):
                raise ValueError(f"LoRA option {key!r} must be {wanted}, got {given!r}")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not DEVICE_PATTERN.fullmatch(value):
            raise ValueError(f"must be {DEVICE_NAMES}")  # the config error adds the value
        return value


class TaskConfig(Section):
    name: str = Field("countdown", description="task spec: countdown, tinycode, tinycode-loops, tinycode-feedback (episodes), KIND:PATH, gym:NAME, "
                      "hf:DATASET[:CONFIG][:SPLIT] (with options.reward), module:Name")
    size: int = Field(200, ge=1, le=MAX_PROMPTS, description="training prompts")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the training prompts")
    eval_size: int = Field(100, ge=1, le=MAX_PROMPTS, description="held-out prompts for evaluation")
    eval_seed: int = Field(1, ge=0, le=MAX_SEED, description="seed of the held-out prompts (differs from `seed`)")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="task keyword options, e.g. a gym dataset's keys or prompt_suffix")
    reward_range: tuple[float, float] | None = Field(
        None, description="[lo, hi] of reward functions' values (a plain sum), e.g. [-1, 2]; hi = solved; "
        "SPO, TOPR and Q0 see it mapped onto [0, 1] (none: [0, 1], weights summing to 1)")
    environment: str | None = Field(
        None, description="multi-turn episodes: the environment answering between the policy's turns, 'feedback' "
        "(the task's grade, try again) or module:Class (docs/USAGE.md, 'Multi-turn episodes'); none: one turn")
    max_turns: int = Field(3, ge=1, le=64, description="with an environment: policy turns an episode may take")
    env_timeout_s: float = Field(30.0, gt=0, le=3600, description="with an environment: seconds one environment "
                                 "call may take before its episode ends (finish: timeout)")

    @field_validator("reward_range")
    @classmethod
    def _reward_range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not value[0] < value[1]:
            raise ValueError("must be [lo, hi] with lo < hi")
        return value


ObjectiveConfig = registry.options_union()  # every registered objective's options, told apart by `algorithm`


class ReplayConfig(Section):
    size: int = Field(1024, ge=1, description="rows the replay buffer keeps (this run's newest online groups)")
    reuse: int = Field(1, ge=1, description="times a kept group is drawn before it leaves the buffer")


class DataConfig(Section):
    store: str = Field("runs/store", description="experience store: a directory or s3://bucket/prefix (shared by runs)")
    mix: dict[str, float] = Field(default_factory=lambda: {"online": 0.5, "offline": 0.5},
                                  description="share of each source in a batch: online, offline, mc (PTS-annotated rows), pts "
                                              "(PTS's rollouts), replay (this run's recent online groups: data.replay)")
    objectives: dict[str, ObjectiveConfig] = Field(
        default_factory=dict, description="per-source loss; a source not named uses `objective`")
    objective: ObjectiveConfig = Field(default_factory=registry.get(registry.DEFAULT_ALGORITHM).options,
                                       description="the default loss (its `algorithm` picks the options)")
    offline_sources: list[str] = Field(["reference"], description="store sources that make the offline pool")
    offline_passed_only: bool = Field(True, description="offline pool holds passed trajectories only (SPO)")
    replay: ReplayConfig = Field(default_factory=ReplayConfig, description="the replay source's buffer")
    store_version: int | str | None = Field(None, description="read the store as it was: a version of its trajectories "
                                            "table or a tag (`softrl data tag`); none: the newest (store.json says which)")
    pool_copy: bool | None = Field(None, description="copy the columns a run draws from the store to local disk when "
                                   "its pools are built, packed row by row (a draw: a read a row); none: on an object "
                                   "store only (docs/DATA.md, 'Reads with bounded memory')")

    @field_validator("mix")
    @classmethod
    def _mix(cls, mix: dict[str, float]) -> dict[str, float]:
        for name, weight in mix.items():
            if name not in SOURCES:
                raise ValueError(f"unknown source {name!r} (use {', '.join(SOURCES)})")
            if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
                raise ValueError(f"weight of {name!r} must be a number >= 0, got {weight!r}")
        if not any(w > 0 for w in mix.values()):
            raise ValueError("at least one source needs a weight > 0")
        return mix

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, objectives: dict[str, ObjectiveConfig]) -> dict[str, ObjectiveConfig]:
        unknown = [k for k in objectives if k not in SOURCES]
        if unknown:
            raise ValueError(f"unknown source {unknown[0]!r} (use {', '.join(SOURCES)})")
        return objectives

    def objective_for(self, source: str) -> registry.Options:
        return self.objectives.get(source, self.objective)


class Q0Config(Section):
    k: int = Field(64, ge=1, description="reference samples per prompt for Q0_hat (the SPO paper: 800)")


class SamplingConfig(Section):
    prompts_per_step: int = Field(16, ge=1, description="prompts sampled online per learner step")
    samples_per_prompt: int = Field(4, ge=1, description="online responses per prompt (the group size)")
    max_new_tokens: int = Field(0, ge=0, description="0 = the task's default")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    temperature_range: tuple[float, float] | None = Field(
        None, description="per-sample temperature ~ U(lo, hi), e.g. [0.1, 0.8] (SPO); overrides temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling")
    backend: Literal["auto", "hf", "static"] = Field(
        "auto", description="generation: hf (transformers generate), static (static KV cache, compiled decode "
        "step on CUDA), auto (static where the model supports a static cache, else hf; in fp32 both draw the same samples)")
    ignore_eos: bool = Field(False, description="fixed work for benchmarks: EOS is never drawn and every online "
                             "sample is max_new_tokens long")

    @field_validator("temperature_range")
    @classmethod
    def _range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not 0 < value[0] <= value[1]:
            raise ValueError("must be [lo, hi] with 0 < lo <= hi")
        return value


class OptimConfig(Section):
    steps: int = Field(100, ge=1, description="learner steps")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate")
    warmup_steps: int = Field(5, ge=0, description="linear warm-up steps")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, ge=0, description="gradient clipping (0 = off)")
    grad_accum: int = Field(1, ge=1, description="micro-batches per step (gradient accumulation)")
    micro_batch_tokens: int = Field(0, ge=0, description="at most this many tokens (rows x padded width) per "
                                    "micro-batch, groups kept whole; 0 = grad_accum micro-batches")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward: less memory, "
                                         "about a third more compute (on the CPU also a 1 MiB mmap threshold)")
    max_nonfinite: int = Field(3, ge=1, description="stop after this many NaN/inf losses in a row")


class RuntimeConfig(Section):
    kind: Literal["local", "ray"] = Field("local", description="local (one process) or ray")
    mode: Literal["sync", "async"] = Field("sync", description="local: generate then learn, or generate in a thread")
    model_update_interval: int = Field(1, ge=1, description="learner steps between weight updates to generation")
    policy_lag: int = Field(0, ge=0, le=4096, description="local: online rows of step n are sampled by the policy of step "
                            "n - 1 - policy_lag (the reference's until then): a fixed lag, as an asynchronous system "
                            "with that many updates in flight; keeps policy_lag copies of the weights on the host, "
                            "in the generation dtype")
    max_staleness: int | None = Field(None, ge=0, le=4096, description=(
        "local async and ray: online rows are at most this many weight updates behind the ones sync generation "
        "would sample with (0: exactly sync's samples, generation waits for each update); None: as far as the "
        "overlap takes them (local async: two batches ahead, ray: one update)"))
    deterministic: bool = Field(True, description="PyTorch's deterministic algorithms: the same seed on the same "
                                "machine gives the same numbers (off: faster on CUDA, not reproducible)")
    workers: int = Field(2, ge=1, description="ray: rollout-worker actors")
    learners: int = Field(1, ge=1, description="learner processes in one torch.distributed group, each taking "
                          "whole groups of every batch (started by softrl, torchrun, or as Ray actors)")
    ray_address: str | None = Field(None, description="ray: cluster address (None = start a local Ray)")
    weight_sync: Literal["broadcast", "object_store"] = Field(
        "broadcast", description="ray: weights to the workers over torch.distributed (gloo; NCCL where both ends are "
        "on CUDA), or pickled through Ray's object store")


class EvalConfig(Section):
    samples: int = Field(20, ge=1, description="samples per held-out prompt (SPO's protocol: 20)")
    temperature: float = Field(0.4, gt=0, description="evaluation temperature (SPO's protocol: 0.4)")
    top_p: float = Field(0.95, gt=0, le=1, description="evaluation top-p (SPO's protocol: 0.95)")
    every: int = Field(0, ge=0, description="evaluate every this many steps (0 = before and after only)")
    stats: bool = Field(False, description="also the token entropy and exact KL(pi || pi0) of the evaluated responses")


class LogConfig(Section):
    checkpoint_every: int = Field(25, ge=1, description="steps between checkpoints")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept")
    tensorboard: bool = Field(False, description="also log to TensorBoard (needs tensorboard)")
    wandb: bool = Field(False, description="also log to Weights & Biases (needs wandb)")
    wandb_project: str = Field("softrl", description="W&B project")


class RunConfig(Section):
    name: str = Field("run", description="run name (one path component); the run directory is out_dir/name")
    out_dir: str = Field("runs", description="parent of run directories")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of sampling, batches and initialisation")
    beta: float = Field(SPO_BETA, gt=0, description="KL-regularisation strength (SPO paper: 1/ln(1e5))")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    q0: Q0Config = Field(default_factory=Q0Config)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value or value in (".", "..") or "/" in value or "\\" in value:
            raise ValueError("must be one path component (no '/', not '.' or '..'): the run directory is out_dir/name")
        if any(not c.isprintable() for c in value):  # a newline or NUL makes a folder no shell command can name
            raise ValueError("must hold printable characters only (no newline, tab or control character)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        for source in self.data.mix:
            options = self.data.objective_for(source)
            objective = registry.get(options.algorithm)
            if source == "online" and self.sampling.samples_per_prompt < objective.min_group:
                raise ValueError(f"sampling.samples_per_prompt must be >= {objective.min_group} for "
                                 f"{objective.name} (it needs a group of responses per prompt)")
            if objective.data == "online" and source != "online":
                raise ValueError(f"data.objectives.{source}: {objective.name} learns from online rollouts only")
            s = self.sampling
            if source == "online" and objective.behavior(options) and (
                    s.temperature != 1 or s.top_p != 1 or s.temperature_range is not None):
                key = f"data.objectives.{source}" if source in self.data.objectives else "data.objective"
                how = f" with is_correction={options.is_correction}" if hasattr(options, "is_correction") else ""
                raise ValueError(f"{key}: {objective.name}{how} weighs rows by pi/mu, and online samples have mu's "
                                 "log-probs only at sampling.temperature=1 and top_p=1 without temperature_range")
        if self.data.mix.get("replay", 0) > 0 and not self.generates:
            raise ValueError("data.mix: replay draws this run's own online groups, and the mix has no online share")
        self._check_reference_update()
        rc = self.runtime
        if rc.policy_lag and (rc.kind != "local" or rc.mode != "sync" or rc.model_update_interval != 1):
            raise ValueError("runtime.policy_lag: needs runtime.kind=local, runtime.mode=sync and "
                             "runtime.model_update_interval=1 (each is another way to make rows stale: choose one)")
        if rc.max_staleness is not None and rc.kind == "local" and rc.mode != "async":
            raise ValueError("runtime.max_staleness: bounds the overlap of runtime.mode=async or runtime.kind=ray, "
                             "and sync generation has none")
        if rc.policy_lag and not self.generates:
            raise ValueError("runtime.policy_lag: the run generates nothing (data.mix has no online share)")
        if self.runtime.learners > 1 and self.model.device.startswith("cuda:"):
            raise ValueError(f"model.device: {self.model.device} with runtime.learners > 1: use cuda or auto "
                             "(each learner process takes its own GPU, rank r the r-th)")
        return self

    def _check_reference_update(self) -> None:
        """A moving reference is the run's one reference: set on data.objective; SPO's Q0 of each version
        comes from online samples with mu's log-probs (training/moving_reference.py)."""
        for source, options in self.data.objectives.items():
            if getattr(options, "reference_update", None) is not None:
                raise ValueError(f"data.objectives.{source}.reference_update: a run has one reference; set it on "
                                 "data.objective")
        options = self.data.objective
        if getattr(options, "reference_update", None) is None:
            return
        if self.runtime.learners > 1:
            raise ValueError("data.objective.reference_update: needs runtime.learners=1 (the moved reference is "
                             "not sharded yet)")
        if any(self.data.mix.get(source, 0) > 0 for source in ("mc", "pts")):
            raise ValueError("data.objective.reference_update: the mc and pts sources hold Monte-Carlo targets of "
                             "the starting reference's rollouts, which a moved reference does not share")
        if options.reference_update.behavior and options.algorithm != "spo":
            raise ValueError(f"data.objective.reference_update.behavior: SPO's only (its Q0 from each row's group); "
                             f"{options.algorithm} takes every: K or ema: tau")
        if options.reference_update.ema is not None and self.model.lora:
            raise ValueError("data.objective.reference_update.ema: averages full weights; with model.lora the "
                             "average of the factors A and B is not an average of the policies (use every: K)")
        if any(self.data.objective_for(source).algorithm == "spo" for source in self.data.mix):
            s = self.sampling
            if not self.generates:
                raise ValueError("data.objective.reference_update: SPO estimates each new reference's Q0 from the "
                                 "run's online samples, and data.mix has no online share")
            if s.temperature != 1 or s.top_p != 1 or s.temperature_range is not None:
                raise ValueError("data.objective.reference_update: SPO weighs its online samples by ref/mu to "
                                 "estimate Q0, and they have mu's log-probs only at sampling.temperature=1 and "
                                 "top_p=1 without temperature_range")

    @property
    def generates(self) -> bool:
        """Whether the run samples online rows at all (an offline-only mix never generates)."""
        return self.data.mix.get("online", 0) > 0

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name


def _location(error: dict) -> str:
    """`data.objective.grpo.clip` -> `data.objective.clip`: the union's tag is not a key people write."""
    loc = error["loc"]
    return ".".join(str(part) for i, part in enumerate(loc) if not str(part).startswith("function-after")
                    and not (part in registry.REGISTRY and 0 < i < len(loc) - 1 and loc[i - 1] != "mix"))


def _one_line(e: ValidationError) -> str:
    error = e.errors()[0]
    where = _location(error)
    if error["type"] == "extra_forbidden":
        tag = next((part for part in error["loc"][:-1] if part in registry.REGISTRY), None)
        if tag is not None:  # another algorithm's option, often left over from switching algorithm
            owned = [k for k in registry.get(tag).options.model_fields if k != "algorithm"]
            return f"unknown key {where!r}: not an option of {tag} (its options: {', '.join(owned)})"
        return f"unknown key {where!r}"
    message = error["msg"].removeprefix("Value error, ")
    got = error.get("input")
    if error["type"] == "unknown_algorithm" and isinstance(got, dict):
        where, got = f"{where}.algorithm", got.get("algorithm")
    shown = "" if isinstance(got, dict) else f", got {SHORT.repr(got)}"
    return f"{where}: {message}{shown}" if where else f"{message}"


SHORT = reprlib.Repr()  # an echoed value stays short, however large (YAML aliases can make it huge)
SHORT.maxlevel, SHORT.maxlist, SHORT.maxtuple, SHORT.maxdict, SHORT.maxstring, SHORT.maxlong = 2, 4, 4, 4, 60, 40


def parse_override(text: str) -> tuple[list[str], Any]:
    """`optim.lr=3e-4` -> (["optim", "lr"], 3e-4); the value is read as YAML (numbers, lists, null)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not key=value (e.g. optim.lr=3e-4)")
    try:
        parsed = load_yaml(value) if value.strip() else ""
        if isinstance(parsed, str) and "\n" in value:  # YAML folds a line break into a space: keep what was given
            parsed = value
    except yaml.YAMLError:
        parsed = value
    except (RecursionError, ValueError) as e:  # nested too deeply; an integer of thousands of digits
        raise ConfigError(f"{key.strip()}: {_unreadable(e)}") from None
    return key.strip().split("."), parsed


def apply_override(data: dict, path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {part!r} is not a section")
        node = child
    node[path[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: dict | None = None) -> RunConfig:
    """`base` (e.g. the demo's embedded defaults), then the YAML file, then the overrides, validated."""
    data: dict = copy.deepcopy(base or {})
    if path is not None:
        for key, value in read_settings(path).items():
            apply_override(data, key.split("."), value)
    for text in overrides:
        apply_override(data, *parse_override(text))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(e)) from None
    except RecursionError:
        raise ConfigError("the config holds a value nested too deeply") from None


def read_settings(path: str | Path) -> dict[str, Any]:
    """A YAML config file as dotted keys (`task: {options: ...}` -> `task.options`), not yet validated."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a regular file")
    try:
        loaded = load_yaml(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from e
    except (RecursionError, ValueError) as e:
        raise ConfigError(f"{path}: {_unreadable(e)}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); a config is a YAML file") from e
    if loaded is None:  # an empty file: every default
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {SHORT.repr(loaded)}")
    settings: dict[str, Any] = {}
    for key, value in flatten(loaded):
        dotted = ".".join(key)
        if dotted in settings:  # `optim: {lr: ...}` and `optim.lr: ...` in one file: one of them would be lost
            raise ConfigError(f"{path}: {dotted} is given twice")
        settings[dotted] = value
    return settings


def _unreadable(error: Exception) -> str:
    if isinstance(error, RecursionError):
        return "a value nested too deeply"
    if isinstance(error, YAMLInputError):
        return str(error)
    return f"not a value this config takes ({str(error).splitlines()[0][:80]})"


def config_from(settings: dict[str, Any]) -> RunConfig:
    """A validated RunConfig from dotted keys or sections and plain values, e.g. `{"optim.lr": 1e-4,
    "data": {"mix": {"online": 1.0}}}` (what code builds; `load_config` reads what people write)."""
    data: dict = {}
    bad = next((key for key in settings if not isinstance(key, str)), None)
    if bad is not None:
        raise ConfigError(f"config key {bad!r} must be a string such as 'optim' or 'optim.lr'")
    for path, value in flatten(settings):  # a section's keys one by one: {"model": {...}} keeps "model.path"
        apply_override(data, ".".join(path).split("."), copy.deepcopy(value))
    return load_config(None, [], base=data)


def flatten(tree: dict, prefix: tuple = ()) -> list[tuple[list[str], Any]]:
    """Leaves of a YAML mapping as (path, value); a section's mapping merges into the base's."""
    out = []
    for key, value in tree.items():
        path = (*prefix, str(key))
        section = len(path) == 1 and key in RunConfig.model_fields and isinstance(value, dict)
        out += flatten(value, path) if section else [(list(path), value)]
    return out
