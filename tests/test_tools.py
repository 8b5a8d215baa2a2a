"""Tool calls from the policy's text, and countdown with a calculator (issue 50, part 5): a call written
as the templates render one is read back into `tool_calls`; the calculator answers each call with a
`tool` message (an unknown tool, arguments that are no JSON, a bad expression: one line, the episode
goes on); an episode of a call, its result and an answer is graded on the answer and exports as chat
with `tool_calls` and `tool` messages that import again."""

import json

import pytest

from softrl.models.generation import Sample
from softrl.models.loading import plain_turn
from softrl.rollout import EpisodeLimits, RolloutSpec, contexts_of, episodes
from softrl.tasks.registry import load_task
from softrl.tasks.tools import CalculatorEnvironment, CountdownToolsTask, parse_tool_calls


def test_a_call_as_the_plain_format_renders_it_parses_back():
    calls = [{"id": "call_0_0", "type": "function",
              "function": {"name": "calculate", "arguments": json.dumps({"expression": "(3+5)*3"})}}]
    text = plain_turn({"role": "assistant", "content": "let me check", "tool_calls": json.dumps(calls)}, False)
    assert parse_tool_calls(text, 0) == ("let me check", calls)
    hermes = 'x <tool_call>\n{"name": "calculate", "arguments": {"expression": "2*2"}}\n</tool_call>'
    assert parse_tool_calls(hermes, 3)[1][0]["function"] == {"name": "calculate", "arguments": '{"expression": "2*2"}'}
    assert parse_tool_calls(hermes, 3)[1][0]["id"] == "call_3_0"
    for not_a_call in ("<tool_call>{not json</tool_call>", '<tool_call>{"arguments": {}}</tool_call>', "8*3"):
        assert parse_tool_calls(not_a_call, 0) == (not_a_call, [])  # stays text: the turn is an answer


@pytest.mark.parametrize("name, arguments, said", [
    ("calculate", '{"expression": "(3+5)*3"}', "24"),
    ("calculate", '{"expression": "7/2"}', "7/2"),
    ("calculate", '{"expression": "1/0"}', "error: division by zero"),
    ("calculate", '{"expression": "2^3"}', "error: unexpected character '^'"),
    ("calculate", "{oops", "error: the arguments are not JSON: '{oops'"),
    ("calculate", '{"expr": "1"}', 'error: calculate needs {"expression": TEXT}'),
    ("search", '{"q": "24"}', "error: unknown tool 'search'; the tools are: calculate"),
])
def test_the_calculator_answers_every_call_in_one_line(name, arguments, said):
    assert CalculatorEnvironment.answer(name, arguments) == said


class Scripted:
    """A generator that writes given turns, in order, for every episode."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.turn = tokenizer, texts, 0

    def generate(self, prompts, params):
        text = self.texts[min(self.turn, len(self.texts) - 1)]
        self.turn += 1
        tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return [Sample(i, tokens, text, [-0.5] * len(tokens), 1.0, "eos") for i in range(len(prompts))]


def test_a_tool_episode_is_graded_on_its_answer_and_round_trips_through_chat(tiny, tmp_path):
    from dataclasses import replace

    from softrl.data import ExperienceStore
    from softrl.data.io import chat_trajectory, export

    _, model, tokenizer = tiny
    task = load_task("countdown-tools", size=1, seed=0)
    assert isinstance(task, CountdownToolsTask) and task.prompts()[0].text.endswith("tools: calculate\n")
    prompt = task.prompts()[0]
    solution = task.reference_solutions(prompt)[0]
    call = json.dumps({"name": "calculate", "arguments": {"expression": solution}})
    generator = Scripted(tokenizer, [f"check\n<tool_call>{call}</tool_call>", solution])
    spec = replace(RolloutSpec.for_model(task, model, tokenizer, max_new_tokens=200, backend="hf", source="online"),
                   generator=generator, max_length=0)
    contexts = contexts_of(spec, task.prompts(), lambda t: tokenizer(t, add_special_tokens=False)["input_ids"])
    (row,) = episodes(spec, task.make_environment(), contexts, 1, seed=0, limits=EpisodeLimits(max_turns=3),
                      tokenizer=tokenizer)
    assert [t["role"] for t in row.turns] == ["assistant", "tool", "assistant"] and row.finish == "done"
    first = row.turns[0]
    assert first["content"] == "check" and json.loads(first["tool_calls"])[0]["function"]["name"] == "calculate"
    assert row.turns[1]["tool_call_id"] == "call_0_0" and row.turns[1]["content"] == str(prompt.meta["target"])
    assert row.passed and row.reward == 1.0  # the answer after the call is right
    ExperienceStore(tmp_path / "store").append([row])
    out = tmp_path / "tools.jsonl"
    export(ExperienceStore(tmp_path / "store").trajectories(), out, form="chat")
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert record["messages"][1]["tool_calls"][0]["id"] == record["messages"][2]["tool_call_id"]
    again = chat_trajectory(record, "tools.jsonl:1", "logs", "countdown-tools")
    assert again.turns == row.turns and again.reward == 1.0


def test_the_bootstraps_tool_episodes_call_read_and_answer():
    """countdown-tools' synthetic data: calls whose results are the calculator's, an answer right after a
    call that hit the target, the last turn an answer without a call; the policy's turns trained only."""
    import random

    from softrl.bootstrap import BootstrapConfig, sft_examples, training_row
    from softrl.models.chartok import build_char_tokenizer
    from softrl.tasks.tools import synthetic_episode

    config = BootstrapConfig(task="countdown-tools", train_problems=30, p_correct=0.5)
    examples = sft_examples(config)
    rng = random.Random(0)
    shapes = set()
    for prompt, right, wrong in examples:
        turns = synthetic_episode(prompt, right, wrong, rng, max_turns=3, p_correct=0.5)
        assert turns[-1]["role"] == "assistant" and "tool_calls" not in turns[-1]
        for call_turn, tool in zip(turns[0:-1:2], turns[1:-1:2]):
            call = call_turn["tool_calls"][0]
            assert tool["tool_call_id"] == call["id"]
            assert tool["content"] == CalculatorEnvironment.answer("calculate", call["function"]["arguments"])
        hit = [t["content"] == str(prompt.meta["target"]) for t in turns[1::2]]
        assert not any(hit[:-1])  # a hit ends the calls
        assert len(turns) == 5 or hit == [True]  # an episode of one call stopped because it hit
        if hit[-1]:  # the answer is the expression that hit
            assert turns[-1]["content"] == json.loads(turns[-3]["tool_calls"][0]["function"]["arguments"])["expression"]
        shapes.add(len(turns))
    assert shapes == {3, 5}
    tokenizer = build_char_tokenizer()
    ids, labels = training_row(tokenizer, examples[0], config, random.Random(1))
    trained = tokenizer.decode([t for t, label in zip(ids, labels) if label != -100])
    assert "<tool_call>" in trained and "\ntool: " not in trained and "tools: calculate" not in trained
