"""The Python API (softrl.train / softrl.evaluate) and what it stands on: reward functions that see
the record (per-sample and TRL's batched form), records from Python, files, `hf:` datasets and hub
ids from an offline cache, chat messages through the chat template, callbacks, the final folder and
its model card, and bad use as one-line errors raised before training."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import softrl  # noqa: E402
from softrl.config import ConfigError  # noqa: E402
from softrl.tasks.base import RewardError  # noqa: E402
from softrl.tasks.records import RecordError, records_of  # noqa: E402
from softrl.tasks.records import conversation_text  # noqa: E402
from softrl.tasks.reward_functions import RewardFunctionTask, reward_functions  # noqa: E402
from test_training import SOFTRL  # noqa: E402

RECORDS = [{"prompt": "1 2 -> 3\n", "answer": 3, "tests": ["a"]}, {"prompt": "2 2 -> 4\n", "answer": 4, "tests": []}]
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def task_of(reward, records=RECORDS):
    return RewardFunctionTask(reward_functions(reward), records_of(records))


def grades(task, completions):
    return task.grade_many(list(zip(task.prompts(), completions)))


def test_a_per_sample_reward_gets_the_fields_it_names_or_all_with_kwargs():
    seen = []

    def named(prompt, completion, answer):
        seen.append(("named", prompt, completion, answer))
        return completion.strip() == str(answer)

    def everything(prompt, completion, **fields):
        seen.append(("all", sorted(fields)))
        return 0.0

    assert [g.reward for g in grades(task_of(named), ["3", "5"])] == [1.0, 0.0]
    assert seen == [("named", "1 2 -> 3\n", "3", 3), ("named", "2 2 -> 4\n", "5", 4)]
    seen.clear()
    grades(task_of(everything), ["x", "y"])
    assert seen == [("all", ["answer", "tests"]), ("all", ["answer", "tests"])]


def test_a_batched_reward_gets_every_field_as_a_list_in_one_call():
    calls = []

    def accuracy(prompts, completions, answer, **kwargs):
        calls.append((prompts, completions, answer, kwargs))
        return [float(c == str(a)) for c, a in zip(completions, answer)]

    result = grades(task_of(accuracy), ["3", "4"])
    assert [(g.reward, g.passed) for g in result] == [(1.0, True), (1.0, True)]
    assert calls == [(["1 2 -> 3\n", "2 2 -> 4\n"], ["3", "4"], [3, 4], {"tests": [["a"], []]})]


def test_trl_signatures_are_called_by_keyword():
    """TRL calls reward functions by keyword: `f(completions, **kwargs)` and `f(completions, solution,
    **kwargs)` are its own library's forms; a per-sample function's second parameter may share a
    field's name (`response`) without being passed twice."""
    def completions_only(completions, **kwargs):
        assert "prompts" in kwargs and kwargs["answer"] == [3, 4]
        return [1.0 for _ in completions]

    def with_solution(completions, answer, **kwargs):
        return [float(c == str(a)) for c, a in zip(completions, answer)]

    def old_form(prompt, response):
        return response == "3"

    assert [g.reward for g in grades(task_of(completions_only), ["x", "y"])] == [1.0, 1.0]
    assert [g.reward for g in grades(task_of(with_solution), ["3", "5"])] == [1.0, 0.0]
    records = [{**r, "response": "ignored"} for r in RECORDS]
    assert [g.reward for g in grades(task_of(old_form, records), ["3", "4"])] == [1.0, 0.0]


