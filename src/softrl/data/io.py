"""Getting trajectories into and out of the store: prompt/response/reward records (JSONL, JSON,
Parquet), rows exported by `softrl data export`, and a task's known solutions."""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
from dataclasses import replace
from datetime import datetime
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from softrl.data.chat import chat_record, episode_of, prompt_text_of, single_turn, transcript, turn_message
from softrl.data.schema import FINISHES, TRAJECTORY_SCHEMA, Trajectory
from softrl.files import whole_file
from softrl.tasks.base import RewardError, Task, check_reward, prompt_id_of
from softrl.tasks.records import RecordError, field, prompt_key, prompt_of, read_records


def _reward(value: Any, where: str) -> float:
    try:
        return check_reward(value, where, "field 'reward'")
    except RewardError as e:
        raise RecordError(str(e)) from None


Vocabulary = tuple[str, int]  # (tokenizer fingerprint, the model's number of token ids)


def record_to_trajectory(record: dict[str, Any], where: str, source: str | None, task: str,
                         prompt_ids: dict[str, tuple[str, str]] | None = None,
                         vocabulary: Vocabulary | None = None) -> Trajectory:
    """An exported store row (it has `response_text`) or a `{prompt (a text or chat messages),
    response (or completion), reward[, passed, prompt_id, task]}` record. `prompt_ids`: the prompts
    of `task` (`task_prompt_ids`): a record of it that gives no prompt id and whose prompt is one of
    them gets that prompt's id and text. `vocabulary`: a row's token ids under this tokenizer must
    be below the number of ids."""
    if "response_text" in record:
        known = {f.name for f in TRAJECTORY_SCHEMA}
        row = {k: v for k, v in record.items() if k in known}
        field(row, "prompt_id", where)
        row.pop("id", None)  # recomputed from the content, so an edited row cannot keep a stale id
        if isinstance(row.get("created_at"), str):  # from JSONL
            try:
                row["created_at"] = datetime.fromisoformat(row["created_at"])
            except ValueError as e:
                raise RecordError(f"{where}: field 'created_at' is not an ISO date ({e})") from None
        row["reward"] = _reward(row.get("reward", 0.0), where)
        _check_types(row, where)
        _check_values(row, where, vocabulary)
        trajectory = Trajectory.from_row({"reward": 0.0, "passed": False, **row})
        if source:
            trajectory.source = source
        return trajectory
    conversation = chat_form(record, where)
    if conversation is not None:
        row = chat_trajectory(conversation, where, source, task)
        named = field(record, "prompt_id", where, str, "")  # a record that names none, of a prompt of the task
        if not named and row.task == task and prompt_key(row.prompt_text) in (prompt_ids or {}):
            prompt_id, text = prompt_ids[prompt_key(row.prompt_text)]
            row = with_prompt_id(replace(row, prompt_text=text), prompt_id)
        return row
    if "response" not in record and "completion" in record:  # TRL's name for it
        record = {**record, "response": record["completion"]}
    prompt, response = prompt_of(record, where)[0], field(record, "response", where)  # a text or chat messages
    reward, passed = outcome(record, where)
    if not prompt:
        raise RecordError(f"{where}: field 'prompt' must be a non-empty text (a model needs at least one prompt token)")
    prompt_id, named = field(record, "prompt_id", where, str, ""), field(record, "task", where, str, "") or task
    if not prompt_id and named == task and prompt_key(prompt) in (prompt_ids or {}):
        prompt_id, prompt = prompt_ids[prompt_key(prompt)]
    return Trajectory(prompt_id or prompt_id_of(prompt), response, reward, passed, task=named, prompt_text=prompt,
                      source=source or "import", policy_version=-1)


