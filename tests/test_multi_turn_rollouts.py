"""Multi-turn rollouts (issue 50, parts 3 and 4): the policy samples a turn for every live episode in one
batched call, an environment answers between turns (the verifiers-style protocol), and the rows are
episodes whose environment tokens are masked; an environment that raises, hangs, floods or answers
nonsense ends its own episode with the reason in the row, never the run."""

import json
import time

import pytest

from softrl.data import ExperienceStore
from softrl.rollout import EpisodeLimits, RolloutSpec, contexts_of, episodes
from softrl.tasks.environment import Environment, FeedbackEnvironment
from softrl.tasks.registry import load_task


@pytest.fixture
def setting(tiny):
    directory, model, tokenizer = tiny
    task = load_task("countdown", size=3)
    spec = RolloutSpec.for_model(task, model, tokenizer, max_new_tokens=6, backend="hf", source="online")
    contexts = contexts_of(spec, task.prompts(), lambda t: tokenizer(t, add_special_tokens=False)["input_ids"])
    return spec, contexts, tokenizer, task


class Calls:
    """A generator that counts its generate calls and the rows of each."""

    def __init__(self, inner):
        self.inner, self.rows = inner, []

    def generate(self, prompts, params):
        self.rows.append(len(prompts) * params.n)
        return self.inner.generate(prompts, params)


def test_feedback_episodes_alternate_turns_with_the_environment_masked(setting):
    from dataclasses import replace

    spec, contexts, tokenizer, task = setting
    calls = Calls(spec.generator)
    rows = episodes(replace(spec, generator=calls), FeedbackEnvironment(task), contexts, 2, seed=0,
                    limits=EpisodeLimits(max_turns=3), tokenizer=tokenizer)
    assert len(rows) == 6 and [r.prompt_id for r in rows] == [c.prompt.id for c in contexts for _ in range(2)]
    assert calls.rows[0] == 6 and len(calls.rows) <= 3  # one batched call a turn, for every live episode
    assert isinstance(FeedbackEnvironment(task), Environment)
    for row in rows:
        roles = [t["role"] for t in row.turns]
        assert roles[::2] == ["assistant"] * len(roles[::2]) and set(roles[1::2]) <= {"user"}
        assert len(row.action_mask) == len(row.response_tokens) == len(row.behavior_logprobs)
        environment = tokenizer.decode([t for t, m in zip(row.response_tokens, row.action_mask) if not m])
        assert environment == "\nuser: That is not right. Try again.\nassistant: " * roles.count("user")
        assert row.finish in ("done", "max_turns") and (row.finish == "done") == row.passed
        assert all(lp == 0.0 for lp, m in zip(row.behavior_logprobs, row.action_mask) if not m)
    assert any(len(r.turns) == 5 for r in rows)  # a random policy fails: three tries, feedback between them


def test_episodes_on_a_prefix_session_draw_what_whole_prefills_draw(setting):
    """The static backend's turns continue from the last turn's keys and values (`prefix_session`); the hf
    backend prefills each conversation whole: for one seed they draw the same episodes."""
    from dataclasses import replace

    from softrl.models.generation import StaticCacheGenerator

    spec, contexts, tokenizer, task = setting
    static = StaticCacheGenerator(spec.generator.model, tokenizer, compile=False)
    prefills = []
    forward = static.model.forward

    def counted(*args, input_ids=None, **kwargs):
        if input_ids is not None and input_ids.shape[1] > 1:
            prefills.append(input_ids.shape[1])
        return forward(*args, input_ids=input_ids, **kwargs)

    kwargs = dict(contexts=contexts, k=3, seed=4, limits=EpisodeLimits(max_turns=3), tokenizer=tokenizer)
    whole = episodes(spec, FeedbackEnvironment(task), **kwargs)
    static.model.forward = counted
    try:
        resumed = episodes(replace(spec, generator=static), FeedbackEnvironment(task), **kwargs)
    finally:
        static.model.forward = forward
    assert [r.response_tokens for r in resumed] == [r.response_tokens for r in whole]
    assert [r.finish for r in resumed] == [r.finish for r in whole]
    for a, b in zip(resumed, whole):
        assert max(abs(x - y) for x, y in zip(a.behavior_logprobs, b.behavior_logprobs)) < 1e-4
    assert any(len(r.turns) == 5 for r in resumed)
    # turns 2 and 3 prefill the feedback ("\nuser: ... assistant: "), not the prompt and the turns before it
    feedback = len(tokenizer("\nuser: That is not right. Try again.\nassistant: ", add_special_tokens=False)["input_ids"])
    shortest_whole = min(len(c.prompt_tokens) for c in contexts) + 1 + feedback  # a turn of one token at least
    assert len(prefills) == 3 and max(prefills[1:]) <= feedback + 1 < shortest_whole


