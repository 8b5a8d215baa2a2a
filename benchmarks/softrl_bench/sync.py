"""Weight sync cost (`softrl bench systems --parts sync`): seconds for one update of a model's weights
from a learner-side actor to the Ray runtime's rollout workers, through the object store against
over torch.distributed channels (runtime/weights.py), alternately, `rounds` times each; and the
Ray runtime's wall time with `model_update_interval` 10 against 1 under each.
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import median

from softrl.network import ray_module
from softrl.runtime.ray_runtime import WeightSource, Worker
from softrl.runtime.ray_weights import Channels, ObjectStore

METHODS = ("object_store", "broadcast")


class _Source(WeightSource):
    """The learner's end without a session: the model, placed as a run places its policy."""

    def __init__(self, config: dict, model_path: str):
        from softrl.assemble import placement
        from softrl.config import RunConfig
        from softrl.models.loading import load_causal_lm

        self.placement = placement(RunConfig.model_validate(config))
        self.model, _ = load_causal_lm(model_path, "float32")
        self.placement.place(self.model)

    def trained(self):
        return self.model

    def frozen(self):
        return self.placement.frozen


def update_seconds(settings: dict, model_path: str, rounds: int = 5, workers: int = 2) -> dict:
    """Per method, the seconds of each of `rounds` updates (object store, broadcast, alternately) of
    `model_path`'s weights to `workers` rollout workers on a local Ray, each update waited for."""
    from softrl.config import config_from

    config = config_from(settings).model_dump(mode="json")
    ray = ray_module(None)
    ray.init(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    try:
        source = ray.remote(num_cpus=0)(_Source).remote(config, model_path)
        actors = [ray.remote(num_cpus=0)(Worker).remote(config, model_path) for _ in range(workers)]
        syncs = {"object_store": ObjectStore(ray, source, actors), "broadcast": Channels(ray, source, actors, local=True)}
        seconds: dict[str, list[float]] = {m: [] for m in METHODS}
        for version in range(rounds):
            for method in METHODS:
                started = time.perf_counter()
                syncs[method].deliver(range(workers), version)
                seconds[method].append(time.perf_counter() - started)
        return {"seconds": seconds, "median_s": {m: median(v) for m, v in seconds.items()}, "workers": workers}
    finally:
        ray.shutdown()


def sync_part(root: Path, model_path: str, runtime_settings, grpo: dict, common: dict, steps: int,
              in_fresh_process, rounds: int = 5) -> tuple[dict, dict]:
    """(the numbers, their ratios): update seconds per method, then (unless `steps` is 0) Ray runs of
    `steps` steps at interval 1 and 10 per method."""
    settings = runtime_settings(root, "sync-probe", steps=max(1, steps), **grpo, **common)
    out = {"update": in_fresh_process("update_seconds", settings=settings, model_path=model_path, rounds=rounds),
           "intervals": {}}
    ratios = {"broadcast_over_object_store_update": out["update"]["median_s"]["broadcast"]
              / out["update"]["median_s"]["object_store"]}
    for method in METHODS if steps else ():
        runs = {}
        for interval in (1, 10):
            runs[interval] = in_fresh_process("end_to_end", settings=runtime_settings(
                root, f"ray-{method}-interval{interval}", steps=steps, **{
                    "runtime.kind": "ray", "runtime.workers": 2, "runtime.model_update_interval": interval,
                    "runtime.weight_sync": method, **grpo}, **common))
        out["intervals"][method] = runs
        ratios[f"ray_interval10_over_1_time_{method}"] = runs[10]["seconds"] / runs[1]["seconds"]
    return out, ratios
