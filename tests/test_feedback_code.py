"""tinycode-feedback (issue 50, part 5): tinycode-loops problems as episodes; the sandbox runs each
program on the shown tests and answers with the first failure; the reward is every test's at the last
turn. The bootstrap's synthetic episodes get the very feedback the environment gives."""

import random

import pytest
from conftest import save_char_llama

from softrl.tasks.feedback_code import (SHOWN, FeedbackCodeTask, ShownTestsEnvironment, synthetic_episode,
                                        trusted_feedback)
from softrl.tasks.loopcode import plausible_wrong
from softrl.tasks.registry import load_task


@pytest.fixture(scope="module")
def seen():
    return load_task("tinycode-feedback", size=12, seed=3, split="seen")


def ask(env, prompt, program):
    state = env.initial_state(prompt)
    done = env.is_completed([{"role": "assistant", "content": program}], state)
    return done, (None if done else env.env_response([], state)[0])


def test_the_environment_passes_a_right_program_and_answers_a_wrong_one_with_its_first_failure(seen):
    env = seen.make_environment()
    assert isinstance(env, ShownTestsEnvironment) and env.deterministic
    prompt = seen.prompts()[0]
    assert ask(env, prompt, prompt.meta["solutions"][0]) == (True, None)
    fenced = f"Here:\n```python\n{prompt.meta['solutions'][1]}\n```"
    assert ask(env, prompt, fenced)[0]
    done, answer = ask(env, prompt, "print(123456)")
    stdin, expected = prompt.meta["tests"][0]
    assert not done and answer == [{"role": "user", "content": f"Failed on input: {stdin}\nExpected: "
                                    f"{expected.strip()}\nGot: 123456"}]
    done, answer = ask(env, prompt, "print(undefined_name)")
    assert not done and answer[0]["content"].endswith("Error: NameError: name 'undefined_name' is not defined")
    done, answer = ask(env, prompt, "while True:\n    pass")
    assert not done and answer[0]["content"].endswith("Error: time limit")


def test_the_bootstraps_feedback_is_the_sandboxs_for_every_plausible_wrong_program(seen):
    """The reference learns from trusted in-process runs; a rollout gets the sandbox's: the same text."""
    env = seen.make_environment()
    checked = 0
    for prompt in seen.prompts()[:6]:
        for program in plausible_wrong(prompt)[:6]:
            done, answer = ask(env, prompt, program)
            said = trusted_feedback(program, prompt.meta["tests"])
            assert (said is None) == done and (done or answer[0]["content"] == said), program
            checked += not done
    assert checked >= 10


