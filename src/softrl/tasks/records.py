"""Reading dataset records from JSONL (optionally gzipped), JSON lists, Parquet, local Hugging Face
`datasets` directories, `hf:DATASET[:CONFIG][:SPLIT]` through `datasets.load_dataset`, and from
Python (a list of dicts or a `datasets.Dataset`). Every record comes with where it was found, for
error messages."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from softrl.limits import MAX_RECORD_CHARS


class RecordError(ValueError):
    """A dataset record is malformed: the message names the file, the record and the field."""


def records_of(source: Any, what: str = "dataset") -> list[tuple[str, dict[str, Any]]]:
    """`(where, record)` of a path or `hf:` spec (`read_records`), a list of dicts or a
    `datasets.Dataset` (`where` is `what[i]`)."""
    if isinstance(source, (str, Path)):
        return list(read_records(source))
    if isinstance(source, dict) or not hasattr(source, "__iter__"):
        raise RecordError(f"{what} must be a list of dicts, a datasets.Dataset or a path, got {type(source).__name__}")
    return [(f"{what}[{i}]", _as_record(record, f"{what}[{i}]")) for i, record in enumerate(source)]


def read_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield `(where, record)`; `where` is `file:line` or `file#row`."""
    if str(path).startswith("hf:"):
        yield from _hub_dataset(str(path))
        return
    path = Path(path)
    if not path.exists():
        raise RecordError(f"{path}: no such file or directory")
    if not path.is_dir() and not path.is_file():  # a device or a pipe: /dev/zero would never end
        raise RecordError(f"{path}: not a regular file")
    if path.is_dir():
        yield from _hf_dataset(path)
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, record in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path}#{i}", record
    elif path.name.endswith((".jsonl", ".jsonl.gz")):
        opener = gzip.open if path.suffix == ".gz" else open
        number = 0
        try:
            with opener(path, "rt", encoding="utf-8") as f:
                # read no line further than the limit: one endless line must not fill the memory
                for number, line in enumerate(iter(lambda: f.readline(MAX_RECORD_CHARS + 1), ""), start=1):
                    if len(line) > MAX_RECORD_CHARS:
                        raise RecordError(f"{path}:{number}: a record over the {MAX_RECORD_CHARS // 2**20} MiB limit")
                    if line.strip():
                        yield f"{path}:{number}", _json_object(line, f"{path}:{number}")
        except (UnicodeDecodeError, OSError, EOFError) as e:  # binary, not gzip, a truncated gzip stream
            raise RecordError(f"{path}:{number + 1}: not readable as UTF-8 JSON lines ({_reason(e)})") from e
    elif path.suffix == ".json":
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RecordError(f"{path}: not a UTF-8 JSON file ({_reason(e)})") from e
        except RecursionError as e:
            raise RecordError(f"{path}: nested too deeply") from e
        if not isinstance(data, list):
            raise RecordError(f"{path}: a .json dataset must be a list of records")
        escapes_surrogates = bool(_SURROGATE_ESCAPE.search(text))
        for i, record in enumerate(data):
            yield f"{path}#{i}", _text_record(record, f"{path}#{i}", escapes_surrogates)
    else:
        raise RecordError(f"{path}: unknown dataset format (use .jsonl, .jsonl.gz, .json, .parquet or a datasets dir)")