def test_a_faulty_environment_ends_its_own_episode_with_the_reason(setting):
    spec, contexts, tokenizer, task = setting

    class Faulty:
        deterministic = True

        def __init__(self, how):
            self.how = how

        def is_completed(self, messages, state):
            return False

        def env_response(self, messages, state):
            if state["prompt_id"] != contexts[0].prompt.id:
                return [{"role": "tool", "content": "fine"}], state
            if self.how == "raises":
                raise RuntimeError("the sandbox is gone")
            if self.how == "hangs":
                time.sleep(5)
            if self.how == "floods":
                return [{"role": "tool", "content": "x" * 100_000}], state
            if self.how == "a text":
                return "just text", state
            if self.how == "no pair":
                return [{"role": "user", "content": "x"}]
            return [{"role": "robot", "content": "?"}], state

    limits = EpisodeLimits(max_turns=2, timeout_s=0.5, max_env_chars=1000)
    for how, said in (("raises", "env_error: RuntimeError: the sandbox is gone"),
                      ("hangs", "timeout: the environment took longer than 0.5 s"),
                      ("floods", "env_error: the environment answered with 100,000 characters, more than 1,000"),
                      ("nonsense", "env_error: the environment answered with"),
                      ("a text", "env_error: the environment answered with 'just text'"),
                      ("no pair", "env_error: env_response returned")):
        rows = episodes(spec, Faulty(how), contexts, 1, seed=0, limits=limits, tokenizer=tokenizer)
        assert rows[0].finish.startswith(said) and len(rows[0].turns) == 1, (how, rows[0].finish)
        assert [r.finish for r in rows[1:]] == ["max_turns", "max_turns"] and len(rows[1].turns) == 3


def test_hung_calls_cost_a_turn_one_timeout_and_a_failed_start_or_reward_ends_only_that_episode(setting):
    """Every episode's environment call is asked at once: three that hang cost the turn one timeout, not
    three. An initial_state or a reward that raises ends its own episode (reward 0), with the reason."""
    spec, contexts, tokenizer, task = setting

    class Hangs:
        deterministic = True

        def is_completed(self, messages, state):
            time.sleep(30)

        def env_response(self, messages, state):
            return [], state

    started = time.monotonic()
    rows = episodes(spec, Hangs(), contexts, 1, seed=0, limits=EpisodeLimits(max_turns=2, timeout_s=1.0),
                    tokenizer=tokenizer)
    assert time.monotonic() - started < 8 and all(r.finish.startswith("timeout") for r in rows)

    class Fragile:
        deterministic = True

        def initial_state(self, prompt):
            if prompt.id == contexts[0].prompt.id:
                raise KeyError("no such board")
            return {"id": prompt.id}

        def is_completed(self, messages, state):
            return True

        def env_response(self, messages, state):
            return [], state

        def reward(self, messages, state):
            if state["id"] == contexts[1].prompt.id:
                raise ValueError("scorer down")
            return 0.5

    rows = episodes(spec, Fragile(), contexts, 1, seed=0, limits=EpisodeLimits(max_turns=2), tokenizer=tokenizer)
    assert rows[0].finish.startswith("env_error: KeyError") and len(rows[0].turns) == 1
    assert rows[1].finish == "env_error: reward: ValueError: scorer down" and rows[1].reward == 0.0
    assert rows[2].finish == "done" and rows[2].reward == 0.5


