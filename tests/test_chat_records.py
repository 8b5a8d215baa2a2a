"""Chat records in the Python API and imports (issue 52, "Chat data"): every role, ordering and shape is
trained on as meant or refused in one line naming the record and the message."""

import pytest

from softrl.data.io import offline_trajectories
from softrl.tasks.records import RecordError, prompt_of, records_of
from softrl.tasks.reward_functions import RewardFunctionTask, reward_functions

RECORDS = [{"prompt": "1 2 -> 3\n", "answer": 3}]


def task():
    return RewardFunctionTask(reward_functions(lambda prompt, completion, **kw: 1.0), records_of(RECORDS))


CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}


def test_a_conversation_with_tool_calls_in_offline_records_keeps_its_calls_and_turns():
    record = {"messages": [{"role": "user", "content": "1 2 -> 3\n"},
                           {"role": "assistant", "content": "", "tool_calls": [CALL]},
                           {"role": "tool", "tool_call_id": "c1", "content": "3"},
                           {"role": "assistant", "content": "3"}], "reward": 1.0}
    (row,), unknown = offline_trajectories([("r1", record)], task(), "import:x")
    assert unknown == 0 and row.prompt_id == task().prompts()[0].id  # the task's own prompt
    assert [t["role"] for t in row.turns] == ["assistant", "tool", "assistant"]
    assert '"add"' in row.turns[0]["tool_calls"] and row.turns[1]["tool_call_id"] == "c1"


def test_trl_conversational_records_are_read_as_the_conversation_they_are():
    record = {"prompt": [{"role": "user", "content": "1 2 -> 3\n"}], "completion": [{"role": "assistant", "content": "3"}],
              "reward": 0.5}
    (row,), unknown = offline_trajectories([("r1", record)], task(), "import:x")
    assert unknown == 0 and row.response_text == "3" and row.turns is None and row.reward == 0.5
    bad = {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "critic", "content": "3"}], "reward": 1}
    with pytest.raises(RecordError, match="^r2: message 1 has role 'critic'"):
        offline_trajectories([("r2", bad)], task(), "import:x")


@pytest.mark.parametrize("messages, says", [
    ([{"role": "assistant", "content": "3"}], "starts with a assistant message"),
    ([{"role": "narrator", "content": "hi"}], "message 0 has role 'narrator'"),
    ([{"role": "user", "content": "q", "tool_calls": [CALL]}], "has tool_calls, which a prompt cannot carry"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "zz", "content": "x"}],
     "message 1 has role tool, which a prompt cannot carry"),
])
def test_prompt_conversations_that_are_not_one_are_refused_in_one_line(messages, says):
    with pytest.raises(RecordError, match=says) as e:
        prompt_of({"messages": messages}, "data.jsonl:3")
    assert str(e.value).startswith("data.jsonl:3: ") and "\n" not in str(e.value)


def test_an_assistant_only_offline_record_is_refused_not_trained_as_its_own_prompt():
    with pytest.raises(RecordError, match="before any system or user message: the conversation has no prompt"):
        offline_trajectories([("r1", {"messages": [{"role": "assistant", "content": "3"}], "reward": 1})], task(), "x")


def test_offline_rewards_are_mapped_by_the_tasks_declared_range_like_its_online_ones():
    """task.reward_range (-1, 2): an offline reward of 2 is solved (1 in the store), 0.5 is half way, one
    outside the range is refused naming it; the same holds for conversations."""
    declared = RewardFunctionTask(reward_functions(lambda prompt, completion, **kw: 2.0, summed=True),
                                  records_of(RECORDS), reward_range=(-1.0, 2.0))
    online = declared.grade_many([(declared.prompts()[0], "3")])[0]
    records = [("a", {"prompt": "1 2 -> 3\n", "completion": "3", "reward": 2}),
               ("b", {"prompt": "1 2 -> 3\n", "completion": "4", "reward": 0.5}),
               ("c", {"messages": [{"role": "user", "content": "1 2 -> 3\n"}, {"role": "assistant", "content": "5"}],
                      "reward": -1})]
    rows, _ = offline_trajectories(records, declared, "import:x")
    assert [(r.reward, r.passed) for r in rows] == [(1.0, True), (0.5, False), (0.0, False)]
    assert (online.reward, online.passed) == (rows[0].reward, rows[0].passed)  # the online mapping, the same
    with pytest.raises(RecordError, match=r"^d: field 'reward' must be a number in the task's declared range \[-1, 2\]"):
        offline_trajectories([("d", {"prompt": "q", "completion": "x", "reward": 3})], declared, "import:x")
    plain, _ = offline_trajectories([("e", {"prompt": "q", "completion": "x", "reward": 0.25})], task(), "import:x")
    assert plain[0].reward == 0.25  # no declared range: the store's [0, 1] as given


def test_a_conversation_under_the_tasks_prompt_id_gets_that_ids_trajectory_id():
    """The row's id is of its prompt id and response: a conversation given the task's prompt id gets the
    id that export and import again give, so it is never stored twice; `data import --task` maps a
    conversation's prompt to the task's id as it does a text record's."""
    from softrl.data.io import read_trajectories, task_prompt_ids
    from softrl.data.schema import trajectory_id

    record = {"messages": [{"role": "user", "content": "1 2 -> 3\n"}, {"role": "assistant", "content": "3"},
                           {"role": "user", "content": "again"}, {"role": "assistant", "content": "3!"}], "reward": 1}
    (row,), _ = offline_trajectories([("r1", record)], task(), "x")
    assert row.prompt_id == task().prompts()[0].id
    assert row.id == trajectory_id(row.prompt_id, row.response_tokens, row.tokenizer, row.response_text, row.turns)
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write(json.dumps(record) + "\n")
    (read,) = read_trajectories(f.name, "x", task().name, task_prompt_ids(task()))
    assert read.prompt_id == row.prompt_id and read.id == row.id


def test_a_chat_record_of_the_tasks_chat_prompt_is_that_prompt():
    """A dataset keeps a prompt of one user message as a conversation, a chat import as its text: an
    offline conversation of the task's chat prompt was refused as none of the task's prompts. It gets
    the task's prompt id and text, as a text prompt does."""
    chat = RewardFunctionTask(reward_functions(lambda prompt, completion, **kw: 1.0),
                              records_of([{"prompt": [{"role": "user", "content": "q1"}], "answer": 1}]))
    (prompt,) = chat.prompts()
    conversation = {"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "1"}], "reward": 1}
    pair = {"prompt": [{"role": "user", "content": "q1"}], "completion": "1", "reward": 1}
    rows, unknown = offline_trajectories([("r1", conversation), ("r2", pair)], chat, "import:x")
    assert unknown == 0 and [(r.prompt_id, r.prompt_text) for r in rows] == [(prompt.id, prompt.text)] * 2


@pytest.mark.parametrize("empty", [[{"role": "user", "content": ""}], [{"role": "system", "content": ""},
                                                                         {"role": "user", "content": ""}]])
def test_a_conversation_with_an_empty_prompt_is_refused_as_an_empty_prompt_field_is(empty):
    record = {"messages": [*empty, {"role": "assistant", "content": "1"}], "reward": 1}
    with pytest.raises(RecordError, match="^r1: the conversation's system and user messages are empty"):
        offline_trajectories([("r1", record)], task(), "import:x")