def test_several_rewards_are_a_weighted_sum():
    def right(prompt, completion, answer):
        return completion == str(answer)

    def short(prompts, completions, **kwargs):
        return [float(len(c) < 2) for c in completions]

    even = grades(task_of([right, short]), ["3", "44"])
    assert [g.reward for g in even] == [1.0, 0.0]  # 1/2 each: (1 + 1) / 2, (0 + 0) / 2
    weighted = grades(task_of([(right, 0.75), (short, 0.25)]), ["33", "4"])
    assert [g.reward for g in weighted] == [0.0, 1.0] and [g.passed for g in weighted] == [False, True]
    rest = reward_functions([(right, 0.8), short])  # an unweighted one gets what the given weights leave
    assert [f.weight for f in rest] == [0.8, pytest.approx(0.2)]
    with pytest.raises(RewardError, match="sum to 1.5"):
        reward_functions([(right, 1.5), short])


def test_weights_must_sum_to_one_and_rounding_is_not_a_miss():
    """Weights summing to 0.8 would cap every reward below 1 (nothing ever solved); thirds sum to
    0.9999999999999999 in floating point, which must still be solved."""
    def right(prompt, completion, answer):
        return completion == str(answer)

    with pytest.raises(RewardError, match="the weights sum to 0.8, not 1"):
        reward_functions([(right, 0.5), (right, 0.3)])
    with pytest.raises(RewardError, match="the weights sum to 1.2, not 1"):
        reward_functions([(right, 0.6), (right, 0.6)])
    third = 1 / 3
    assert third + third + third != 1.0 or sum([0.1] * 10) != 1.0  # the rounding this guards against
    tenths = grades(task_of([(right, 0.1)] * 10), ["3", "5"])
    assert [(g.reward, g.passed) for g in tenths] == [(1.0, True), (0.0, False)]
    thirds = grades(task_of([right, right, right]), ["3"])
    assert thirds[0].reward == 1.0 and thirds[0].passed


@pytest.mark.parametrize("spec,options,message", [
    ("test_api:_exact", {"prompts": "P", "prompt_suffix": "!"}, r"option 'prompt_suffix' is not one reward function "
     r"test_api:_exact takes \(its options: prompts\)"),
    ("hf:some/set", {"reward": "test_api:_exact", "size_limit": 3}, "option 'size_limit' is not one hf:some/set takes"),
])
def test_a_reward_function_task_refuses_options_it_would_drop(spec, options, message):
    from softrl.tasks.registry import load_task

    with pytest.raises(ValueError, match=message):
        load_task(spec, **options)


def _exact(prompt, completion, answer):
    return completion == str(answer)


@pytest.mark.parametrize("reward,message", [
    (lambda prompts, completions, **kw: [1.0], "batched reward function <lambda> returned 1 values for 2 completions"),
    (lambda prompts, completions, **kw: "1", "batched reward function <lambda> must return a list of 2 numbers, got str"),
    (lambda prompts, completions, **kw: {"a": 1}, "must return a list of 2 numbers, got dict"),
    (lambda prompt, completion, **kw: None, "reward function <lambda> must return a finite number, got None"),
    (lambda prompt, completion, **kw: "yes", "reward function <lambda> must return a finite number, got 'yes'"),
    (lambda prompt, completion, **kw: 2.0, "reward must be a finite number in [0, 1], got 2"),
])
def test_a_reward_of_the_wrong_length_or_type_is_one_line(reward, message):
    with pytest.raises(RewardError) as caught:
        grades(task_of(reward), ["3", "4"])
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("task <lambda>, prompt prompt-")


def test_records_need_a_prompt_and_messages_are_a_conversation():
    with pytest.raises(RecordError, match=r"dataset\[1\]: record has no field 'prompt'"):
        task_of(lambda p, c: 1.0, [{"prompt": "a"}, {"question": "b"}])
    with pytest.raises(RecordError, match=r"dataset\[0\]: field 'prompt' must be a string or a non-empty list"):
        task_of(lambda p, c: 1.0, [{"prompt": [{"role": "user"}]}])
    with pytest.raises(RecordError, match="dataset must be a list of dicts"):
        records_of(7)
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    seen = []
    task = task_of(lambda prompt, completion: seen.append(prompt) or 1.0,
                   [{"messages": [*chat, {"role": "assistant", "content": "4"}]}])
    (prompt,) = task.prompts()
    assert prompt.text == conversation_text(chat) and task.reference_solutions(prompt) == ["4"]
    grades(task, ["4"])
    assert seen == [chat]  # the reward sees the messages, the model the template's rendering


