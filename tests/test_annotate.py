"""Q0 estimation and Pivotal Token Search: on a synthetic task with known answers, and through the
real Hugging Face path on a tiny model."""

import json
import math
import os
import random
import shutil
import subprocess
import sys

import pytest

from softrl.annotate.pts import annotate_store, bisect_pivots, render, search, spread_over_prompts
from softrl.annotate.q0 import binomial_stderr, estimate_q0
from softrl.rollout import RolloutSpec
from softrl.data import ExperienceStore, Trajectory
from softrl.models.generation import Sample
from softrl.tasks.base import Grade, Prompt, Task

BETA = 0.25


class Bits(Task):
    """Responses are bit strings; one passes when its bit number `pivot` (0-based) is 1. Under
    `BitGenerator(q)` every prefix that ends before the pivot succeeds with probability q, and every
    prefix of a passed response that includes it succeeds surely: the pivotal token is known."""

    name = "bits"

    def __init__(self, pivots: list[int]):
        self._prompts = [Prompt(f"bits-{i}", f"pivot {p}", {"pivot": p}) for i, p in enumerate(pivots)]

    def prompts(self):
        return list(self._prompts)

    def grade(self, prompt, response):
        passed = response[prompt.meta["pivot"] : prompt.meta["pivot"] + 1] == "1"
        return Grade(float(passed), passed)


class BitGenerator:
    """Emits exactly max_new_tokens bits, each 1 with probability q (a Generator)."""

    def __init__(self, q: float):
        self.q, self.calls = q, 0

    def generate(self, prompts, params):
        self.calls += 1
        rng = random.Random(params.seed)
        out = []
        for i in range(len(prompts)):
            for _ in range(params.n):
                bits = [int(rng.random() < self.q) for _ in range(params.max_new_tokens)]
                out.append(Sample(i, bits, "".join(map(str, bits)), [0.0] * len(bits), params.temperature, "length"))
        return out


def spec_for(task, q, length, source="reference"):
    return RolloutSpec(task, BitGenerator(q), lambda ids: "".join(map(str, ids)), "bits", length, source=source)


def test_q0_is_within_its_binomial_error_and_resumes(tmp_path):
    task = Bits([3, 5, 7])
    spec, store, k = spec_for(task, 0.3, 10), ExperienceStore(tmp_path), 800
    with pytest.raises(KeyboardInterrupt):  # killed after the first prompt's chunk was written
        estimate_q0(spec, task.prompts(), lambda t: [9], store, k, BETA, "bitgen", chunk=1,
                    progress=lambda done, total: (_ for _ in ()).throw(KeyboardInterrupt) if done == 1 else None)
    assert len(store.prompts()) == 1
    calls = spec.generator.calls
    rows = estimate_q0(spec, task.prompts(), lambda t: [9], store, k, BETA, "bitgen", chunk=1)
    assert spec.generator.calls - calls == 2 * math.ceil(k / spec.max_per_call)  # only the two missing prompts
    for row in rows.values():
        s = row["q0_success"]
        assert abs(s - 0.3) < 3 * binomial_stderr(0.3, k) and row["q0_k"] == k
        # the soft value in task units (binary rewards): 1 + beta * log(s + (1 - s) exp(-1/beta))
        assert row["q0_hat"] == pytest.approx(1 + BETA * math.log(s + (1 - s) * math.exp(-1 / BETA)), abs=1e-12)
    reference = store.trajectories(source="reference")
    assert reference.num_rows > 0 and set(reference["prompt_id"].to_pylist()) == {p.id for p in task.prompts()}
    assert estimate_q0(spec, task.prompts(), lambda t: [9], store, k, BETA, "bitgen") == rows  # all done: no work
    none = estimate_q0(spec_for(Bits([3]), 0.0, 10), Bits([3]).prompts(), lambda t: [9], ExperienceStore(tmp_path / "z"),
                       50, BETA, "never")
    assert none["bits-0"]["q0_hat"] == pytest.approx(0.0)  # no success: Q0_hat = 0 (SPO's r - 1 units: -1)


def test_q0_missing_at_a_pinned_snapshot_is_sampled_once(tmp_path):
    """A run pinned to a version without Q0 samples it on its first start (written as new versions);
    its resume, at the same snapshot, takes those rows instead of sampling every prompt again. Q0
    at the snapshot wins over a newer one."""
    task = Bits([3, 5])
    spec, store = spec_for(task, 0.3, 10), ExperienceStore(tmp_path)
    then = store.snapshot()
    rows = estimate_q0(spec, task.prompts(), lambda t: [9], store, 50, BETA, "bitgen", snapshot=then)
    calls = spec.generator.calls
    assert calls > 0 and set(rows) == {"bits-0", "bits-1"}
    assert estimate_q0(spec, task.prompts(), lambda t: [9], store, 50, BETA, "bitgen", snapshot=then) == rows
    assert spec.generator.calls == calls
    pinned = store.snapshot()
    store.put_prompts([{**row, "q0_rewards": [1.0] * 50} for row in rows.values()])
    assert estimate_q0(spec, task.prompts(), lambda t: [9], store, 50, BETA, "bitgen", snapshot=pinned) == rows