def test_an_ended_episodes_reward_is_asked_for_while_the_others_go_on(setting):
    """The first prompt's episodes end at turn 1; their reward is asked for then, on a thread of its own,
    not after the other episodes' last turn: the others' environment, at turn 2, sees it was asked."""
    import threading

    spec, contexts, tokenizer, task = setting
    asked, seen = threading.Event(), []

    class EarlyAndLate:
        deterministic = True

        def initial_state(self, prompt):
            return {"id": prompt.id}

        def is_completed(self, messages, state):
            return state["id"] == contexts[0].prompt.id

        def env_response(self, messages, state):
            if len(messages) > 3:  # the second environment turn: the reward had all of turn 2 to be asked
                seen.append(asked.wait(timeout=5))
            return [{"role": "user", "content": "again"}], state

        def reward(self, messages, state):
            if state["id"] == contexts[0].prompt.id:
                asked.set()
            return 0.25

    rows = episodes(spec, EarlyAndLate(), contexts, 2, seed=0, limits=EpisodeLimits(max_turns=3), tokenizer=tokenizer)
    assert [r.finish for r in rows] == ["done"] * 2 + ["max_turns"] * 4 and {r.reward for r in rows} == {0.25}
    assert seen and all(seen)


def test_an_async_environment_is_awaited(setting):
    spec, contexts, tokenizer, task = setting

    class Async:
        deterministic = True

        async def is_completed(self, messages, state):
            return len(messages) > 3

        async def env_response(self, messages, state):
            return [{"role": "user", "content": "again"}], state

    rows = episodes(spec, Async(), contexts[:1], 1, seed=0, limits=EpisodeLimits(max_turns=5), tokenizer=tokenizer)
    assert [t["role"] for t in rows[0].turns] == ["assistant", "user", "assistant"] and rows[0].finish == "done"