def outcome(record: dict[str, Any], where: str) -> tuple[float, bool]:
    """(reward, passed) of a record: `reward` in [0, 1] and/or `passed` (true or false); passed, where not
    given, is a reward of 1."""
    if "reward" not in record and "passed" not in record:
        raise RecordError(f"{where}: record needs a 'reward' (in [0, 1]) or a 'passed' field")
    passed = record.get("passed")
    if passed is not None and not isinstance(passed, bool):
        raise RecordError(f"{where}: field 'passed' must be true or false, got {passed!r}")
    reward = _reward(record.get("reward", float(bool(passed))), where)
    return reward, passed if passed is not None else reward >= 1


def chat_trajectory(record: dict[str, Any], where: str, source: str | None, task: str) -> Trajectory:
    """A `{messages, reward or passed[, prompt_id, task, finish]}` record: an OpenAI chat conversation with
    its outcome (data/chat.py). One assistant message without tool calls is a single-turn row; anything
    more an episode, tokenised by each run with its own model's chat template (the environment's turns
    masked)."""
    prompt, turns = episode_of(record["messages"], where)
    reward, passed = outcome(record, where)
    finish = field(record, "finish", where, str, "") or None
    if finish is not None and finish.split(":")[0] not in FINISHES:
        raise RecordError(f"{where}: field 'finish' must be one of {', '.join(FINISHES)} (then ': why', where "
                          f"given), got {finish!r}")
    text = prompt_text_of(prompt)
    one = single_turn(turns)
    return Trajectory(field(record, "prompt_id", where, str, "") or prompt_id_of(text),
                      turns[0]["content"] if one else transcript(turns), reward, passed,
                      task=field(record, "task", where, str, "") or task, prompt_text=text, source=source or "import",
                      policy_version=-1, turns=None if one else turns, finish=None if one else finish)


