"""Episodes in the data (issue 50, part 1): a trajectory may be a conversation of policy and environment
turns; OpenAI chat traces (tool calls and results, no log-probs) import, export and round-trip; an
episode is tokenised with the environment's tokens masked, and trains offline."""

import json
import subprocess
import sys

import lance
import pyarrow as pa
import pytest

from softrl.data import ExperienceStore, Trajectory
from softrl.data.chat import episode_of
from softrl.data.io import read_trajectories
from softrl.data.schema import TRAJECTORY_SCHEMA
from softrl.tasks.records import RecordError

CALL = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "3*8"}'}}


def conversation(prompt="Make 24 from 3 8", answer="3*8"):
    """A logged tool-using conversation: the assistant calls a calculator, reads its result, answers."""
    return [{"role": "system", "content": "You may call calc."}, {"role": "user", "content": prompt},
            {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "24"},
            {"role": "assistant", "content": answer}]


def softrl(*args):
    return subprocess.run([sys.executable, "-m", "softrl", *args], capture_output=True, text=True, timeout=300)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("messages, message", [
    ([], "non-empty list of chat messages"),
    ([{"role": "assistant", "content": "hi"}], "message 0 (assistant) comes before any system or user message"),
    ([{"role": "user", "content": "q"}], "no assistant message"),
    ([{"role": "user", "content": "q"}, {"role": "robot", "content": "x"}], "message 1 has role 'robot'"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "tool", "tool_call_id": "c9",
                                                                            "content": "r"}],
     "message 2 (tool) answers tool_call_id 'c9', which the assistant message before it did not make (its calls: "
     "none open)"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {**CALL, "function": {"name": "calc", "arguments": "{expr: 3}"}}]}],
     "message 1, tool call 0 (calc): arguments are not JSON"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "system", "content": "s"}],
     "message 2: a system message after the conversation started"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": [{"function": {
        "name": "calc", "arguments": "{}"}}]}], "needs an 'id' text"),
])
def test_a_chat_trace_that_is_not_an_episode_is_one_line_naming_the_message(messages, message):
    with pytest.raises(RecordError, match="^t.jsonl:1: ") as caught:
        episode_of(messages, "t.jsonl:1")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_tool_using_trace_is_an_episode_and_a_plain_one_a_single_turn_row(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"messages": conversation(), "reward": 1.0},
                                             {"messages": conversation()[1:2] + [{"role": "assistant", "content": "4"}],
                                              "reward": 0.5}])
    episode, plain = read_trajectories(path, "logs")
    assert [t["role"] for t in episode.turns] == ["assistant", "tool", "assistant"]
    assert json.loads(episode.turns[0]["tool_calls"]) == [CALL] and episode.turns[1]["name"] == "calc"
    assert json.loads(episode.prompt_text)["messages"][0]["role"] == "system" and episode.passed
    assert plain.turns is None and plain.response_text == "4" and plain.prompt_text == "Make 24 from 3 8"
    assert not plain.passed and episode.source == plain.source == "logs"
    other = read_trajectories(write_jsonl(tmp_path / "u.jsonl", [{"messages": conversation(answer="8*3"),
                                                                  "reward": 1.0}]), "logs")[0]
    assert other.id != episode.id  # an episode's id is its turns'


def test_a_bad_trace_file_is_one_line_and_writes_nothing(tmp_path):
    bad = write_jsonl(tmp_path / "t.jsonl", [{"messages": conversation(), "reward": 1.0},
                                            {"messages": conversation()[:3], "reward": 1.0},
                                            {"messages": conversation()}])
    proc = softrl("data", "import", str(bad), "--source", "logs", "--store", str(tmp_path / "store"))
    assert proc.returncode != 0 and proc.stderr.strip().splitlines()[-1].endswith(
        "t.jsonl:3: record needs a 'reward' (in [0, 1]) or a 'passed' field")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "store").exists() or len(ExperienceStore(tmp_path / "store")) == 0


def test_export_as_chat_and_import_again_round_trip(tmp_path):
    """export --format chat -> import -> export: the same conversations, rewards, prompt ids and tasks;
    a single-turn row exports as its prompt and one assistant message."""
    records = [{"messages": conversation(), "reward": 1.0, "prompt_id": "p1", "task": "countdown"},
               {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "reward": 1.0}]
    first = tmp_path / "first.jsonl"
    for store, source, out in (("a", write_jsonl(tmp_path / "in.jsonl", records), first),
                               ("b", first, tmp_path / "second.jsonl")):
        assert softrl("data", "import", str(source), "--source", "logs", "--store", str(tmp_path / store)).returncode == 0
        proc = softrl("data", "export", str(out), "--format", "chat", "--store", str(tmp_path / store))
        assert proc.returncode == 0, proc.stderr
    assert first.read_text() == (tmp_path / "second.jsonl").read_text()
    exported = [json.loads(line) for line in first.read_text().splitlines()]
    assert exported[0]["messages"] == [m | ({"name": "calc"} if m["role"] == "tool" else {}) for m in conversation()]
    assert exported[0]["prompt_id"] == "p1" and exported[0]["task"] == "countdown" and exported[0]["reward"] == 1.0
    assert exported[1]["messages"] == records[1]["messages"]
    proc = softrl("data", "export", str(tmp_path / "x.parquet"), "--format", "chat", "--store", str(tmp_path / "a"))
    assert proc.returncode != 0 and "use a .jsonl or .jsonl.gz file name" in proc.stderr