def _reason(error: Exception) -> str:
    if isinstance(error, UnicodeDecodeError):
        return f"byte {error.start} is not UTF-8"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _json_object(line: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        raise RecordError(f"{where}: not valid JSON ({e.msg})") from e
    except RecursionError as e:
        raise RecordError(f"{where}: nested too deeply") from e
    return _text_record(value, where, bool(_SURROGATE_ESCAPE.search(line)))


# JSON lets a lone surrogate (\ud800) through, which no UTF-8 file can hold; only such an escape
# in the text can put one in a decoded string, so only then is the record encoded to find it
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _text_record(value: Any, where: str, escapes_surrogates: bool) -> dict[str, Any]:
    record = _as_record(value, where)
    if escapes_surrogates:
        try:
            json.dumps(record, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise RecordError(f"{where}: a string holds {e.object[e.start:e.end]!a}, which is not a character") from e
    return record


def _as_record(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RecordError(f"{where}: a record must be a JSON object, got {type(value).__name__}")
    return value


def _hf_dataset(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        import datasets
    except ImportError as e:
        raise RecordError(f"{path}: reading a datasets directory needs `pip install softrl[datasets]`") from e
    # what save_to_disk leaves: a dataset's state file, or a dataset dict's list of splits
    if not (path / "state.json").is_file() and not (path / "dataset_dict.json").is_file():
        raise RecordError(f"{path}: a directory, and not a Hugging Face dataset saved with save_to_disk; give a "
                          ".jsonl, .json or .parquet file, or such a dataset directory")
    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        split = "test" if "test" in data else next(iter(data))
        data = data[split]
    for i, record in enumerate(data):
        yield f"{path}#{i}", dict(record)


_REQUIRED = object()


def _hub_dataset(spec: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """`hf:DATASET[:CONFIG][:SPLIT]` through `datasets.load_dataset` (a local folder of data files, or
    a hub id: from the datasets cache, refused at once when not there, from the hub only with
    HF_HUB_OFFLINE=0 set: softrl.hub); the split defaults to train."""
    from softrl.hub import looks_like_hub_id, online

    name, config, split = (spec.removeprefix("hf:").split(":") + ["", ""])[:3]
    if not name:
        raise RecordError(f"{spec}: name a dataset, hf:DATASET[:CONFIG][:SPLIT]")
    try:
        import datasets
    except ImportError as e:
        raise RecordError(f"{spec}: hf: datasets need `pip install softrl[datasets]`") from e
    cached = looks_like_hub_id(name, slashes=(0, 1)) and not online()
    if cached:
        _require_cached_dataset(spec, name, config)
    try:
        with _datasets_offline(cached):
            data = datasets.load_dataset(name, config or None, split=split or "train")
    except Exception as e:  # noqa: BLE001 - datasets raises many types (not found, offline, bad split)
        raise RecordError(f"{spec}: cannot load the dataset ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    for i, record in enumerate(data):
        yield f"{spec}#{i}", dict(record)


def _require_cached_dataset(spec: str, name: str, config: str) -> None:
    """A RecordError, at once, unless the datasets cache holds `name` (its `config`, if given) as
    `datasets.load_dataset` finds it offline: CACHE/ORG___NAME/CONFIG/VERSION/HASH/."""
    import datasets.config
    from datasets.naming import camelcase_to_snakecase

    from softrl.hub import ONLINE_HINT

    cache = Path(datasets.config.HF_DATASETS_CACHE).expanduser()
    parts = name.split("/")
    root = cache / "___".join([*parts[:-1], camelcase_to_snakecase(parts[-1])])
    if any(p.is_dir() for p in root.glob(f"{config or '*'}/*/*")):
        return
    which, call = f"{name} config {config}" if config else name, ", ".join(repr(a) for a in (name, config) if a)
    raise RecordError(f"{spec}: no such local folder, and the hub dataset {which} is not in the local datasets "
                      f"cache ({cache}): load it once where the hub is reachable (datasets.load_dataset({call}) "
                      f"with the same HF_HOME), or download its files there (`hf download --repo-type dataset {name} "
                      f"--local-dir FOLDER`) and give hf:FOLDER, " + ONLINE_HINT)


@contextmanager
def _datasets_offline(offline: bool) -> Iterator[None]:
    """`datasets` reading its cache without asking the hub first (HF_HUB_OFFLINE for this call), and
    without its warning that it does so."""
    if not offline:
        yield
        return
    import datasets.config
    from datasets.utils import logging as datasets_logging

    before, verbosity = datasets.config.HF_HUB_OFFLINE, datasets_logging.get_verbosity()
    datasets.config.HF_HUB_OFFLINE = True
    datasets_logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = before
        datasets_logging.set_verbosity(verbosity)


def field(record: dict[str, Any], name: str, where: str, kind: type | tuple[type, ...] = str,
          default: Any = _REQUIRED) -> Any:
    """`record[name]`, checked to be of `kind`; a RecordError naming record and field otherwise. With
    a `default`, a missing (or null) field is that default instead of an error."""
    label = record.get("task_id", record.get("name", record.get("id", "?")))
    if name not in record or record[name] is None:
        if default is not _REQUIRED:
            return default
        raise RecordError(f"{where}: record {label!r}: field {name!r} is missing")
    value = record[name]
    if not isinstance(value, kind):
        wanted = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RecordError(f"{where}: record {label!r}: field {name!r} must be {wanted}, got {type(value).__name__}")
    return value


# --- a record's prompt: a string, or chat messages kept as one text -----------------------------
def conversation_text(messages: list[dict[str, str]]) -> str:
    """A conversation as one prompt text: what the store keeps and `apply_chat_template` renders."""
    return json.dumps({"messages": messages}, ensure_ascii=False)


def conversation_of(text: str) -> list[dict[str, str]] | None:
    """The messages of a text `conversation_text` made, else None (a plain prompt, also one that only
    looks like a conversation)."""
    if not text.startswith('{"messages": ['):
        return None
    try:
        value = json.loads(text)
        return _messages(value["messages"], "", "") if isinstance(value, dict) and list(value) == ["messages"] else None
    except (json.JSONDecodeError, RecordError):
        return None


def prompt_key(text: str) -> str:
    """What two prompt texts share when they are one prompt: white space around it aside, and a conversation
    of one user message as that message (a dataset keeps it as a conversation, a chat import as its text)."""
    messages = conversation_of(text)
    return messages[0]["content"].strip() if messages and len(messages) == 1 and messages[0]["role"] == "user" \
        else text.strip()


CHAT_ROLES = ("system", "user", "assistant", "tool")


def _messages(value: Any, where: str, name: str) -> list[dict[str, str]]:
    """A prompt's chat messages, each of a known role and a text; tool calls are refused here (they would
    be dropped: an episode with them is a `messages` record with a reward, `softrl data import`'s)."""
    if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value):
        raise RecordError(f"{where}: field {name!r} must be a string or a non-empty list of "
                          "{'role': ..., 'content': ...} messages")
    for i, m in enumerate(value):
        if m["role"] not in CHAT_ROLES:
            raise RecordError(f"{where}: field {name!r}, message {i} has role {m['role']!r}; use "
                              f"{', '.join(CHAT_ROLES)}")
        if m.get("tool_calls") or m["role"] == "tool":  # a tool message answers a call, which a prompt cannot make
            raise RecordError(f"{where}: field {name!r}, message {i} has {'tool_calls' if m.get('tool_calls') else 'role tool'}"
                              ", which a prompt cannot carry: give the conversation as 'messages' with a 'reward' to "
                              "learn from it as an episode")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def prompt_of(record: dict[str, Any], where: str) -> tuple[str, Any, list[str]]:
    """(prompt text, the prompt as the reward function sees it, known solutions) of a record; a text
    over `limits.MAX_RECORD_CHARS` (a record in Python or Parquet, which no line limit caught) is
    refused before anything tokenizes it."""
    text, as_given, solutions = _prompt_of(record, where)
    if len(text) > MAX_RECORD_CHARS:
        raise RecordError(f"{where}: the prompt has {len(text):,} characters, over the "
                          f"{MAX_RECORD_CHARS // 2**20} MiB limit of a record: at most {MAX_RECORD_CHARS:,}")
    return text, as_given, solutions


def _prompt_of(record: dict[str, Any], where: str) -> tuple[str, Any, list[str]]:
    if "prompt" in record and record["prompt"] is not None:
        value = record["prompt"]
        if isinstance(value, str):
            return value, value, []
        messages = _messages(value, where, "prompt")
        return conversation_text(messages), messages, []
    if "messages" in record and record["messages"] is not None:
        messages = _messages(record["messages"], where, "messages")
        if messages[0]["role"] not in ("system", "user"):
            raise RecordError(f"{where}: field 'messages' starts with a {messages[0]['role']} message: a conversation "
                              "needs its system or user prompt first")
        solutions = []
        if messages[-1]["role"] == "assistant" and len(messages) > 1:
            solutions, messages = [messages[-1]["content"]], messages[:-1]
        return conversation_text(messages), messages, solutions
    raise RecordError(f"{where}: record has no field 'prompt' (a string or chat messages) or 'messages'")
