"""The benchmark suite's logic on synthetic curves, and both benchmarks end to end on a tiny model."""

import json
import math
import re
import shutil
import time

import pytest

from softrl_bench.learning import (WEIGHTS_RECORD, aggregate, check_claims, collect, curves, final, gap_change,
                                   method_config, paired, run_all, weights_digest)
from softrl_bench.report import markdown, plot_learning


def curve(*pass1_pass10, samples_per_point=64):
    return [{"step": i, "samples": i * samples_per_point, "time": float(i), "pass@1": a, "pass@10": b,
             "success_per_sample": a, "kl_to_reference": 0.1 * i, "mean_token_entropy": 0.5,
             "distinct_correct_per_solved": 2.0} for i, (a, b) in enumerate(pass1_pass10)]


def test_paired_verdicts_and_gap():
    runs = {"a": {s: curve((0.4, 0.9), (0.5 + 0.01 * s, 0.95)) for s in range(3)},
            "b": {s: curve((0.4, 0.9), (0.4 + 0.02 * s, 0.95)) for s in range(3)}}
    higher = paired(runs, "a", "b", final("pass@1"))
    diffs = [0.1, 0.09, 0.08]
    assert higher["per_seed"] == pytest.approx(diffs) and higher["diff"] == pytest.approx(0.09)
    assert higher["se"] == pytest.approx(0.01 / math.sqrt(3)) and higher["verdict"] == "higher"
    assert paired(runs, "b", "a", final("pass@1"))["verdict"] == "lower"
    assert paired(runs, "a", "b", final("pass@10"))["verdict"] == "within 2 SE"  # identical: diff 0, se 0
    assert paired(runs, "a", "missing", final("pass@1")) == {"seeds": 0, "verdict": "not run"}
    assert gap_change(curve((0.4, 0.9), (0.6, 0.9))) == pytest.approx(-0.2)  # the gap shrank by 0.2


def test_aggregate_and_claims_table(tmp_path):
    runs = {"spo-online": {0: curve((0.4, 0.9), (0.6, 0.95)), 1: curve((0.4, 0.9), (0.5, 0.97))},
            "ppo": {0: curve((0.4, 0.9), (0.7, 0.8)), 1: curve((0.4, 0.9), (0.6, 0.82))}}
    agg = aggregate(runs)
    assert agg["spo-online"][1]["pass@1"] == pytest.approx(0.55)
    assert agg["spo-online"][1]["pass@1_sd"] == pytest.approx(math.sqrt(0.005))
    claims = {c["claim"]: c for c in check_claims(runs)}
    beats = claims["SPO's pass@10 beats PPO's"]
    assert beats["diff"] == pytest.approx(0.15) and beats["reproduced"] is True
    assert claims["on-policy AGRO learns faster per epoch than RLOO"]["reproduced"] is None  # not run
    table = markdown(agg, list(claims.values()), 2)
    assert "| spo-online | 64 |" in table and "0.550 ± 0.071" in table
    assert "Claims not run" in table and "(agro-on vs rloo)" in table and "| AGRO |" not in table
    one_seed = {"ppo": {0: runs["ppo"][0]}}  # no spread to show, and no claim has both its methods
    single = markdown(aggregate(one_seed), check_claims(one_seed), 1)
    assert "| ppo | 64 | 1 | 0.700 | 0.800 |" in single and "±" not in single and "| SPO |" not in single
    assert plot_learning(agg, tmp_path / "p.png", "t").stat().st_size > 10_000


