"""A benchmark's runs that start alike share their evaluation before training (softrl_bench/start_eval.py): the
first evaluates, the rest read its result, and a run that read it trains exactly like one that did not."""

import json

import pytest

from softrl.assemble import RunParts
from softrl_bench.learning import run_all
from softrl_bench.start_eval import SharedStartEval, start_key
from softrl.config import config_from


def config(tiny, tmp_path, name, **more):
    return config_from({"name": name, "out_dir": str(tmp_path / "runs"), "model.path": str(tiny[0]),
                        "task.name": "countdown", "task.size": 4, "task.eval_size": 3, "q0.k": 2,
                        "sampling.max_new_tokens": 6, "sampling.prompts_per_step": 2, "sampling.samples_per_prompt": 2,
                        "optim.steps": 2, "optim.lr": 1e-3, "eval.every": 0, "eval.samples": 3, "eval.stats": True,
                        "data.store": str(tmp_path / "stores" / name), **more})


def evals(c):
    """The run's evaluations, their numbers only (not the clock)."""
    records = map(json.loads, (c.run_dir / "metrics.jsonl").read_text().splitlines())
    return [{k: v for k, v in r.items() if k.startswith("eval/")} for r in records if "eval/pass@1" in r]


def test_runs_that_start_alike_evaluate_once_and_train_as_if_each_had(tiny, tmp_path, monkeypatch):
    calls = []
    evaluate = RunParts.evaluate
    monkeypatch.setattr(RunParts, "evaluate", lambda self, model: calls.append(self.config.name) or evaluate(self, model))
    alone = config(tiny, tmp_path, "alone")
    run_all([alone])
    shared = [config(tiny, tmp_path, "a"), config(tiny, tmp_path, "b", **{"optim.lr": 3e-3, "beta": 0.2}),
              config(tiny, tmp_path, "c", seed=1)]
    assert start_key(shared[0]) == start_key(shared[1]) == start_key(alone) != start_key(shared[2])
    folder = tmp_path / "start-evals"
    run_all(shared, shared=SharedStartEval(folder))
    # before and after training for "alone"; "a" evaluates for itself and "b"; "c" has another seed
    assert calls == ["alone", "alone", "a", "a", "b", "c", "c"]
    assert len(list(folder.glob("*.json"))) == 2
    a, b, c = (evals(x) for x in shared)
    assert a[0] == b[0] == evals(alone)[0] and c[0] != a[0]  # the same start, record for record
    assert a[-1] == evals(alone)[-1]  # trained exactly as the run that evaluated for itself


@pytest.mark.parametrize("changed", [{"task.eval_size": 2}, {"eval.samples": 2}, {"eval.temperature": 0.7},
                                     {"sampling.max_new_tokens": 5}])
def test_what_the_start_evaluation_depends_on_is_in_its_key(tiny, tmp_path, changed):
    assert start_key(config(tiny, tmp_path, "x")) != start_key(config(tiny, tmp_path, "x", **changed))
