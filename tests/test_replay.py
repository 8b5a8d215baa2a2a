"""The `replay` source of data.mix (issue 51, part 4): a run's recent online groups, first in first out,
each reused at most `data.replay.reuse` times, drawn like any other source."""

import pytest

from softrl.data import ReplayBuffer


def rows(step: int, prompts: str, n: int = 2) -> list[dict]:
    return [{"prompt_id": p, "step": step, "i": i, "mix_source": "online"} for p in prompts for i in range(n)]


def test_the_buffer_keeps_whole_groups_first_in_first_out_and_uses_each_at_most_reuse_times():
    buffer = ReplayBuffer(size=8, reuse=2, seed=0)
    assert buffer.draw(4) == []  # empty at first: the step trains on what else it has
    buffer.add(rows(0, "ab"))
    buffer.add(rows(1, "cd"))
    buffer.add(rows(2, "a"))  # 10 rows > 8: step 0's first group (a) leaves
    assert len(buffer) == 8 and [g[0][0]["step"] for g in buffer.groups] == [0, 1, 1, 2]
    drawn = buffer.draw(4)
    assert len(drawn) == 4 and all(r["mix_source"] == "replay" for r in drawn)
    groups = [(r["step"], r["prompt_id"]) for r in drawn[::2]]
    assert all(drawn[2 * i]["prompt_id"] == drawn[2 * i + 1]["prompt_id"] for i in range(2))  # whole groups
    assert len(set(groups)) == 2  # no group twice in one draw
    uses = {}
    for _ in range(10):
        for r in buffer.draw(4)[::2]:
            uses[(r["step"], r["prompt_id"])] = uses.get((r["step"], r["prompt_id"]), 0) + 1
    for g in groups:
        uses[g] = uses.get(g, 0) + 1
    assert set(uses.values()) == {2} and len(uses) == 4 and len(buffer) == 0  # each used twice, then gone


def test_the_buffer_state_round_trips():
    a = ReplayBuffer(size=16, reuse=3, seed=1)
    a.add(rows(0, "abc"))
    a.draw(2)
    b = ReplayBuffer(size=16, reuse=3, seed=9)
    b.load_state_dict(a.state_dict())
    assert b.draw(4) == a.draw(4)
    with pytest.raises(ValueError, match="reuse"):
        ReplayBuffer(size=4, reuse=0)


def test_a_run_replays_its_own_groups_and_resumes_with_its_buffer(tiny, tmp_path):
    import softrl
    from test_api import RECORDS, answered, small

    config = {**small(tiny, tmp_path), "data.mix": {"online": 0.5, "replay": 0.5},
              "data.replay": {"size": 8, "reuse": 1}, "data.objective": {"algorithm": "agro-off"}}
    run = softrl.train(config, dataset=RECORDS, reward=answered, progress=False)
    steps = [m for m in run.metrics if "loss" in m and "step" in m]
    assert "loss/replay" not in steps[0] and "loss/replay" in steps[1]  # the first step has nothing to replay
    resumed = softrl.train({**config, "optim.steps": 3}, dataset=RECORDS, reward=answered, resume=True,
                           progress=False)
    assert "loss/replay" in [m for m in resumed.metrics if "loss" in m][-1]  # the buffer came back


@pytest.mark.parametrize("change, says", [
    ({"data.mix": {"offline": 0.5, "replay": 0.5}}, "no online share"),
    ({"data.mix": {"online": 0.5, "replay": 0.5}, "data.objective": {"algorithm": "ppo"}}, "online rollouts only"),
    ({"data.mix": {"online": 0.5, "replay": 0.5}, "data.replay": {"size": 0}}, "data.replay.size"),
])
def test_replay_is_refused_where_it_cannot_work(change, says):
    from softrl.config import ConfigError, config_from

    with pytest.raises(ConfigError, match=says):
        config_from(change)
