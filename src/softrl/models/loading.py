"""Loading Hugging Face causal LMs and tokenizers, with one-line errors that say what to do."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from softrl.models.device import DTYPES



def built_once(final: Path, build: Callable[[Path], object], force: bool = False) -> Path:
    """`final`, a cache folder complete once it holds softrl.json; if missing (or `force`), made by
    `build(work)` in a temporary folder renamed onto it. One process builds; the others wait, then use it."""
    if (final / "softrl.json").exists() and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # the lock file stays: removing it would let a waiter hold a lock on a file a newcomer no longer sees
    with open(final.with_name(final.name + ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a build can take minutes: say why nothing moves
            print(f"waiting for another process to finish building {final}", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "softrl.json").exists() and not force:
            return final
        # with the lock held no build of `final` is running: a temporary folder here is a killed build's
        for stale in final.parent.glob(f"{final.name}.tmp*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = final.with_name(f"{final.name}.tmp{os.getpid()}")
        try:
            build(work)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(work, final)  # atomic: a half-built folder is never found in the cache
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


class ModelLoadError(ValueError):
    """A model or tokenizer could not be loaded; the message says what to do."""


def first_line(error: BaseException) -> str:
    """An error's first line that says something, else its type's name."""
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def quiet_transformers() -> None:
    """softrl shows its own progress; transformers' per-load and per-save bars would interleave."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def local_source(path: str | Path) -> str:
    """What `from_pretrained` is given for `path`: a local directory (or what is no hub id) as it is,
    and a hub id too with HF_HUB_OFFLINE=0 set (transformers may download it: softrl.hub); else the
    id's folder in the local hub cache, read without asking the hub (transformers would, even for a
    cached id, for half a minute where no network answers). An id the cache lacks is a ModelLoadError
    at once."""
    from softrl.hub import ONLINE_HINT, looks_like_hub_id, online

    if Path(path).is_file():  # else transformers takes it for a malformed hub id and says so
        raise ModelLoadError(f"model {path} is a file: give the model's directory (the folder with its config.json)")
    # `name` as well as `org/name`: a mistyped local name was sent to the hub, 35 s of retries offline
    if not looks_like_hub_id(path, slashes=(0, 1)) or online():
        return str(path)
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        found = try_to_load_from_cache(str(path), "config.json")
    except ValueError:  # not a valid repo id
        found = None
    if isinstance(found, str):
        return str(Path(found).parent)  # the snapshot of the cached revision
    raise ModelLoadError(f"model {path}: no such local directory, and the hub id is not in the local cache "
                         f"({constants.HF_HUB_CACHE}): download it where the hub is reachable (`hf download {path}`, "
                         f"with the same HF_HOME), give a local model directory, " + ONLINE_HINT)


def model_positions(path: str | Path) -> int:
    """The positions (prompt + response) the model at `path` declares, read from its config without
    loading its weights; 0 where it does not say or cannot be read (loading it then says why)."""
    source = local_source(path)  # before transformers is imported: a refusal takes no time
    from transformers import AutoConfig

    quiet_transformers()
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError):
        return 0
    return int(getattr(config, "max_position_embeddings", 0) or 0)


def load_tokenizer(path: str | Path, pad_token: str | None = None):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(local_source(path))
    except (OSError, ValueError, TypeError) as e:  # no tokenizer files, or damaged ones
        if isinstance(e, ModelLoadError):
            raise
        raise ModelLoadError(f"cannot load a tokenizer from {path} ({first_line(e)}): the directory needs its "
                             "tokenizer files (tokenizer.json, or tokenizer_config.json and the vocabulary) beside "
                             "config.json") from e
    if pad_token is not None:
        tokenizer.pad_token = pad_token
    if tokenizer.pad_token_id is None:
        raise ModelLoadError(
            f"the tokenizer at {path} has no pad token: pass pad_token=... (often the EOS token, "
            f"{tokenizer.eos_token!r}) or save one with tokenizer.pad_token = ...; tokenizer.save_pretrained()"
        )
    return tokenizer