def test_an_episode_is_tokenised_with_the_environment_masked(tiny):
    """Without a chat template, and with one: the policy's tokens are its turns (with their end), the
    environment's (the tool result and the cue of the next turn) are masked, and the whole decodes to
    the conversation."""
    from softrl.models.loading import encode_episode

    _, _, tokenizer = tiny
    turns = read_trajectories_from(conversation())
    prompt, response, mask = encode_episode(tokenizer, "Make 24 from 3 8", turns)
    policy = tokenizer.decode([t for t, m in zip(response, mask) if m])
    environment = tokenizer.decode([t for t, m in zip(response, mask) if not m])
    assert tokenizer.decode(prompt) == "Make 24 from 3 8"
    assert policy == 'Checking.\n<tool_call>{"name": "calc", "arguments": {"expr": "3*8"}}</tool_call><eos>3*8<eos>'
    assert environment == "\ntool: 24\nassistant: " and len(mask) == len(response)

    templated = type(tokenizer).from_pretrained(tiny[0])
    templated.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                               "{% if m.get('tool_calls') %}{{ m['tool_calls'][0]['function']['name'] }}{% endif %}"
                               "</{{ m['role'] }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    prompt, response, mask = encode_episode(templated, "Make 24 from 3 8", turns)
    assert templated.decode(prompt) == "<user>Make 24 from 3 8</user><assistant>"
    assert templated.decode([t for t, m in zip(response, mask) if m]) == "Checking.calc</assistant>3*8</assistant>"
    assert templated.decode([t for t, m in zip(response, mask) if not m]) == "<tool>24</tool><assistant>"


def read_trajectories_from(messages):
    return episode_of(messages, "test")[1]


def test_a_store_of_the_previous_format_opens_and_keeps_its_versions(tmp_path):
    """A store written before episodes (format 2) gains the new columns, null, on first open; its old
    versions still read, with the new columns null; episodes append after."""
    old = pa.schema([f for f in TRAJECTORY_SCHEMA if f.name not in ("turns", "action_mask", "finish")]) \
        .with_metadata({"softrl.store_format": "2"})
    row = {k: v for k, v in Trajectory("p", "x", 1.0, True, task="t").to_row().items() if k in old.names}
    lance.write_dataset(pa.Table.from_pylist([row], schema=old), str(tmp_path / "trajectories.lance"), schema=old)
    store = ExperienceStore(tmp_path)
    table = store.tables["trajectories"]
    assert store.trajectories().to_pylist()[0]["turns"] is None and table.read(1)["finish"].to_pylist() == [None]
    store.append([Trajectory("p", "", 1.0, True, turns=read_trajectories_from(conversation()), prompt_text="q")])
    assert [r["turns"] is None for r in store.trajectories().to_pylist()] == [True, False]
    assert lance.dataset(str(tmp_path / "trajectories.lance")).schema.metadata[b"softrl.store_format"] == b"3"
    assert ExperienceStore(tmp_path).tables["trajectories"].latest() == table.latest()  # upgraded once


def countdown_traces(size=6):
    """A logged trace per countdown prompt: the assistant calls a calculator on a known solution, reads
    the value, then answers with it (reward 1)."""
    from softrl.tasks.registry import load_task

    task = load_task("countdown", size=size)
    records = []
    for prompt in task.prompts():
        solution = task.reference_solutions(prompt)[0]
        call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": json.dumps({"expr": solution})}}
        records.append({"prompt_id": prompt.id, "task": "countdown", "reward": 1.0, "messages": [
            {"role": "user", "content": prompt.text}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}, {"role": "assistant", "content": solution}]})
    return records