def in_unit_range(record: dict[str, Any], where: str, declared: tuple[float, float] | None) -> dict[str, Any]:
    """The record with its `reward` mapped from the task's declared range (task.reward_range) to the
    store's [0, 1], as the same run's online rewards are (`passed`, where not given: the range's top);
    a reward outside the range is refused naming it. Without a declared range, as given."""
    if declared is None or "reward" not in record:
        return record
    low, high = declared
    value = record["reward"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RecordError(f"{where}: field 'reward' must be a number in the task's declared range [{low:g}, {high:g}] "
                          f"(task.reward_range), got {value!r}")
    return {"passed": value >= high, **record, "reward": (value - low) / (high - low)}


def with_prompt_id(row: Trajectory, prompt_id: str | None) -> Trajectory:
    """`row` under `prompt_id` (where given), its id made again: an id is of the prompt id and response."""
    return replace(row, prompt_id=prompt_id, id="") if prompt_id and prompt_id != row.prompt_id else row


def chat_form(record: dict[str, Any], where: str) -> dict[str, Any] | None:
    """A record that is a conversation, as a `{messages, ...}` chat record: one with `messages` and no
    prompt/response fields, or TRL's conversational form (`prompt` and `completion` both message lists);
    None for a prompt/response record."""
    if "messages" in record and not {"prompt", "response", "completion"} & set(record):
        return record
    completion = record.get("completion", record.get("response"))
    if isinstance(completion, list):
        prompt = record.get("prompt")
        prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not isinstance(prompt, list):
            raise RecordError(f"{where}: field 'prompt' must be a text or a list of chat messages, got "
                              f"{type(prompt).__name__}")
        rest = {k: v for k, v in record.items() if k not in ("prompt", "completion", "response")}
        return {**rest, "messages": [*prompt, *completion]}
    return None


def task_prompt_ids(task: Task) -> dict[str, tuple[str, str]]:
    """A task's prompts by `prompt_key` -> (its prompt id, its text), the first of prompts with the same key."""
    ids: dict[str, tuple[str, str]] = {}
    for p in task.prompts():
        ids.setdefault(prompt_key(p.text), (p.id, p.text))
    return ids


def _check_types(row: dict[str, Any], where: str) -> None:
    """Each field of an exported row converts to its column's type, so no bad row reaches a store."""
    for name, value in row.items():
        wanted = TRAJECTORY_SCHEMA.field(name).type
        try:
            converted = pa.array([value], type=wanted).to_pylist()[0]
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
            raise RecordError(f"{where}: field {name!r} must be {wanted}, got {type(value).__name__} "
                              f"({str(e).splitlines()[0]})") from None
        integral = pa.types.is_integer(wanted) or (pa.types.is_list(wanted) and pa.types.is_integer(wanted.value_type))
        if integral and converted != value:  # Arrow truncates 1.5 to 1 without a word
            raise RecordError(f"{where}: field {name!r} must be {wanted}, got {value!r}")


def offline_trajectories(records: list[tuple[str, dict[str, Any]]], task: Task, source: str) -> tuple[list[Trajectory], int]:
    """`{prompt, completion (or response), reward or passed}` records (a prompt as text or chat
    messages) and conversations as trajectories of `task`: a prompt the task has gets its id, so the run
    trains on it; rewards on the task's declared range are mapped to [0, 1] (`in_unit_range`).
    Returns (trajectories, how many have a prompt the task does not have)."""
    ids = task_prompt_ids(task)
    declared = tuple(task.reward_range) if getattr(task, "declared", False) else None
    rows, unknown = [], 0
    for where, record in records:
        record = in_unit_range(record, where, declared)
        conversation = chat_form(record, where)
        if conversation is not None:  # a conversation: the chat path keeps its tool calls and turns
            row = chat_trajectory(conversation, where, source, task.name)
            found = ids.get(prompt_key(row.prompt_text))
            unknown += found is None
            rows.append(with_prompt_id(replace(row, prompt_text=found[1]), found[0]) if found else row)
            continue
        text = prompt_of(record, where)[0]
        found = ids.get(prompt_key(text))
        unknown += found is None
        prompt_id, text = found or (record.get("prompt_id"), text)
        keyed = {**record, "prompt": text, "prompt_id": prompt_id, "task": task.name}
        keyed.pop("messages", None)  # the conversation is the prompt text now
        rows.append(record_to_trajectory(keyed, where, source, task.name))
    return rows, unknown


def _check_values(row: dict[str, Any], where: str, vocabulary: Vocabulary | None = None) -> None:
    """What the column types allow but a learner cannot use: negative token ids (or, with a
    `vocabulary`, ids the model does not have), a prompt or a response of no tokens, log-probs that
    are not finite and <= 0 or not one per response token, Monte-Carlo targets outside the response."""
    def bad(name: str, why: str) -> RecordError:
        return RecordError(f"{where}: field {name!r} {why}")

    for name in ("prompt_tokens", "response_tokens"):
        if any(t < 0 for t in row.get(name) or []):
            raise bad(name, "holds a negative token id")
        if vocabulary and row.get("tokenizer") == vocabulary[0] and max(row.get(name) or [0]) >= vocabulary[1]:
            raise bad(name, f"holds token id {max(row[name])}, outside the model's vocabulary "
                      f"(ids 0 to {vocabulary[1] - 1})")
    tokens, logprobs = row.get("response_tokens") or [], row.get("behavior_logprobs")
    if logprobs is not None:
        if not all(math.isfinite(v) and v <= 0 for v in logprobs):
            raise bad("behavior_logprobs", "must be finite log-probabilities (<= 0)")
        if len(logprobs) != len(tokens):
            raise bad("behavior_logprobs", f"has {len(logprobs)} values for {len(tokens)} response tokens")
    mask = row.get("action_mask")
    if mask is not None and len(mask) != len(tokens):
        raise bad("action_mask", f"has {len(mask)} values for {len(tokens)} response tokens")
    if row.get("turns"):
        try:
            episode_of([{"role": "user", "content": "."}, *map(turn_message, row["turns"])], where)
        except RecordError as e:
            raise bad("turns", f"is not an episode: {str(e).removeprefix(where + ': ')}") from None
    for target in row.get("mc_targets") or []:
        t, success, k = (target or {}).get("t"), (target or {}).get("success"), (target or {}).get("k")
        if t is None or success is None or k is None or not 0 <= t <= max(len(tokens), 1) or not 0 <= success <= 1 \
                or k < 1:
            raise bad("mc_targets", f"needs {{t: a prefix length of the response, success: in [0, 1], k: >= 1}}, "
                      f"got {target!r}")
    if not isinstance(row.get("created_at"), (datetime, type(None))):
        raise bad("created_at", f"must be an ISO date, got {row['created_at']!r}")
    # a run of the row's tokenizer feeds its token ids as they are, so it needs both lists (a row of
    # no tokenizer, or another run's, is tokenised from its texts, so it needs a prompt text)
    given = [name for name in ("prompt_tokens", "response_tokens") if row.get(name)]
    if row.get("tokenizer") and len(given) == 1:
        other = "response_tokens" if given == ["prompt_tokens"] else "prompt_tokens"
        raise bad(other, f"must hold at least one token (the row gives {given[0]} of tokenizer "
                  f"{row['tokenizer']!r}), got {row.get(other)!r}")
    if not row.get("prompt_text") and not (row.get("tokenizer") and given):
        raise bad("prompt_text", "must hold the prompt's text (or 'prompt_tokens' and 'response_tokens' at least one "
                  "token each, with their 'tokenizer'): a model needs at least one prompt token")


def read_trajectories(path: str | Path, source: str | None, task: str = "",
                      prompt_ids: dict[str, tuple[str, str]] | None = None,
                      vocabulary: Vocabulary | None = None) -> list[Trajectory]:
    """Every record of a file as trajectories (`record_to_trajectory`); the first bad record stops
    the import (nothing written)."""
    return [record_to_trajectory(record, where, source, task, prompt_ids, vocabulary)
            for where, record in read_records(path)]


def check_conflicts(rows: list[Trajectory], what: str) -> None:
    """Refuses input that contradicts itself (docs/DATA.md, "Conflicts"): one response (one id) given
    different grades, or one prompt id naming different prompt texts. The store would otherwise keep one
    of them in silence. A response repeated with the same grade is a repeat, not a conflict."""
    grades: dict[str, set[tuple[float, bool]]] = {}
    texts: dict[str, set[str]] = {}
    for row in rows:
        grades.setdefault(row.id, set()).add((row.reward, row.passed))
        if row.prompt_text:
            texts.setdefault(row.prompt_id, set()).add(row.prompt_text)
    graded = [(i, g) for i, g in grades.items() if len(g) > 1]
    named = [(p, t) for p, t in texts.items() if len(t) > 1]
    if not graded and not named:
        return
    parts = []
    if graded:
        first = next(r for r in rows if r.id == graded[0][0])
        shown = ", ".join(f"{reward:g}" for reward, _ in sorted(graded[0][1]))
        parts.append(f"{len(graded)} response{'s are' if len(graded) > 1 else ' is'} given different grades (the first, "
                     f"to prompt {first.prompt_id!r}: rewards {shown})")
    if named:
        parts.append(f"{len(named)} prompt id{'s name' if len(named) > 1 else ' names'} different prompt texts (the "
                     f"first: {named[0][0]!r}, {len(named[0][1])} texts)")
    raise RecordError(f"{what}: {' and '.join(parts)}; nothing imported: keep one grade per response and one text per "
                      "prompt id (docs/DATA.md, 'Conflicts')")


def task_solutions(task: Task, source: str = "human") -> list[Trajectory]:
    """The task's known solutions of every prompt, graded by the task (so a wrong one is recorded as such)."""
    pairs = [(p, s) for p in task.prompts() for s in task.reference_solutions(p)]
    grades = task.grade_many(pairs)
    return [Trajectory(p.id, s, g.reward, g.passed, task=task.name, prompt_text=p.text, source=source)
            for (p, s), g in zip(pairs, grades)]


EXPORT_FORMATS = ("rows", "chat")


def export(rows: pa.Table | Iterable[pa.Table], out: str | Path, store: str | Path | None = None,
           form: str = "rows") -> int:
    """Rows (a table, or tables streamed one at a time: `StoredPool.tables`) to `.parquet`, `.jsonl`,
    `.jsonl.gz` (timestamps as ISO strings) or a Hugging Face dataset directory `NAME.hf`
    (`datasets.load_from_disk`); returns rows written. `form` "chat": each row as an OpenAI chat
    conversation with its reward (`data.chat.chat_record`), what `softrl data import` reads back. The
    output appears whole or not at all (written beside it, then renamed: a full disk or a kill leaves
    an earlier one of that name as it was), and never inside `store`, among its parts."""
    if form not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {form!r}; use {' or '.join(EXPORT_FORMATS)}")
    out = Path(out)
    if form == "chat" and not out.name.endswith((".jsonl", ".jsonl.gz")):
        raise ValueError(f"cannot export chat conversations to {out}: they are JSON lines, use a .jsonl or .jsonl.gz "
                         "file name")
    if not (out.suffix in (".parquet", ".hf") or out.name.endswith((".jsonl", ".jsonl.gz"))):
        raise ValueError(f"cannot export to {out}: use a .parquet, .jsonl or .jsonl.gz file name, or NAME.hf for a "
                         "Hugging Face dataset directory")
    if store is not None and "://" not in str(store) and out.resolve().is_relative_to(Path(store).resolve()):
        raise ValueError(f"cannot export to {out}: it is inside the store {store}, whose files are its parts; "
                         "write it elsewhere")
    if not out.parent.is_dir():
        raise ValueError(f"cannot export to {out}: its folder {out.parent} does not exist")
    if out.is_dir() and out.suffix != ".hf":
        raise ValueError(f"cannot export to {out}: it is a directory; give a file name")
    chunks = [rows] if isinstance(rows, pa.Table) else rows
    if out.suffix == ".hf":
        return export_hf(chunks, out)
    written = 0
    with whole_file(out) as work:
        if out.suffix == ".parquet":
            writer = None
            for chunk in chunks:
                writer = writer or pq.ParquetWriter(work, chunk.schema)
                writer.write_table(chunk)
                written += chunk.num_rows
            if writer is None:
                pq.write_table(TRAJECTORY_SCHEMA.empty_table(), work)
            else:
                writer.close()
        else:
            opener = gzip.open if out.suffix == ".gz" else open
            with opener(work, "wt", encoding="utf-8") as f:
                for chunk in chunks:
                    for row in chunk.to_pylist():
                        f.write(json.dumps(chat_record(row) if form == "chat" else row,
                                           default=lambda v: v.isoformat()) + "\n")
                    written += chunk.num_rows
    return written


def export_hf(chunks: Iterable[pa.Table], out: Path) -> int:
    """A Hugging Face dataset directory (`save_to_disk`), built from a Parquet file streamed beside it."""
    try:
        import datasets
    except ImportError:
        raise ValueError(f"cannot export to {out}: a Hugging Face dataset needs `datasets` (pip install "
                         "'softrl[datasets]')") from None
    work = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        written = export(chunks, work.with_suffix(".parquet"))
        if not written:  # datasets saves an empty dataset but cannot load it back
            raise ValueError(f"cannot export to {out}: no trajectories match, and datasets cannot read an empty "
                             "dataset directory back; nothing written (use a .jsonl or .parquet file for none)")
        datasets.disable_progress_bars()
        datasets.Dataset.from_parquet(str(work.with_suffix(".parquet")), cache_dir=str(work) + "-cache") \
            .save_to_disk(str(work))
        if out.exists():  # replaced only once the new one is whole
            shutil.rmtree(out)
        os.replace(work, out)
        return written
    finally:
        for leftover in (work, Path(str(work) + "-cache")):
            shutil.rmtree(leftover, ignore_errors=True)
        work.with_suffix(".parquet").unlink(missing_ok=True)