def test_synthetic_episodes_alternate_programs_and_their_feedback_until_the_shown_tests_pass(seen):
    rng = random.Random(0)
    lengths = set()
    for prompt in seen.prompts():
        right, wrong = prompt.meta["solutions"], plausible_wrong(prompt)
        for _ in range(5):
            turns = synthetic_episode(prompt, right, wrong, rng, max_turns=3, p_correct=0.35)
            roles = [t["role"] for t in turns]
            assert roles == ["assistant", "user"] * (len(roles) // 2) + ["assistant"]
            programs = [t["content"] for t in turns[::2]]
            assert len(programs) <= 3 and len(set(programs)) == len(programs)  # a revision changes the program
            for program, feedback in zip(programs, turns[1::2]):
                assert feedback["content"] == trusted_feedback(program, prompt.meta["tests"])
            last = trusted_feedback(programs[-1], prompt.meta["tests"])
            assert last is None or len(programs) == 3  # it ends where the shown tests pass, or at the limit
            lengths.add(len(programs))
    assert lengths == {1, 2, 3}


def test_the_task_brings_its_environment_and_a_config_overrides_it(tmp_path):
    from softrl.assemble import load_environment
    from softrl.config import load_config
    from softrl.tasks.environment import FeedbackEnvironment

    task = load_task("tinycode-feedback", size=2)
    assert isinstance(task, FeedbackCodeTask) and task.prompts()[0].meta["combination"]
    config = load_config(None, [f"out_dir={tmp_path}", "task.name=tinycode-feedback"])
    assert isinstance(load_environment(config, task), ShownTestsEnvironment)
    config = load_config(None, [f"out_dir={tmp_path}", "task.name=tinycode-feedback", "task.environment=feedback"])
    assert isinstance(load_environment(config, task), FeedbackEnvironment)
    assert load_environment(load_config(None, [f"out_dir={tmp_path}", "task.name=tinycode-loops"]),
                            load_task("tinycode-loops", size=2)) is None
    assert SHOWN == 2 and all(len(p.meta["tests"]) > SHOWN for p in task.prompts())  # hidden tests besides


def test_the_bootstraps_rows_train_the_policys_turns_only(seen):
    from softrl.bootstrap import BootstrapConfig, training_row
    from softrl.models.chartok import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = BootstrapConfig(task="tinycode-feedback", p_correct=0.0)  # wrong first: an episode of several turns
    prompt = seen.prompts()[0]
    example = (prompt, prompt.meta["solutions"], plausible_wrong(prompt))
    rows = [training_row(tokenizer, example, config, random.Random(seed)) for seed in range(20)]
    ids, labels = next((i, la) for i, la in rows if i.count(tokenizer.eos_token_id) >= 2)  # two programs or more
    assert len(ids) == len(labels)
    trained = tokenizer.decode([t for t, label in zip(ids, labels) if label != -100])
    untrained = tokenizer.decode([t for t, label in zip(ids, labels) if label == -100])
    assert untrained.startswith(prompt.text) and "\nuser: Failed on input: " in untrained
    assert "Failed on input" not in trained and ("for x in" in trained or "xs = " in trained)
    assert labels.count(tokenizer.eos_token_id) == ids.count(tokenizer.eos_token_id)  # each program's EOS trained
    assert prompt.id.startswith("tinycode-feedback-")  # not tinycode-loops' ids: Q0 and rows are kept apart


def test_softrl_train_on_tinycode_feedback_exports_episodes_that_reimport_and_train_spo_offline(tmp_path):
    """The issue's first 'done when': `softrl train` on tinycode-feedback rolls out episodes (no
    task.environment given: the task brings its own) and counts the policy's tokens; its rows export as chat messages with two
    assistant turns or more and the sandbox's feedback between them; they import again and SPO trains on
    them offline only."""
    import json
    import subprocess
    import sys

    from softrl.data import ExperienceStore

    model = save_char_llama(tmp_path / "model", positions=1024)
    softrl = [sys.executable, "-m", "softrl"]
    common = [f"out_dir={tmp_path}", f"data.store={tmp_path}/store", f"model.path={model}", "task.name=tinycode-feedback",
              "task.size=3", "task.eval_size=2", "q0.k=2", "sampling.prompts_per_step=2", "sampling.samples_per_prompt=2",
              "sampling.max_new_tokens=12", "optim.steps=2", "eval.samples=2"]
    online = subprocess.run([*softrl, "train", *common, "name=online", "data.mix={online: 1}"], capture_output=True,
                            text=True, timeout=900)
    assert online.returncode == 0, online.stderr[-2000:]
    assert json.loads((tmp_path / "online" / "summary.json").read_text())["steps"] == 2
    records = [json.loads(line) for line in (tmp_path / "online" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if "eval/turns_per_episode" in r]  # evaluated in episodes too
    assert len(evaluated) == 2 and all(1 <= r["eval/turns_per_episode"] <= 3 and "eval/first_turn_pass@1" in r
                                       for r in evaluated)
    rows = ExperienceStore(tmp_path / "store").trajectories(source="online", run_id="online").to_pylist()
    assert rows and all(r["turns"] and r["action_mask"] for r in rows)
    # each step counts the policy's tokens generated so far, its turns' and not the environment's
    steps = [r for r in records if "loss" in r]
    assert steps[-1]["tokens"] == sum(sum(r["action_mask"]) for r in rows) > steps[0]["tokens"] > 0
    out = tmp_path / "episodes.jsonl"
    assert subprocess.run([*softrl, "data", "export", str(out), "--format", "chat", "--store", str(tmp_path / "store")],
                          capture_output=True).returncode == 0
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    long = [r for r in exported if sum(m["role"] == "assistant" for m in r["messages"]) >= 2]
    assert long and all(r["messages"][2]["role"] == "user" and r["messages"][2]["content"].startswith(
        "Failed on input: ") for r in long)
    imported = subprocess.run([*softrl, "data", "import", str(out), "--source", "feedback-logs", "--store",
                               str(tmp_path / "logs")], capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    offline = subprocess.run([*softrl, "train", *common, "name=offline", f"data.store={tmp_path}/logs",
                              "data.offline_sources=[feedback-logs]", "data.offline_passed_only=false",
                              "data.mix={offline: 1}"], capture_output=True, text=True, timeout=900)
    assert offline.returncode == 0, offline.stderr[-2000:]
    assert json.loads((tmp_path / "offline" / "summary.json").read_text())["steps"] == 2