def test_episodes_store_export_as_chat_reimport_and_train_spo_offline(setting, tiny, tmp_path):
    """The issue's first 'done when', through the library: episodes with two or more policy turns and the
    environment's between them go to the store, export as chat messages, import again as text and train
    SPO offline-only."""
    import subprocess
    import sys

    from softrl.config import load_config
    from softrl.runtime.local import train

    spec, contexts, tokenizer, task = setting
    rows = episodes(spec, FeedbackEnvironment(task), contexts, 2, seed=1, limits=EpisodeLimits(max_turns=3),
                    tokenizer=tokenizer)
    ExperienceStore(tmp_path / "online").append(rows)
    out = tmp_path / "episodes.jsonl"
    run = [sys.executable, "-m", "softrl", "data"]
    assert subprocess.run([*run, "export", str(out), "--format", "chat", "--store", str(tmp_path / "online")],
                          capture_output=True).returncode == 0
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    long = [r for r in exported if sum(m["role"] == "assistant" for m in r["messages"]) >= 2]
    assert long and all(r["messages"][2]["role"] == "user" for r in long)
    proc = subprocess.run([*run, "import", str(out), "--source", "episodes", "--store", str(tmp_path / "store")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    overrides = {"out_dir": tmp_path, "name": "spo", "data.store": f"{tmp_path}/store", "model.path": tiny[0],
                 "task.size": 3, "task.eval_size": 2, "q0.k": 2, "sampling.prompts_per_step": 2,
                 "sampling.samples_per_prompt": 2, "sampling.max_new_tokens": 6, "optim.steps": 2, "eval.samples": 2,
                 "data.offline_sources": "[episodes]", "data.offline_passed_only": "false", "data.mix": "{offline: 1}"}
    summary = train(load_config(None, [f"{k}={v}" for k, v in overrides.items()]), log=lambda m: None)
    assert summary["steps"] == 2


class CoinFlip:
    """A stochastic environment for the warning: a user who answers at random."""

    deterministic = False

    def is_completed(self, messages, state):
        return False

    def env_response(self, messages, state):
        return [{"role": "user", "content": "heads"}], state


def test_softrl_train_rolls_out_episodes_and_warns_of_a_biased_combination(tiny, tmp_path):
    """`task.environment: feedback` makes the run's online rows episodes (sync and async runtimes); a
    stochastic environment with SPO says in one line that the combination is biased; an environment that
    does not load is refused naming task.environment."""
    from softrl.config import ConfigError, load_config
    from softrl.runtime.local import train

    base = {"out_dir": tmp_path, "data.store": f"{tmp_path}/store", "model.path": tiny[0], "task.size": 3,
            "task.eval_size": 2, "q0.k": 2, "sampling.prompts_per_step": 2, "sampling.samples_per_prompt": 2,
            "sampling.max_new_tokens": 5, "optim.steps": 2, "eval.samples": 2, "data.mix": "{online: 1}",
            "task.environment": "feedback", "task.max_turns": 2}
    for mode in ("sync", "async"):
        said = []
        config = load_config(None, [f"{k}={v}" for k, v in {**base, "name": mode, "runtime.mode": mode}.items()])
        assert train(config, log=said.append)["steps"] == 2
        online = ExperienceStore(tmp_path / "store").trajectories(source="online", run_id=mode).to_pylist()
        assert online and all(r["turns"] and r["finish"].split(":")[0] in ("done", "max_turns") for r in online)
        assert any(len(r["turns"]) == 3 for r in online) and not any("biased" in m for m in said)
        assert not [m for m in said if m.startswith("warning")]
    # Q0 from episodes of the reference (up to task.max_turns), kept apart from single-response Q0
    q0 = ExperienceStore(tmp_path / "store").prompts()
    assert q0 and all(row["meta"] == {"episodes": 2} for row in q0.values())
    reference = ExperienceStore(tmp_path / "store").trajectories(source="reference").to_pylist()
    assert reference and all(r["turns"] for r in reference)
    said = []
    stochastic = {**base, "name": "coin", "task.environment": "test_multi_turn_rollouts:CoinFlip"}
    train(load_config(None, [f"{k}={v}" for k, v in stochastic.items()]), log=said.append)
    assert [m for m in said if m.startswith("warning: spo with a stochastic environment")]
    with pytest.raises(ConfigError, match="task.environment: 'nowhere:Env' does not load"):
        train(load_config(None, [f"{k}={v}" for k, v in {**base, "name": "x", "task.environment": "nowhere:Env"}.items()]),
              log=lambda m: None)


def test_a_ray_run_rolls_out_episodes_in_its_workers(tiny, tmp_path):
    """The Ray runtime's workers make the environment themselves and write episodes to the store."""
    pytest.importorskip("ray")
    from softrl.config import load_config
    from softrl.runtime import ray_runtime

    overrides = {"out_dir": tmp_path, "name": "ray", "data.store": f"{tmp_path}/store", "model.path": tiny[0],
                 "task.size": 3, "task.eval_size": 2, "q0.k": 2, "sampling.prompts_per_step": 2,
                 "sampling.samples_per_prompt": 2, "sampling.max_new_tokens": 5, "optim.steps": 2, "eval.samples": 2,
                 "data.mix": "{online: 1}", "task.environment": "feedback", "task.max_turns": 2,
                 "runtime.kind": "ray", "runtime.workers": 2}
    summary = ray_runtime.train(load_config(None, [f"{k}={v}" for k, v in overrides.items()]), log=lambda m: None)
    assert summary["steps"] == 2
    online = ExperienceStore(tmp_path / "store").trajectories(source="online", run_id="ray").to_pylist()
    assert online and all(r["turns"] and r["action_mask"] and len(r["action_mask"]) == len(r["response_tokens"])
                          for r in online)
    assert any(len(r["turns"]) == 3 for r in online)  # a try, the feedback, another try


def test_episode_limits_refuse_an_episode_of_no_turn():
    """max_turns 0 is refused where the limits are made, in one line naming it, not later as a StopIteration
    from grading an episode that has no policy turn."""
    with pytest.raises(ValueError, match="max_turns must be at least 1, got max_turns=0"):
        EpisodeLimits(max_turns=0)