def test_bisection_finds_known_jumps_with_logarithmic_cost():
    for length in (16, 64, 256, 1024, 4096):
        pivot = random.Random(length).randrange(1, length)
        calls = []
        step = lambda t: calls.append(t) or (0.9 if t >= pivot else 0.1)  # noqa: E731
        visited, pivots = bisect_pivots(length, step, threshold=0.5)
        assert pivots == [pivot]
        assert len(calls) == len(set(calls)) <= math.ceil(math.log2(length)) + 2  # S(0), S(T), the midpoints
        assert visited[pivot - 1] == 0.1 and visited[pivot] == 0.9
    two = lambda t: 0.0 if t < 10 else 0.5 if t < 50 else 1.0  # noqa: E731
    assert bisect_pivots(100, two, threshold=0.3)[1] == [10, 50]
    assert bisect_pivots(100, two, threshold=0.3)[1] == [10, 50]
    assert bisect_pivots(100, two, threshold=0.6)[1] == []  # no single token jumps by 0.6
    with pytest.raises(ValueError, match="threshold must be in"):
        bisect_pivots(10, two, threshold=0)


def test_pts_finds_the_pivotal_token_with_rollouts(tmp_path):
    length, k = 64, 32
    for pivot in (0, 21, 37, 63):
        task = Bits([pivot])
        spec = spec_for(task, 0.2, length, source="pts")
        response = [random.Random(pivot).randint(0, 1) for _ in range(length)]
        response[pivot] = 1
        result = search(spec, task.prompts()[0], [9], response, True, "traj", k, threshold=0.5, seed=pivot)
        assert [p.t for p in result.pivots] == [pivot + 1]  # token pivot + 1 (1-based) makes S jump
        assert result.pivots[0].before < 0.5 and result.pivots[0].after == 1.0
        assert result.evaluated <= math.ceil(math.log2(length)) + 1
        assert len(result.rollouts) == result.evaluated * k and all(r.source == "pts" for r in result.rollouts)
        targets = {m["t"]: m for m in result.mc_targets}
        assert targets[length]["success"] == 1.0 and targets[pivot + 1]["k"] in (1, k)
        assert "[[1]]" in render(result) and f"pivotal token {pivot + 1} '1'" in render(result)


def test_annotate_store_writes_targets_and_rollouts_and_resumes(tmp_path):
    task = Bits([5, 9])
    store = ExperienceStore(tmp_path)
    good = [Trajectory(p.id, "1" * 12, 1.0, True, task="bits", prompt_tokens=[9], response_tokens=[1] * 12,
                       tokenizer="bits", source="online") for p in task.prompts()]
    text_only = Trajectory("bits-0", "011111", 1.0, True, task="bits", source="human")  # re-tokenised on the way
    store.append(good + [text_only, Trajectory("bits-1", "0", 0.0, False, task="bits")])
    estimate_q0(spec_for(task, 0.2, 12), task.prompts(), lambda t: [9], store, 200, BETA, "bitgen")
    spec = spec_for(task, 0.2, 12, source="pts")
    encode_response = lambda text: [int(c) for c in text]  # noqa: E731
    results = annotate_store(spec, store, lambda t: [9], encode_response, "bitgen", k=40, threshold=0.5,
                             sources=["online", "human"])
    assert len(results) == 3 and [r.pivots[0].t for r in results[:2]] == [6, 10]
    assert all(r.mc_targets[0]["t"] == 0 and r.mc_targets[0]["k"] == 200 for r in results)  # S(0) from Q0
    rows = {r["id"]: r for r in store.trajectories(source=["online", "human"]).to_pylist()}
    assert all(rows[g.id]["mc_targets"] for g in good)
    copies = [r for r in rows.values() if r["source"] == "human" and r["tokenizer"] == "bits"]
    assert len(copies) == 1 and copies[0]["response_tokens"] == [0, 1, 1, 1, 1, 1] and copies[0]["mc_targets"]
    assert store.trajectories(source="pts").num_rows > 0
    assert annotate_store(spec, store, lambda t: [9], encode_response, "bitgen", k=40, threshold=0.5,
                          sources=["online", "human"]) == []