def load_causal_lm(path: str | Path, dtype: str = "float32", pad_token: str | None = None):
    """(model, tokenizer) from a local directory, or a hub id in the local hub cache (from the hub
    itself with HF_HUB_OFFLINE=0: `local_source`)."""
    local = Path(path)
    if not local.exists() and (local.is_absolute() or str(path).startswith(".") or str(path).count("/") != 1):
        raise ModelLoadError(f"model directory {path} does not exist: run `softrl bootstrap countdown` for the "
                             "built-in reference, or `softrl model prepare smollm2-135m` for real weights")
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)}, got dtype={dtype!r}")
    source = local_source(path)  # a hub id the cache lacks: refused now, before transformers is imported
    from transformers import AutoConfig, AutoModelForCausalLM

    quiet_transformers()
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read a model config at {path} ({str(e).splitlines()[0]}): "
                             "point --model (model.path) at a transformers model directory with config.json, "
                             "or at a hub id the hub or its cache has") from e
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        arch = (getattr(config, "architectures", None) or [config.model_type])[0]
        raise ModelLoadError(f"architecture {arch!r} at {path} is not a causal LM this transformers supports: "
                             "use a model with a *ForCausalLM class (Llama, Qwen2, GPT-2, ...)")
    from safetensors import SafetensorError
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report would print before the one line below says what is wrong
    try:
        model, info = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype], output_loading_info=True)
    except OSError as e:
        raise ModelLoadError(f"cannot load weights from {path} ({first_line(e)}): "
                             "the directory needs model.safetensors (or pytorch_model.bin) next to config.json") from e
    except SafetensorError as e:  # a cut or damaged file
        raise ModelLoadError(f"cannot load weights from {path}: a weights file is damaged or cut short "
                             f"({first_line(e)}): copy it again") from e
    except RuntimeError as e:
        if "mismatch" not in str(e).lower():
            raise
        raise ModelLoadError(f"cannot load weights from {path}: their shapes do not fit its config.json (another "
                             "model's weights, or an edited config): give the weights and config.json of one model") from e
    finally:
        hf_logging.set_verbosity(verbosity)
    tied = getattr(model, "all_tied_weights_keys", None) or {}  # tied in this model (the class lists what may be)
    missing = [k for k in info.get("missing_keys", []) if k not in tied]
    if missing:  # said here, since the load report is quiet: these start at random
        import warnings

        warnings.warn(f"model {path}: {len(missing)} weights are not in its files and start at random "
                      f"({', '.join(sorted(missing)[:3])}{', ...' if len(missing) > 3 else ''})", stacklevel=2)
    return model.eval(), load_tokenizer(source, pad_token)


def vocabulary(path: str | Path) -> tuple[str, int]:
    """(tokenizer fingerprint, number of token ids the model embeds) of a model directory, without
    loading its weights: what a row's token ids must fit to be fed to this model."""
    from transformers import AutoConfig

    quiet_transformers()
    if not Path(path).exists() and (Path(path).is_absolute() or str(path).startswith(".") or str(path).count("/") != 1):
        raise ModelLoadError(f"model directory {path} does not exist")
    try:
        config = AutoConfig.from_pretrained(local_source(path))
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as e:
        if isinstance(e, ModelLoadError):
            raise
        raise ModelLoadError(f"cannot read a model config and tokenizer at {path} ({str(e).splitlines()[0]}): "
                             "give a transformers model directory with config.json and its tokenizer") from e
    size = getattr(config.get_text_config(), "vocab_size", None) or len(tokenizer)
    return tokenizer_fingerprint(tokenizer), int(size)


def apply_chat_template(tokenizer, text: str) -> str:
    """The prompt as the tokenizer's chat template renders it: a conversation's messages
    (`tasks.records.conversation_text`), else the text as a single user turn. Without a
    template, the text unchanged, or a conversation's turns as `role: content` lines."""
    from softrl.tasks.records import conversation_of

    messages = conversation_of(text)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages or [{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    if messages is not None:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return text


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Prompt token ids as every softrl component feeds them to a model: chat template (when the
    tokenizer has one), no extra special tokens."""
    return tokenizer(apply_chat_template(tokenizer, text), add_special_tokens=False)["input_ids"]


def encode_response(tokenizer, text: str) -> list[int]:
    """Response token ids as the models were trained on them: no special tokens, then EOS."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def episode_message(turn: dict) -> dict:
    """An episode's turn (data/schema.py's TURN) as the chat template takes it: tool calls with their
    arguments as objects, as templates render them."""
    from softrl.data.chat import turn_message

    # the reward is the store's, not the template's; a call id and a tool name belong to tool messages
    message = {key: value for key, value in turn_message(turn).items()
               if key != "reward" and (turn["role"] == "tool" or key not in ("tool_call_id", "name"))}
    if "tool_calls" in message:
        message["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"]["arguments"])}}
                                 for c in message["tool_calls"]]
    return message