def test_bench_learning_end_to_end(tiny, tmp_path):
    """Two methods x two seeds on the tiny model: resumable, curves per evaluation, the offline
    method generates nothing, pass@k before training is the same for every method of a seed; a finished
    run made from other weights at the model's path is refused, not reused."""
    model = tmp_path / "model"  # a copy: rebuilt in place below
    shutil.copytree(tiny[0], model)
    extra = {"model.path": str(model), "task.size": 6, "q0.k": 4, "sampling.max_new_tokens": 8}
    configs = [method_config(m, "countdown", s, 2, tmp_path, prompts=2, eval_size=3, eval_every=1, eval_samples=2,
                             extra=extra) for s in (0, 1) for m in ("spo-online", "agro-off")]
    steps = []
    run_all(configs, on_step=lambda i, c, r: steps.append((i, r["step"])))
    assert steps == [(i, s) for i in range(4) for s in (1, 2)]
    run_all(configs, on_step=lambda i, c, r: steps.append((i, r["step"])))
    assert len(steps) == 8  # finished runs are kept, not redone
    runs = collect(configs)
    assert set(runs) == {"spo-online", "agro-off"} and set(runs["agro-off"]) == {0, 1}
    online, offline = curves(configs[0].run_dir), curves(configs[1].run_dir)
    assert [p["step"] for p in online] == [0, 1, 2]
    assert [p["samples"] for p in online] == [0, 8, 16] and all(p["samples"] == 0 for p in offline)
    assert online[0]["pass@1"] == offline[0]["pass@1"] and online[0]["kl_to_reference"] == pytest.approx(0, abs=1e-6)
    assert all(p["kl_to_reference"] >= -1e-6 and p["mean_token_entropy"] > 0 for p in online + offline)
    record = configs[0].run_dir / WEIGHTS_RECORD
    assert record.read_text() == weights_digest(model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ValueError, match="finished with model.weights='[0-9a-f]+', this benchmark asks model.weights="):
        run_all(configs)
    record.unlink()  # a run folder that never recorded its weights: which model it was is not known
    with pytest.raises(ValueError, match="finished with model.weights=None"):
        run_all(configs)