def test_q0_on_a_real_model_agrees_with_an_independent_evaluation(tiny, tmp_path):
    """Per-prompt success of a tiny random Llama (reward: the response starts with an even digit
    character) from `estimate_q0`, against fresh samples drawn with another seed."""
    from softrl.models.generation import HFGenerator, SamplingParams
    from softrl.models.loading import encode_prompt, tokenizer_fingerprint

    class EvenStart(Task):
        name = "even-start"

        def prompts(self):
            return [Prompt(f"p{i}", text) for i, text in enumerate(["12 + 4", "hello", "7 7 7", "x = 0", "((("])]

        def grade(self, prompt, response):
            passed = response[:1] in set("02468")
            return Grade(float(passed), passed)

    _, model, tokenizer = tiny
    task, k = EvenStart(), 300
    generator = HFGenerator(model, tokenizer)
    spec = RolloutSpec(task, generator, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                       tokenizer_fingerprint(tokenizer), max_new_tokens=2)
    encode = lambda text: encode_prompt(tokenizer, text)  # noqa: E731
    rows = estimate_q0(spec, task.prompts(), encode, ExperienceStore(tmp_path), k, BETA, "tiny", seed=1)
    fresh = generator.generate([encode(p.text) for p in task.prompts()], SamplingParams(n=k, max_new_tokens=2, seed=99))
    for i, prompt in enumerate(task.prompts()):
        independent = sum(task.grade(prompt, s.text).passed for s in fresh if s.prompt_index == i) / k
        q0 = rows[prompt.id]["q0_success"]
        assert abs(q0 - independent) <= 4 * math.sqrt(2) * binomial_stderr((q0 + independent) / 2, k), prompt.text
    assert len({round(r["q0_success"], 2) for r in rows.values()}) > 1  # the prompts differ: a real check


SOFTRL = shutil.which("softrl", path=os.path.dirname(sys.executable))


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
def test_data_q0_and_pts_commands(tiny, tmp_path):
    directory = tiny[0]
    store = tmp_path / "store"
    run = lambda *args: subprocess.run([SOFTRL, *args, "--store", str(store)], capture_output=True, text=True)  # noqa: E731
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "1 2 -> 3", "response": "1+2", "reward": 1},
        {"prompt": "1 2 -> 3", "response": "1*2", "reward": 0.0},
        {"prompt": "4 4 -> 8", "response": "4+4", "passed": True}]) + "\n")
    assert run("data", "import", str(records), "--source", "human", "--task", "countdown").returncode == 0
    assert run("data", "import", "--solutions", "countdown").returncode == 0
    stats = json.loads(run("data", "stats", "--json").stdout)
    assert stats["sources"]["human"]["trajectories"] > 3 and stats["sources"]["human"]["pass_rate"] > 0.9
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "response": "b", "reward": 1}\n{"prompt": "a", "response": "c", "reward": 7}\n')
    proc = run("data", "import", str(bad), "--source", "x")
    assert proc.returncode == 2 and "bad.jsonl:2" in proc.stderr and "'reward'" in proc.stderr
    assert "x" not in json.loads(run("data", "stats", "--json").stdout)["sources"]  # nothing written
    proc = run("q0", "countdown", "--model", str(directory), "--size", "3", "--k", "6", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompts"] == 3
    proc = run("pts", "countdown", "--model", str(directory), "--size", "3", "--k", "2", "--limit", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["annotated"] == 2 and all(r["mc_targets"][-1]["success"] == 1.0 for r in out["results"])
    assert run("data", "export", str(tmp_path / "all.jsonl")).returncode == 0
    exported = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert {r["source"] for r in exported} >= {"human", "reference", "pts"}
    proc = run("data", "dedupe")
    assert proc.returncode == 0 and "0 duplicates removed" in proc.stderr
    again = tmp_path / "again"
    proc = subprocess.run([SOFTRL, "data", "import", str(tmp_path / "all.jsonl"), "--store", str(again)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert ExperienceStore(again).trajectories().num_rows == len(exported)  # an export imports back whole
    missing = subprocess.run([SOFTRL, "data", "stats", "--store", str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert missing.returncode == 2 and "is not an experience store" in missing.stderr


def test_a_pts_limit_is_spread_over_prompts():
    rows = [{"prompt_id": p, "id": f"{p}{i}"} for p in "abc" for i in range({"a": 3, "b": 1, "c": 2}[p])]
    assert [r["id"] for r in spread_over_prompts(rows)] == ["a0", "b0", "c0", "a1", "c1", "a2"]
    assert spread_over_prompts([]) == []