def _arguments(text: str):
    """A call's arguments (JSON text in OpenAI messages) as the object they hold, for a template or the plain
    format to render; text that is no JSON (a policy's call may carry such) as is."""
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return text


def plain_turn(turn: dict, next_is_policy: bool) -> str:
    """A turn as text for a tokenizer without a chat template: the policy's turn its content and tool
    calls (Hermes-style blocks, arguments as the object they hold, as `tasks.tools.parse_tool_calls`
    reads them), the environment's a `role: content` line after the policy's EOS, then the next turn's cue."""
    if turn["role"] == "assistant":
        return turn["content"] + "".join(
            f"\n<tool_call>{json.dumps({'name': c['function']['name'], 'arguments': _arguments(c['function']['arguments'])})}"
            "</tool_call>" for c in json.loads(turn.get("tool_calls") or "[]"))
    return f"\n{turn['role']}: {turn['content']}\n" + ("assistant: " if next_is_policy else "")


def turn_pieces(tokenizer, prompt_text: str, turns: list[dict], start: int = 0,
                policy_next: bool = False) -> list[list[int]]:
    """The token ids of each of `turns[start:]` after the prompt and the turns before it: with the chat
    template, the text the template adds for the turn (the policy's with its end-of-turn marker, the
    environment's with the cue of a policy turn after it); without one, `plain_turn`'s text, a policy
    turn ending with EOS. `policy_next`: a policy turn follows the last one (a rollout about to sample
    it). A template that renders earlier turns differently once later ones follow (one that drops
    reasoning from past turns) cannot be split so: a ValueError naming the turn."""
    from softrl.data.chat import prompt_messages

    def cue(i: int) -> bool:
        return turns[i + 1]["role"] == "assistant" if i + 1 < len(turns) else policy_next

    pieces = []
    if getattr(tokenizer, "chat_template", None):
        messages = prompt_messages(prompt_text) + [episode_message(t) for t in turns[:start]]
        before = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=start == 0 or cue(start - 1))
        for i in range(start, len(turns)):
            messages.append(episode_message(turns[i]))
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=cue(i))
            if not text.startswith(before):
                raise ValueError(f"the chat template renders the turns before turn {i} ({turns[i]['role']}) "
                                 "differently once it follows, so the episode's tokens cannot be split by turn")
            pieces.append(tokenizer(text[len(before):], add_special_tokens=False)["input_ids"])
            before = text
        return pieces
    for i in range(start, len(turns)):
        piece = tokenizer(plain_turn(turns[i], cue(i)), add_special_tokens=False)["input_ids"]
        pieces.append(piece + [tokenizer.eos_token_id] if turns[i]["role"] == "assistant" else piece)
    return pieces


def encode_episode(tokenizer, prompt_text: str, turns: list[dict]) -> tuple[list[int], list[int], list[bool]]:
    """(prompt ids, ids of everything after the prompt, which of those are the policy's) of an episode,
    as `encode_prompt` and `encode_response` encode one turn, each turn split as `turn_pieces` splits it."""
    response: list[int] = []
    mask: list[bool] = []
    for turn, piece in zip(turns, turn_pieces(tokenizer, prompt_text, turns)):
        response += piece
        mask += [turn["role"] == "assistant"] * len(piece)
    return encode_prompt(tokenizer, prompt_text), response, mask


def tokenizer_fingerprint(tokenizer) -> str:
    """Token ids are only comparable under the same vocabulary: a short hash of it, for the store."""
    vocab = sorted(tokenizer.get_vocab().items())
    digest = hashlib.sha256(json.dumps([vocab, tokenizer.eos_token, tokenizer.pad_token]).encode()).hexdigest()
    return f"{type(tokenizer).__name__}-{len(vocab)}-{digest[:12]}"