def test_a_conversation_s_completion_is_the_assistant_message_as_in_trl():
    """TRL hands a conversational dataset's reward functions completions as message lists
    (`completion[0]["content"]`), a plain one's as strings; one dataset may mix both."""
    seen = []

    def batched(prompts, completions, **kwargs):
        seen.append(completions)
        return [float((c[0]["content"] if isinstance(c, list) else c) == "4") for c in completions]

    def per_sample(prompt, completion):
        seen.append(completion)
        return 1.0

    chat = [{"role": "user", "content": "2+2?"}]
    records = [{"prompt": chat}, {"prompt": "2+2="}]
    assert [g.reward for g in grades(task_of(batched, records), ["4", "4"])] == [1.0, 1.0]
    assert seen == [[[{"role": "assistant", "content": "4"}], "4"]]
    seen.clear()
    grades(task_of(per_sample, records), ["5", "6"])
    assert seen == [[{"role": "assistant", "content": "5"}], "6"]


def test_data_import_takes_chat_prompts(tmp_path):
    """`softrl data import` reads a prompt given as chat messages (or `messages`) as the same text
    the chat template renders and the API's datasets store."""
    from softrl.data.io import read_trajectories

    chat = [{"role": "user", "content": "2+2?"}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": chat, "completion": "4", "reward": 1}) + "\n"
                    + json.dumps({"messages": chat, "response": "5", "reward": 0}) + "\n")
    rows = read_trajectories(path, "human")
    assert [r.prompt_text for r in rows] == [conversation_text(chat)] * 2 and [r.reward for r in rows] == [1.0, 0.0]


def test_a_conversation_goes_through_the_chat_template(tiny):
    from softrl.models.loading import encode_prompt

    _, _, tokenizer = tiny
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    plain = encode_prompt(tokenizer, conversation_text(chat))  # no template: role lines
    assert tokenizer.decode(plain) == "system: be brief\nuser: 2+2?\nassistant: "
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    try:
        assert tokenizer.decode(encode_prompt(tokenizer, conversation_text(chat))) == \
            "<system>be brief<user>2+2?<assistant>"
        assert tokenizer.decode(encode_prompt(tokenizer, "hi")) == "<user>hi<assistant>"
    finally:
        tokenizer.chat_template = None


def small(tiny, tmp_path, **extra):
    return {"out_dir": str(tmp_path), "name": "api", "data.store": str(tmp_path / "store"), "model.path": str(tiny[0]),
            "q0.k": 2, "sampling": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 4},
            "optim.steps": 2, "eval.samples": 2, "log.checkpoint_every": 2, **extra}


def answered(prompts, completions, answer, **kwargs):
    return [float(str(a) in c) for c, a in zip(completions, answer)]


class Recorder(softrl.Callback):
    def __init__(self):
        self.steps, self.evals = [], []

    def on_step(self, metrics):
        self.steps.append(metrics["step"])

    def on_eval(self, result):
        self.evals.append((result["step"], result["eval/pass@1"]))


