"""A real environment package rolls out through softrl's endpoint (issue 50, part 4): verifiers 0.4
(the `agents` extra) runs a multi-turn task whose agent, verifiers' own chat loop in a subprocess, calls
the policy at the endpoint's base_url through verifiers' interception server; the task plays the user
between turns and scores the trace. The conversation comes back as one episode row with the tokens and
log-probs the endpoint sampled, goes to the store, and SPO trains on it offline.

Offline only: verifiers' subprocess runtime installs `uv` and resolves the harness script's packages
from PyPI before it runs it; here the script runs with this interpreter, which has them all (they are
verifiers' own dependencies). That is the one thing patched; the rest is verifiers as shipped."""

import asyncio
import hashlib
import sys

import pytest

vf = pytest.importorskip("verifiers.v1", reason="the agents extra (pip install 'softrl[agents]') is not installed")

from softrl.data import ExperienceStore  # noqa: E402
from softrl.endpoint import ChatEndpoint  # noqa: E402
from softrl.models.generation import make_generator  # noqa: E402
from softrl.tasks.registry import load_task  # noqa: E402


class Countdown(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    """A countdown prompt; the reward: the last reply has a digit (a random tiny policy now and then)."""

    @vf.reward
    async def reached(self, trace) -> float:
        return float(any(c.isdigit() for c in trace.last_reply))


@pytest.fixture
def offline_harness(tmp_path, monkeypatch):
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    async def with_this_python(self, script, env=None, *, activate=True):
        path = f"{tmp_path}/{hashlib.sha256(script.encode()).hexdigest()}.py"
        await self.write(path, script.encode())
        return [sys.executable, path]

    monkeypatch.setattr(SubprocessRuntime, "prepare_uv_script", with_this_python)
    monkeypatch.setattr("verifiers.v1.runtimes.subprocess.CACHE_DIR", tmp_path)


def test_a_verifiers_task_rolls_out_through_the_endpoint_and_trains_spo(tiny, tmp_path, offline_harness):
    from softrl.config import load_config
    from softrl.runtime.local import train

    directory, model, tokenizer = tiny
    with ChatEndpoint(make_generator(model, tokenizer, "hf"), tokenizer, "tiny", max_new_tokens=12) as endpoint:
        agent = vf.Agent(vf.AgentConfig(
            model="tiny", harness={"id": "null"}, runtime=vf.SubprocessConfig(), max_turns=3,
            client=vf.EvalClientConfig(base_url=endpoint.base_url, api_key_var="SOFTRL_TEST_KEY"),
            sampling=vf.SamplingConfig(temperature=1.0, max_tokens=12)))
        prompt = load_task("countdown", size=2).prompts()[0]  # a prompt of the run that trains on the row
        task = Countdown(vf.TaskData(prompt=prompt.text, timeout=vf.TaskTimeout(agent=120)))

        async def episode():
            async with agent.interaction(task) as interaction:  # the task plays the user between turns
                segment = await interaction.turn()
                for feedback in ["Not yet. Try again.", "Still not. Once more."]:
                    if segment.terminated:
                        break
                    segment = await interaction.turn(feedback)
            return interaction.trace  # scored when the interaction closes

        trace = asyncio.run(episode())
        assert trace.ok, trace.errors
        assert list(endpoint.sessions) == [trace.id]  # every turn of the rollout under its trace's id
        row = endpoint.trajectory(trace.id, reward=trace.reward, task="countdown", prompt_id=prompt.id,
                                  source="verifiers")
    assert [t["role"] for t in row.turns] == ["assistant", "user", "assistant", "user", "assistant"]
    assert [t["content"] for t in row.turns[::2]] == [m.content for m in trace.messages if m.role == "assistant"]
    assert row.turns[1]["content"] == "Not yet. Try again." and row.reward == trace.reward
    calls = endpoint.sessions[trace.id]
    eos = tokenizer.eos_token_id
    # a reply's text gives its tokens back unless the policy sampled a token that decodes to nothing (a
    # random tiny model samples special ones): then the row is text, which each run tokenises itself
    round_trip = all(tokenizer(c.text, add_special_tokens=False)["input_ids"] == [t for t in c.tokens if t != eos][:]
                     and eos not in c.tokens[:-1] for c in calls)
    if round_trip:
        policy = [t for t, m in zip(row.response_tokens, row.action_mask) if m]
        assert policy == [t for c in calls for t in c.tokens]  # what the endpoint sampled
    else:
        assert row.response_tokens is None and row.behavior_logprobs is None and row.policy_version == -1
    ExperienceStore(tmp_path / "store").append([row])
    overrides = {"out_dir": tmp_path, "name": "spo", "data.store": f"{tmp_path}/store", "model.path": directory,
                 "task.size": 2, "task.eval_size": 2, "q0.k": 2, "sampling.prompts_per_step": 1,
                 "sampling.samples_per_prompt": 2, "sampling.max_new_tokens": 6, "optim.steps": 2, "eval.samples": 2,
                 "data.offline_sources": "[verifiers]", "data.offline_passed_only": "false", "data.mix": "{offline: 1}"}
    assert train(load_config(None, [f"{k}={v}" for k, v in overrides.items()]), log=lambda m: None)["steps"] == 2