def test_spo_trains_offline_on_logged_tool_traces_with_the_environment_masked(tiny, tmp_path):
    """Traces with tool calls and no log-probs import and train SPO offline-only; in the batch, the
    environment's tokens are masked (the learner multiplies its loss mask by this one); an objective that
    weighs rows by pi/mu refuses them, saying why."""
    from softrl.config import ConfigError, load_config
    from softrl.runtime.local import train

    traces = write_jsonl(tmp_path / "traces.jsonl", countdown_traces())
    proc = softrl("data", "import", str(traces), "--source", "logs", "--store", str(tmp_path / "store"))
    assert proc.returncode == 0, proc.stderr
    overrides = {"out_dir": tmp_path, "name": "spo", "data.store": f"{tmp_path}/store", "model.path": tiny[0],
                 "task.size": 6, "task.eval_size": 2, "q0.k": 2, "sampling.prompts_per_step": 2,
                 "sampling.samples_per_prompt": 2, "sampling.max_new_tokens": 8, "optim.steps": 2, "eval.samples": 2,
                 "data.offline_sources": "[logs]", "data.mix": "{offline: 1}"}
    config = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
    batches = []
    from softrl.runtime import feed

    real = feed.make_batch
    feed_batch = lambda *a, **k: batches.append(real(*a, **k)) or batches[-1]  # noqa: E731
    try:
        feed.make_batch = feed_batch
        summary = train(config, log=lambda m: None)
    finally:
        feed.make_batch = real
    assert summary["steps"] == 2 and batches
    batch = batches[0]
    row = batch.rows[0]
    assert row["turns"] and row["source"] == "logs"
    tokens = batch.padded.input_ids[0, batch.padded.response_start[0]:][: int(batch.padded.response_len[0])]
    from softrl.models.loading import load_causal_lm

    tokenizer = load_causal_lm(tiny[0])[1]
    masked = tokenizer.decode([t for t, m in zip(tokens.tolist(), batch.action_mask[0].tolist()) if not m])
    assert masked == "\ntool: ok\nassistant: "
    overrides |= {"name": "cispo", "data.objective.algorithm": "cispo"}
    with pytest.raises(ConfigError, match=r"cispo weighs offline rows by pi/mu and none of the \d+ offline rows "
                                          r"has its sampler's log-probs"):
        train(load_config(None, [f"{k}={v}" for k, v in overrides.items()]), log=lambda m: None)


def test_an_interrupted_upgrade_opens_and_an_old_store_opens_without_writing(tmp_path):
    """Lance's add_columns drops the schema metadata, which a second commit restores: a table left between
    the two (every column, no format key) opens; a format-2 store is upgraded at its first write, not
    when it is read (a read-only copy stays readable)."""
    import os
    import stat

    old = pa.schema([f for f in TRAJECTORY_SCHEMA if f.name not in ("turns", "action_mask", "finish")]) \
        .with_metadata({"softrl.store_format": "2"})
    row = {k: v for k, v in Trajectory("p", "x", 1.0, True, task="t").to_row().items() if k in old.names}
    lance.write_dataset(pa.Table.from_pylist([row], schema=old), str(tmp_path / "old" / "trajectories.lance"),
                        schema=old)
    ExperienceStore(tmp_path / "old")  # makes the other two tables
    before = lance.dataset(str(tmp_path / "old" / "trajectories.lance")).latest_version
    for path in (tmp_path / "old").rglob("*"):
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        if os.geteuid() != 0:  # root writes anyway
            assert len(ExperienceStore(tmp_path / "old", create=False)) == 1
    finally:
        for path in (tmp_path / "old").rglob("*"):
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    assert lance.dataset(str(tmp_path / "old" / "trajectories.lance")).latest_version == before
    halfway = TRAJECTORY_SCHEMA  # every column, and the metadata add_columns dropped
    lance.write_dataset(pa.Table.from_pylist([Trajectory("p", "y", 1.0, True).to_row()], schema=halfway),
                        str(tmp_path / "half" / "trajectories.lance"), schema=halfway)
    store = ExperienceStore(tmp_path / "half")
    assert len(store) == 1
    store.append([Trajectory("p", "z", 0.0, False)])
    assert lance.dataset(str(tmp_path / "half" / "trajectories.lance")).schema.metadata[b"softrl.store_format"] == b"3"


def test_an_episode_of_the_run_s_tokens_without_its_mask_is_tokenised_again(tiny):
    """A row with turns and the run's token ids but no action_mask (an edited import) is not taken as all
    the policy's: it is tokenised from its turns, environment masked."""
    from softrl.models.loading import tokenizer_fingerprint
    from softrl.training.batch import make_batch
    from softrl.models.loading import encode_episode, encode_prompt, encode_response

    tok = tiny[2]
    turns = read_trajectories_from(conversation())
    row = Trajectory("p", "t", 1.0, True, prompt_text="q", prompt_tokens=[5, 6], response_tokens=[7, 8, 9],
                     tokenizer=tokenizer_fingerprint(tok), turns=turns).to_row()
    batch = make_batch([row], tokenizer_fingerprint(tok), tok.pad_token_id, lambda t: encode_prompt(tok, t),
                       lambda t: encode_response(tok, t), {"p": 0.0}, lambda p, t: encode_episode(tok, p, t))
    assert batch.action_mask[0].sum() < batch.padded.response_len[0] and batch.padded.response_len[0] > 3