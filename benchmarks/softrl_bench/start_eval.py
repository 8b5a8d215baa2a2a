"""The evaluation before training, once for a benchmark's runs that start alike.

Every run of a study or a frontier starts from the same reference and evaluates it on the same held-out
prompts with its seed's sampling, whatever it then learns: in a 100-step code run that is one of
three evaluations, about a fifth of its time. The first run of each (model, evaluation settings,
seed) evaluates and leaves its result in DIR/KEY.json; the others read it (a run that arrives while
another evaluates waits for it). Only settings known to matter to training alone are left out of
KEY; a setting added later counts, so it can cost an evaluation but never share a wrong one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from softrl_bench.learning import settings_of
from softrl.config import RunConfig

TRAINING_ONLY = ("name", "out_dir", "beta", "data.", "q0.", "optim.", "log.", "eval.every", "sampling.prompts_per_step",
                 "sampling.samples_per_prompt", "sampling.temperature", "sampling.top_p", "sampling.ignore_eos",
                 "runtime.kind", "runtime.mode", "runtime.model_update_interval", "runtime.policy_lag",
                 "runtime.workers", "runtime.learners", "runtime.ray_address", "runtime.weight_sync")


def start_key(config: RunConfig) -> str:
    """Of the settings the evaluation before training depends on (`model.weights` among them: a rebuilt
    model is another model)."""
    settings = {k: v for k, v in settings_of(config).items() if not k.startswith(TRAINING_ONLY)}
    return hashlib.blake2b(json.dumps(settings, sort_keys=True, default=str).encode(), digest_size=12).hexdigest()


@dataclass(frozen=True)
class SharedStartEval:
    """`Session`'s `start_eval` for the runs of one benchmark (picklable: spawned runs get it too)."""

    folder: Path

    def for_run(self, config: RunConfig) -> Callable[[Callable[[], dict]], dict]:
        return lambda evaluate: self.result(start_key(config), evaluate)

    def result(self, key: str, evaluate: Callable[[], dict]) -> dict:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{key}.json"
        with open(self.folder / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when this process dies
            if path.is_file():
                return json.loads(path.read_text())
            result = {k: v for k, v in evaluate().items() if isinstance(v, (int, float, str, type(None)))}
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(result))
            tmp.replace(path)
            return result