def test_train_returns_the_run_with_callbacks_offline_data_and_a_loadable_final_model(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    from softrl.data import ExperienceStore

    recorder = Recorder()
    offline = [{"prompt": "1 2 -> 3\n", "completion": "3", "reward": 1.0},
               {"prompt": "not in the dataset", "completion": "x", "reward": 0.0}]
    run = softrl.train(small(tiny, tmp_path), dataset=RECORDS, reward=answered, offline=offline,
                       callbacks=[recorder], progress=False)
    assert recorder.steps == [1, 2] and [s for s, _ in recorder.evals] == [0, 2]
    assert run.summary["pass@1_after"] == recorder.evals[-1][1] and run.summary["steps"] == 2
    assert [m["step"] for m in run.metrics] == [0, 1, 2, 2]
    assert "import:api" in run.config.data.offline_sources
    stored = ExperienceStore(tmp_path / "store").trajectories(source="import:api").to_pylist()
    assert sorted((r["prompt_id"].startswith("prompt-"), r["task"], r["reward"]) for r in stored) == \
        [(True, "answered", 0.0), (True, "answered", 1.0)]
    model = AutoModelForCausalLM.from_pretrained(run.final_model)
    assert model.config.vocab_size == tiny[1].config.vocab_size
    card = (run.final_model / "README.md").read_text()
    assert "library_name: transformers" in card and "Soft Policy Optimization" in card and "`answered`" in card
    result = softrl.evaluate(run.final_model, dataset=RECORDS, reward=answered, samples=2, max_new_tokens=4)
    assert result["problems"] == 2 and 0 <= result["pass@1"] <= 1 and result["task"] == "answered"


def test_a_config_dict_mixes_sections_and_dotted_keys():
    config = softrl.api.run_config({"model.path": "m", "model": {"dtype": "bfloat16"}, "optim": {"lr": 0.5}})
    assert (config.model.path, config.model.dtype, config.optim.lr) == ("m", "bfloat16", 0.5)


def test_prompt_ids_carry_the_task_so_q0_is_not_shared_across_rewards():
    def one(prompt, completion):
        return 1.0

    def other(prompt, completion):
        return 0.0

    ids = lambda fn, records: [p.id for p in task_of(fn, records).prompts()]  # noqa: E731
    assert not set(ids(one, RECORDS)) & set(ids(other, RECORDS))
    [seven] = ids(one, [{"id": 7, "prompt": "a"}])
    assert seven.startswith("one.") and seven.endswith(":7") and ids(one, [{"id": 7, "prompt": "a"}]) == [seven]


def test_two_rewards_of_one_name_do_not_share_prompt_ids():
    """Q0 and the stored reference rows are values under one reward: another function of the same name,
    the same one with other weights or another declared range, gets prompts of its own."""
    def make(value):
        def score(prompt, completion):
            return value
        return score

    def score(prompt, completion):
        return 0.0

    def score_again(prompt, completion):
        return 0.0

    zero = task_of(score).prompts()[0].id
    assert task_of(score).prompts()[0].id == zero  # the same function: the same ids, in any process
    score_again.__name__, score_again.__qualname__ = score.__name__, score.__qualname__  # the same reward
    assert task_of(score_again).prompts()[0].id == zero
    one = make(1.0)
    one.__name__, one.__qualname__ = score.__name__, score.__qualname__
    assert task_of(one).prompts()[0].id != zero  # another body (returns its closure's value): another reward
    ranged = RewardFunctionTask(reward_functions(score, summed=True), records_of(RECORDS), reward_range=(0.0, 2.0))
    assert ranged.prompts()[0].id != zero


def test_a_declared_range_is_mapped_onto_0_1_and_its_top_is_solved():
    def fmt(prompt, completion):
        return 0.2 if completion.startswith("<") else 0.0

    def accuracy(prompt, completion, answer):
        return 1.0 if completion.strip(" <") == str(answer) else -1.0

    task = RewardFunctionTask(reward_functions([fmt, accuracy], summed=True), records_of(RECORDS),
                              reward_range=(-1.0, 1.2))  # TRL's plain sum: a format bonus and a penalty
    result = grades(task, ["<3", "<5"])  # 0.2 + 1 = 1.2, the top; 0.2 - 1 = -0.8
    assert [(round(g.reward, 12), g.passed) for g in result] == [(1.0, True), (round(0.2 / 2.2, 12), False)]
    assert [g.passed for g in grades(task, ["3", "4"])] == [False, False]  # 1.0 each: below the top, 1.2
    narrow = RewardFunctionTask(reward_functions([fmt, accuracy], summed=True), records_of(RECORDS),
                                reward_range=(-1.0, 1.0))
    with pytest.raises(RewardError, match=r"in \[-1, 1\], got 1.2 \(1 x fmt 0.2 \+ 1 x accuracy 1\) "
                                          r"\(task.reward_range\)"):
        grades(narrow, ["<3", "4"])

    def broken(prompt, completion):
        return float("nan")

    with pytest.raises(RewardError, match="reward function broken must return a finite number, got nan"):
        grades(RewardFunctionTask(reward_functions([fmt, broken], summed=True), records_of(RECORDS),
                                  reward_range=(-1.0, 1.2)), ["<3", "4"])


def test_each_objective_sees_its_scale_of_the_reward():
    import torch

    import softrl.objectives as registry
    from softrl.config import config_from
    from softrl.training.learner import Learner

    unit = torch.tensor([0.0, 0.5, 1.0])
    ranged = type("L", (), {"config": config_from({"task.reward_range": [-1, 2]})})()
    plain = type("L", (), {"config": config_from({})})()
    assert Learner.rewards(ranged, unit, registry.get("spo")).tolist() == [0.0, 0.5, 1.0]
    assert Learner.rewards(ranged, unit, registry.get("topr")).tolist() == [0.0, 0.5, 1.0]
    assert Learner.rewards(ranged, unit, registry.get("agro-off")).tolist() == [-1.0, 0.5, 2.0]
    assert Learner.rewards(ranged, unit, registry.get("grpo")).tolist() == [-1.0, 0.5, 2.0]
    assert Learner.rewards(plain, unit, registry.get("agro-off")).tolist() == [0.0, 0.5, 1.0]
    with pytest.raises(ConfigError, match=r"task.reward_range: must be \[lo, hi\] with lo < hi"):
        config_from({"task.reward_range": [2, 2]})
    from softrl.tasks.registry import load_task
    with pytest.raises(ValueError, match="reward_range: countdown grades its own rewards on"):
        load_task("countdown", reward_range=(0.0, 2.0), size=2)


def test_bad_use_is_raised_before_training(tiny, tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'optim.lrr'"):
        softrl.train({**small(tiny, tmp_path), "optim.lrr": 1}, dataset=RECORDS, reward=answered, progress=False)
    with pytest.raises(ConfigError, match="unknown key 'sampling.temprature'"):
        softrl.train({**small(tiny, tmp_path), "sampling": {"temprature": 1}}, dataset=RECORDS, reward=answered)
    with pytest.raises(ConfigError, match="model.path: give the model to train"):
        softrl.train({**small(tiny, tmp_path), "model.path": "bootstrap"}, dataset=RECORDS, reward=answered)
    with pytest.raises(ConfigError, match="give dataset= and reward= together"):
        softrl.train(small(tiny, tmp_path), dataset=RECORDS, progress=False)
    with pytest.raises(RecordError, match=r"dataset\[0\]: record has no field 'prompt'"):
        softrl.train(small(tiny, tmp_path), dataset=[{"text": "a"}], reward=answered, progress=False)
    with pytest.raises(RewardError, match="returned 1 values for"):
        softrl.train(small(tiny, tmp_path), dataset=RECORDS, reward=lambda prompts, completions, **kw: [0.0],
                     progress=False)
    assert not (tmp_path / "api").exists()  # nothing trained, no run directory


def test_a_model_loads_by_hub_id_from_an_offline_cache(tiny, tmp_path):
    """The hub's cache layout (models--ORG--NAME/snapshots/REVISION, refs/main), HF_HUB_OFFLINE=1:
    `model.path` / `--model` take the hub id."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--softrl-test--tiny"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for f in Path(tiny[0]).iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    env = {**OFFLINE, "HF_HUB_CACHE": str(tmp_path / "hub")}
    out = subprocess.run([SOFTRL, "eval", "--model", "softrl-test/tiny", "--size", "2", "--samples", "2",
                          "--max-new-tokens", "4", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1])["model"] == "softrl-test/tiny"
    missing = subprocess.run([SOFTRL, "eval", "--model", "softrl-test/none", "--size", "2"], capture_output=True,
                             text=True, env=env, timeout=300)
    assert missing.returncode in (1, 2) and "softrl-test/none" in missing.stderr and "Traceback" not in missing.stderr


def test_an_hf_dataset_from_a_local_directory_with_a_module_reward(tiny, tmp_path):
    """`--task hf:DIR` (datasets.load_dataset on a folder of data files) graded by
    `--task-option reward=module:function`, which sees the records' fields."""
    data = tmp_path / "arith"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (tmp_path / "arith_reward.py").write_text(
        "def answered(prompts, completions, answer, **kwargs):\n"
        "    return [float(str(a) in c) for c, a in zip(completions, answer)]\n")
    env = {**OFFLINE, "PYTHONPATH": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    args = [SOFTRL, "eval", "--model", str(tiny[0]), "--task", f"hf:{data}", "--samples", "2", "--max-new-tokens", "4",
            "--json"]
    out = subprocess.run(args + ["--task-option", "reward=arith_reward:answered"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1])["problems"] == 2
    without = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert without.returncode in (1, 2) and "reward=module:function" in without.stderr
    split = subprocess.run(args[:5] + [f"hf:{data}::test"] + args[6:] + ["--task-option", "reward=arith_reward:answered"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert split.returncode in (1, 2) and "Unknown split" in split.stderr and "Traceback" not in split.stderr


EXAMPLES = Path(__file__).parent.parent / "examples"
TINY_RUN = ["--records", "8", "optim.steps=2", "q0.k=2", "eval.samples=2", "sampling.prompts_per_step=2"]


def test_the_examples_run(tmp_path):
    """examples/: a TRL-style batched reward, online plus offline completions, and evaluating the
    saved model (on the countdown bootstrap, a few steps each)."""
    def run(script, *args):
        out = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                             cwd=tmp_path, env=OFFLINE, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    assert "pass@1" in run("trl_style_reward.py", *TINY_RUN)
    assert "rows trained on" in run("online_plus_offline.py", *TINY_RUN)
    final = tmp_path / "runs" / "trl-style-reward" / "final"
    assert (final / "README.md").is_file()
    evaluated = run("evaluate_saved_model.py", str(final), "--records", "4", "--samples", "2")
    assert f"{final}: pass@1" in evaluated and "bootstrap:countdown: pass@1" in evaluated


def test_a_lora_run_saves_whole_merged_weights(tiny, tmp_path):
    """With model.lora the final folder holds the adapters merged into whole weights: it loads
    without PEFT's adapter files and differs from the reference only where LoRA trained."""
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    config = small(tiny, tmp_path, **{"model.lora": {"r": 4, "alpha": 8}, "optim.lr": 1e-2})
    odd_length = lambda prompt, completion: len(completion) % 2  # noqa: E731 - rewards that vary: a gradient
    run = softrl.train(config, dataset=RECORDS, reward=odd_length, progress=False)
    assert all(m["grad_norm"] > 0 for m in run.metrics if "grad_norm" in m)
    assert not (run.final_model / "adapter_config.json").exists()
    final = AutoModelForCausalLM.from_pretrained(run.final_model).state_dict()
    reference = tiny[1].state_dict()
    assert set(final) == set(reference)
    changed = {k for k in final if not (final[k] == reference[k]).all()}
    assert changed and all("q_proj" in k or "v_proj" in k for k in changed), changed


def test_a_prompt_beyond_any_context_is_refused_before_anything_is_tokenized(tiny, tmp_path, monkeypatch):
    """softrl.train(dataset=...) with a 15 MB prompt (46 s and 6.9 GB of tokenizing, then refused for
    the model's positions): refused in one line naming it, its size and what the model takes, before
    any prompt is tokenized or any model loaded; a prompt over the 16 MiB record limit is refused as
    `dataset[i]` (no line limit caught it in Python)."""
    import time

    from softrl import assemble
    from softrl.models import wrappers

    tokenized, loaded = [], []
    monkeypatch.setattr(assemble, "encode_prompt", lambda tokenizer, text: tokenized.append(len(text)) or [1])
    load = wrappers.PolicyModel.load
    monkeypatch.setattr(wrappers.PolicyModel, "load", lambda *a, **k: loaded.append(1) or load(*a, **k))
    started = time.time()
    with pytest.raises(ValueError, match=r"prompt 'prompt-\w+' of task '\w+' has 15,000,000 characters, more than "
                                         r"the model's 256 positions at 32 characters a token could hold: at most "
                                         r"8,192 characters"):
        softrl.train(small(tiny, tmp_path), dataset=[*RECORDS, {"prompt": "x" * (15 * 10**6), "answer": 1}],
                     reward=answered, progress=False)
    assert tokenized == [] and loaded == [] and time.time() - started < 30
    with pytest.raises(RecordError, match=r"^dataset\[1\]: the prompt has 16,777,217 characters, over the 16 MiB "
                                          r"limit of a record: at most 16,777,216$"):
        softrl.train(small(tiny, tmp_path), dataset=[RECORDS[0], {"prompt": "x" * (16 * 2**20 + 1), "answer": 1}],
                     reward=answered, progress=False)


def test_hub_ids_come_from_the_local_cache_without_asking_the_hub(tiny, tmp_path, monkeypatch):
    """HF_HUB_OFFLINE unset: a model and an `hf:` dataset in the local caches load from them and the
    hub is never asked (transformers and datasets ask it first, even for a cached id: half a minute of
    retries where no network answers); one the cache lacks is refused at once (test_reliability.py).
    HF_HUB_OFFLINE=0 hands an id to them as it is, to download."""
    from softrl.models.loading import ModelLoadError, local_source

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "hub" / "models--softrl-test--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    (repo / "snapshots" / revision).mkdir(parents=True)
    for f in Path(tiny[0]).iterdir():
        (repo / "snapshots" / revision / f.name).write_bytes(f.read_bytes())
    data = tmp_path / "arith"  # cached below as the hub dataset softrl-test/arith
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    script = f"""
import json, shutil, time
from pathlib import Path
import datasets, datasets.config
datasets.load_dataset({str(data)!r}, split="train")
cache = Path(datasets.config.HF_DATASETS_CACHE)
shutil.copytree(next(cache.glob("arith/*/*/*/dataset_info.json")).parent, cache / "softrl-test___arith/default/0.0.0/x")
from softrl.models.loading import load_causal_lm
from softrl.tasks.records import records_of
started = time.time()
model, tokenizer = load_causal_lm("softrl-test/tiny")
rows = records_of("hf:softrl-test/arith")
print(json.dumps([model.config.max_position_embeddings, [r["prompt"] for _, r in rows], time.time() - started]))
"""
    hub = ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {**{k: v for k, v in os.environ.items() if k not in hub}, "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    positions, prompts, seconds = json.loads(out.stdout.strip().splitlines()[-1])
    assert positions == 256 and prompts == [r["prompt"] for r in RECORDS], out.stdout
    assert "huggingface.co" not in out.stderr and seconds < 20, out.stderr[-2000:]  # asked, it retries for 30 s
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert local_source("softrl-test/none") == "softrl-test/none"  # to transformers, which downloads it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="softrl-test/none: no such local directory, and the hub id is not in"):
        local_source("softrl-test/none")