def test_bench_systems_learner_step_and_e2e(tiny, tmp_path):
    from softrl_bench.report import systems_markdown
    from softrl_bench.end_to_end import alternate, pair_ratios, runtime_settings
    from softrl_bench.systems import STEP_PASSES, batch_rows, in_fresh_process, matmul_peak_flops

    directory = str(tiny[0])
    rows = batch_rows(directory, "countdown", 2, 2, 8)
    assert len(rows) == 4 and all(len(r["response_tokens"]) == 8 for r in rows)  # fixed work: EOS never drawn
    rows_file = tmp_path / "rows.json"
    rows_file.write_text(json.dumps(rows, default=str))
    def step(method: str, checkpointing: bool = False, micro_batch_tokens: int = 0) -> dict:
        return in_fresh_process("learner_step_from_file", method=method, model_path=directory, rows_file=rows_file,
                                samples_per_prompt=2, steps=2, device="cpu", checkpointing=checkpointing,
                                micro_batch_tokens=micro_batch_tokens)

    learner = {m: step(m) for m in ("spo", "ppo")}
    for r in learner.values():
        assert r["step_s"] > 0 and r["peak_mib"] > 0 and r["rows"] == 4
        assert set(r["split_s"]) == {"forward", "backward", "optimizer"} and sum(r["split_s"].values()) <= r["step_s"]
    spo = learner["spo"]  # PPO trains a value model too: 3 more passes of the body over the tokens a pass runs
    assert learner["ppo"]["step_flops"] - spo["step_flops"] == pytest.approx(
        (STEP_PASSES["ppo"] - STEP_PASSES["spo"]) * 2 * (spo["params"] - spo["head_params"]) * spo["forward_tokens"])
    assert spo["forward_tokens"] <= spo["padded_tokens"]
    checkpointed = step("spo", checkpointing=True)
    assert checkpointed["first_loss"] == pytest.approx(learner["spo"]["first_loss"], rel=1e-5)
    # one group (2 rows) a micro-batch: the same loss, in two passes (the 1B learner on a GPU needs them)
    micro = step("spo", micro_batch_tokens=spo["padded_tokens"] // 2)
    assert micro["micro_batch_tokens"] == spo["padded_tokens"] // 2
    assert micro["first_loss"] == pytest.approx(learner["spo"]["first_loss"], rel=1e-5)
    # the work counted is the micro-batches' own: with one prompt's responses shorter, its micro-batch
    # is narrower than the whole batch's padding
    for r in rows[2:]:
        r["response_tokens"], r["behavior_logprobs"] = r["response_tokens"][:4], (r["behavior_logprobs"] or [])[:4] or None
    rows_file.write_text(json.dumps(rows, default=str))
    whole, micro = step("spo"), step("spo", micro_batch_tokens=spo["padded_tokens"] // 2)
    assert micro["padded_tokens"] < whole["padded_tokens"] and micro["step_flops"] < whole["step_flops"]
    assert micro["forward_tokens"] <= whole["forward_tokens"] - 2 * 4  # two rows, 4 response positions fewer each
    peak = matmul_peak_flops(n=256, reps=2)
    assert peak > 1e6
    settings = runtime_settings(tmp_path, "sync", "countdown", 2, 2, 2, **{
        "model.path": directory, "sampling.max_new_tokens": 8, "sampling.ignore_eos": True})

    e2e = in_fresh_process("end_to_end", settings=settings)
    assert e2e["samples"] == 8 and e2e["samples_per_s"] > 0 and e2e["steady_samples_per_s"] > 0
    assert {"generation", "forward", "backward", "optimizer"} <= set(e2e["split_s"])
    rounds = alternate({"a": lambda: e2e, "b": lambda: {**e2e, "samples_per_s": 2 * e2e["samples_per_s"]}}, pairs=2)
    assert [len(v) for v in rounds.values()] == [2, 2]
    ratio = pair_ratios(rounds, "a", "b")
    assert ratio["by_pair"] == pytest.approx([0.5, 0.5])
    assert len(ratio["by_pair"]) == 2 and ratio["median"] > 0
    result = {"model": directory, "task": "countdown", "batch": "2 x 2", "max_new_tokens": 8, "threads": 1,
              "cpu": "x", "matmul_peak_flops": peak, "fixed_work": True,
              "learner": {m: {**r, "of_peak": r["achieved_flops"] / peak} for m, r in learner.items()},
              "rounds": {"softrl-sync": rounds["a"], "softrl-async": rounds["b"]},
              "ratios": {"async_over_sync": ratio["median"]}}
    table = systems_markdown(result)
    assert "| softrl-sync | 2 |" in table and "async_over_sync" in table and "fixed work" in table


def test_a_failed_step_names_the_frame_that_raised():
    from softrl_bench.systems import failure

    traceback = """Traceback (most recent call last):
  File "/x/softrl/runtime/local.py", line 66, in _produce
    made = self._generate()
  File "/x/torch/_inductor/cudagraph_trees.py", line 327, in get_obj
    assert torch._C._is_key_in_tls(attr_name)
AssertionError"""
    assert failure(traceback) == ('AssertionError (File "/x/torch/_inductor/cudagraph_trees.py", line 327, '
                                  'in get_obj)')
    assert failure("error: CUDA out of memory\n") == "error: CUDA out of memory"
    assert failure("") == "no output"


def test_a_crashed_step_names_its_signal_and_the_crashing_frame():
    """A segfault leaves no traceback: the last line of stderr was a warning (GPU lease, 2026-11-28)."""
    from softrl_bench.systems import failure

    dump = """  return Variable._execution_engine.run_backward(
Fatal Python error: Segmentation fault

Thread 0x00007f7aa1dff6c0 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Current thread 0x00007f7e92a4b140 (most recent call first):
  File "/x/softrl/rollout.py", line 125 in rollouts
  File "/x/softrl/eval/protocol.py", line 39 in sample"""
    assert failure(dump, -11) == ('killed by SIGSEGV in File "/x/softrl/rollout.py", line 125 in rollouts; other '
                                  'threads in File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap')
    assert failure("a warning", -9) == "killed by SIGKILL (no Python frame)"


def test_a_segfaulting_process_is_reported_as_one():
    """A real crash in a fresh process, as in_fresh_process runs it: faulthandler's frames come back."""
    import subprocess
    import sys

    from softrl_bench.systems import failure

    out = subprocess.run([sys.executable, "-X", "faulthandler", "-c",
                          "import ctypes\ndef crash():\n    ctypes.string_at(0)\ncrash()"],
                         capture_output=True, text=True, check=False)
    assert out.returncode < 0
    said = failure(out.stderr, out.returncode)
    assert said.startswith('killed by SIGSEGV in File "') and said.endswith("in string_at"), said


def test_bench_systems_learner_steps_alternate_round_by_round(tiny, tmp_path):
    """SPO, PPO and GRPO each once a round for `pairs` rounds; the ratios are taken round by round."""
    from softrl_bench.report import systems_markdown
    from softrl_bench.systems import run_systems

    phases = []
    result = run_systems(str(tiny[0]), "countdown", tmp_path, {"learner"}, prompts=2, samples_per_prompt=2,
                         max_new_tokens=4, timed_steps=1, pairs=2, device="cpu", phase=phases.append)
    learner_phases = [p for p in phases if p.startswith("learner step")]
    assert [p.split(":")[1].split()[0] for p in learner_phases] == ["spo", "ppo", "grpo"] * 2
    rounds = result["learner_rounds"]
    assert len(rounds["spo_over_ppo_time"]) == 2 and all(len(v) == 2 for v in rounds["step_s"].values())
    assert rounds["spo_over_ppo_time"][1] == pytest.approx(rounds["step_s"]["spo"][1] / rounds["step_s"]["ppo"][1])
    assert result["learner"]["spo"]["rounds"] == 2 and result["learner"]["spo"]["step_s"] in rounds["step_s"]["spo"]
    assert "SPO / PPO step time, round by round" in systems_markdown(result)


@pytest.mark.parametrize("generation", ["dynamic", "static", "paged"])
def test_trl_side_by_side_runs_the_same_work(tiny, tmp_path, generation):
    pytest.importorskip("trl")
    from softrl_bench.end_to_end import trl_grpo

    r = trl_grpo(str(tiny[0]), "countdown", 2, 2, 2, 8, tmp_path, lr=1e-4, fixed=True, device="cpu",
                 generation=generation)
    assert r["name"] == f"trl-{generation}" and r["steps"] == 2 and r["samples"] == 8 and r["samples_per_s"] > 0 and r["steady_samples_per_s"] > 0
    assert r["completion_tokens"] == 8  # TRL's own mean completion length: the same fixed work as softrl's


def test_softrl_is_set_against_trls_fastest_setting_round_by_round():
    from softrl_bench.report import systems_markdown
    from softrl_bench.end_to_end import against_trl, steady_rate

    assert steady_rate([(1.0, 8), (3.0, 24), (5.0, 40)]) == 8.0  # steps after the first: 32 samples in 4 s
    assert steady_rate([(1.0, 8)]) is None
    run = lambda speed, steady=None: {"samples_per_s": speed, "steady_samples_per_s": steady, "steps": 2}  # noqa: E731
    rounds = {"softrl-sync": [run(10, 12), run(12, 14)], "softrl-async": [run(20, 30), run(16, 18)],
              "trl-dynamic": [run(4, 5), run(5, 5)], "trl-paged": [run(8, 9), run(8, 10)]}
    out = against_trl(rounds)
    assert out["trl_fastest"] == "trl-paged" and out["softrl_fastest"] == "async"
    assert out["vs_trl"]["async"]["by_pair"] == [2.5, 2.0] and out["vs_trl"]["async"]["median"] == 2.25
    assert out["vs_trl_steady"]["sync"]["by_pair"] == [12 / 9, 14 / 10]
    rounds["trl-paged"][0]["steady_samples_per_s"] = None  # a one-step run has no steady rate: that round is left out
    assert against_trl(rounds)["vs_trl_steady"]["async"]["by_pair"] == [18 / 10]
    table = systems_markdown({"model": "m", "task": "t", "batch": "2 x 2", "max_new_tokens": 8, "threads": 1,
                              "cpu": "x", "rounds": rounds, **out})
    assert "softrl async / TRL (trl-paged) samples/s, round by round: 2.50x, 2.00x (median 2.25x)" in table
    assert "| softrl-async | 2 | 20.0, 16.0 | 18.0 | 24.0 |" in table


def test_a_failing_side_is_kept_as_its_error_and_the_others_go_on():
    from softrl_bench.end_to_end import against_trl, alternate
    from softrl_bench.report import systems_markdown

    def broken():
        time.sleep(0.05)  # a side's whole cost counts, a failed one's too
        raise RuntimeError("trl_grpo failed: ['CUDA error']")

    seen = []
    rounds = alternate({"softrl-sync": lambda: {"samples_per_s": 10.0, "steps": 2}, "trl-paged": broken,
                        "trl-dynamic": lambda: {"samples_per_s": 4.0, "steps": 2}}, pairs=2,
                       after_round=lambda results: seen.append(sum(len(v) for v in results.values())))
    assert seen == [3, 6] and [r["error"] for r in rounds["trl-paged"]] == ["trl_grpo failed: ['CUDA error']"] * 2
    assert all(r["wall_s"] >= 0.05 for r in rounds["trl-paged"])
    assert all(0 <= r["wall_s"] < 0.05 for r in rounds["softrl-sync"])
    out = against_trl(rounds)
    assert out["trl_fastest"] == "trl-dynamic" and out["vs_trl"]["sync"]["by_pair"] == [2.5, 2.5]
    assert against_trl({"softrl-sync": rounds["softrl-sync"], "trl-paged": rounds["trl-paged"]}) == {}
    table = systems_markdown({"model": "m", "task": "t", "batch": "2 x 2", "max_new_tokens": 8, "threads": 1,
                              "cpu": "x", "rounds": rounds, **out})
    assert "| trl-paged | - | failed, failed | - | - | - | 0, 0 |" in table and "trl-paged failed: trl_grpo failed" in table


def test_bench_systems_command_writes_the_ratios(tiny, tmp_path):
    from typer.testing import CliRunner

    from softrl.cli import app

    report = tmp_path / "report"
    result = CliRunner().invoke(app, ["bench", "systems", "--model", str(tiny[0]), "--parts", "e2e", "--pairs", "1",
                                      "--e2e-steps", "2", "--max-new-tokens", "6", "--prompts", "2",
                                      "--samples-per-prompt", "2", "--runs", str(tmp_path / "runs"),
                                      "--report", str(report)])
    assert result.exit_code == 0, result.output
    numbers = json.loads((report / "systems.json").read_text())
    assert numbers["fixed_work"] and numbers["ratios"]["async_over_sync"] > 0
    assert [len(v) for v in numbers["rounds"].values()] == [1, 1]
    assert all(r[0]["wall_s"] >= r[0]["seconds"] for r in numbers["rounds"].values())
    # no terminal here: each phase is a timed line, so a log shows where the time went
    assert re.search(r"\d\d:\d\d:\d\d round 1/1: softrl-async", result.output), result.output
    bad = CliRunner().invoke(app, ["bench", "systems", "--device", "gpu", "--report", str(report)])
    assert bad.exit_code == 2 and "device must be auto, cpu, cuda or cuda:N, got 'gpu'" in bad.output
    for option, value, message in (("--trl-generation", "vllm", "--trl-generation: unknown setting 'vllm'"),
                                   ("--modes", "ray", "--modes: unknown mode 'ray'")):
        bad = CliRunner().invoke(app, ["bench", "systems", option, value, "--report", str(report)])
        assert bad.exit_code == 2 and message in bad.output, bad.output


def test_weight_sync_part_measures_both_methods(tiny, tmp_path):
    """`--parts sync`: one update of the weights to the Ray runtime's workers by each method, timed."""
    pytest.importorskip("ray")
    from softrl_bench.report import systems_markdown
    from softrl_bench.end_to_end import runtime_settings
    from softrl_bench.systems import in_fresh_process
    from softrl_bench.sync import sync_part

    out, ratios = sync_part(tmp_path, str(tiny[0]), runtime_settings, {"model.path": str(tiny[0])},
                            {"task": "countdown", "prompts": 2, "samples_per_prompt": 2}, 0, in_fresh_process, rounds=2)
    assert set(out["update"]["seconds"]) == {"object_store", "broadcast"}
    assert all(len(v) == 2 and min(v) > 0 for v in out["update"]["seconds"].values())
    assert ratios["broadcast_over_object_store_update"] > 0 and out["intervals"] == {}
    table = systems_markdown({"model": "m", "task": "countdown", "batch": "2 x 2", "max_new_tokens": 8, "threads": 1,
                              "cpu": "x", "fixed_work": True, "sync": out, "ratios": ratios})
    assert "| broadcast |" in table and "| object_store |" in table
