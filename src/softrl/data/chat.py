"""Episodes as OpenAI chat `messages`, both ways (docs/DATA.md, "Episodes"): what `softrl data export
--format chat` writes and `softrl data import` reads, so a conversation logged by any agent, person or
harness (tool calls and tool results included, no log-probs needed) becomes a trajectory, and a
trajectory goes back out as the same conversation.

A conversation is its prompt (the `system` and `user` messages before the first `assistant` one) and
then the episode's turns: the policy's (`assistant`, with `tool_calls` where it called a tool) and the
environment's (`tool` answering one of those calls by `tool_call_id`, or `user`). A conversation of
one assistant message without tool calls is a single-turn row, as any prompt/response record is.
"""

from __future__ import annotations

import json
from typing import Any

from softrl.data.schema import POLICY_ROLE, new_turn
from softrl.tasks.records import CHAT_ROLES, RecordError, conversation_of, conversation_text

PROMPT_ROLES = ("system", "user")


def _text(message: dict, where: str, i: int) -> str:
    content = message.get("content")
    if content is None and message.get("role") == POLICY_ROLE and message.get("tool_calls"):
        return ""  # an assistant message that only calls tools
    if isinstance(content, list):  # OpenAI content parts: the text ones, joined
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise RecordError(f"{where}: message {i} ({message.get('role')}): only text content parts are supported")
        return "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise RecordError(f"{where}: message {i} ({message.get('role')}) needs a 'content' text, got {content!r}")
    return content


def _tool_calls(message: dict, where: str, i: int) -> list[dict] | None:
    """An assistant message's `tool_calls`, checked: each an {id, type: function, function: {name,
    arguments}} whose arguments are a JSON text (or an object, written back as one)."""
    calls = message.get("tool_calls")
    if calls is None or calls == []:
        return None
    if not isinstance(calls, list):
        raise RecordError(f"{where}: message {i}: 'tool_calls' must be a list, got {type(calls).__name__}")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RecordError(f"{where}: message {i}, tool call {j}: needs 'function': {{'name': ..., 'arguments': ...}}")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                json.loads(arguments)
            except json.JSONDecodeError as e:
                raise RecordError(f"{where}: message {i}, tool call {j} ({function['name']}): arguments are not JSON "
                                  f"({e.msg} at character {e.pos}): {arguments[:80]!r}") from None
        elif isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        else:
            raise RecordError(f"{where}: message {i}, tool call {j} ({function['name']}): arguments must be a JSON "
                              f"text or an object, got {type(arguments).__name__}")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise RecordError(f"{where}: message {i}, tool call {j} ({function['name']}): needs an 'id' text "
                              "(what its tool message answers)")
        out.append({"id": call_id, "type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return out


def episode_of(messages: Any, where: str) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """(the prompt's messages, the episode's turns) of an OpenAI chat conversation; a conversation
    that is not one (no prompt, no assistant turn, roles out of order, a tool message answering no
    call, arguments that are not JSON, an unknown role) is a RecordError naming the message."""
    if not isinstance(messages, list) or not messages:
        raise RecordError(f"{where}: field 'messages' must be a non-empty list of chat messages")
    prompt: list[dict[str, str]] = []
    turns: list[dict[str, Any]] = []
    open_calls: dict[str, str] = {}  # calls of the last assistant message not answered yet: id -> tool name
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RecordError(f"{where}: message {i} must be an object with a 'role', got {type(message).__name__}")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise RecordError(f"{where}: message {i} has role {role!r}; use {', '.join(CHAT_ROLES)}")
        text = _text(message, where, i)
        if not turns and role in PROMPT_ROLES:
            prompt.append({"role": role, "content": text})
            continue
        if not prompt:
            raise RecordError(f"{where}: message {i} ({role}) comes before any system or user message: the "
                              "conversation has no prompt")
        if role == "system":
            raise RecordError(f"{where}: message {i}: a system message after the conversation started")
        turn = new_turn(role, text)
        if role == POLICY_ROLE:
            calls = _tool_calls(message, where, i)
            turn["tool_calls"] = json.dumps(calls, ensure_ascii=False) if calls else None
            open_calls = {c["id"]: c["function"]["name"] for c in calls or []}
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in open_calls:
                known = ", ".join(open_calls) or "none open"
                raise RecordError(f"{where}: message {i} (tool) answers tool_call_id {call_id!r}, which the assistant "
                                  f"message before it did not make (its calls: {known})")
            turn["tool_call_id"], turn["name"] = call_id, message.get("name") or open_calls.pop(call_id)
        else:
            open_calls = {}
        reward = message.get("reward")
        if reward is not None:
            if isinstance(reward, bool) or not isinstance(reward, (int, float)):
                raise RecordError(f"{where}: message {i}: 'reward' must be a number, got {reward!r}")
            turn["reward"] = float(reward)
        turns.append(turn)
    if not any(m["content"] for m in prompt):  # as an empty 'prompt' field is refused
        raise RecordError(f"{where}: the conversation's system and user messages are empty: a model needs at least "
                          "one prompt token")
    if not any(t["role"] == POLICY_ROLE for t in turns):
        raise RecordError(f"{where}: the conversation has no assistant message: nothing of the policy's to learn from")
    return prompt, turns


def single_turn(turns: list[dict[str, Any]]) -> bool:
    """Whether an episode is one plain policy turn (a prompt/response row, not an episode)."""
    return len(turns) == 1 and turns[0]["role"] == POLICY_ROLE and not turns[0]["tool_calls"] \
        and turns[0]["reward"] is None


def prompt_text_of(prompt: list[dict[str, str]]) -> str:
    """The prompt as the store keeps it: one user message as its text, else the conversation."""
    return prompt[0]["content"] if len(prompt) == 1 and prompt[0]["role"] == "user" else conversation_text(prompt)


def prompt_messages(prompt_text: str) -> list[dict[str, str]]:
    return conversation_of(prompt_text) or [{"role": "user", "content": prompt_text}]


def turn_message(turn: dict[str, Any]) -> dict[str, Any]:
    """One turn as an OpenAI chat message."""
    message: dict[str, Any] = {"role": turn["role"], "content": turn["content"]}
    if turn.get("tool_calls"):
        message["tool_calls"] = json.loads(turn["tool_calls"])
    if turn.get("tool_call_id") is not None:
        message["tool_call_id"] = turn["tool_call_id"]
    if turn.get("name") is not None:
        message["name"] = turn["name"]
    if turn.get("reward") is not None:
        message["reward"] = turn["reward"]
    return message


def messages_of(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Any store row as an OpenAI chat conversation: its prompt's messages, then its turns (or its one
    response as the assistant's message)."""
    turns = row.get("turns") or [{"role": POLICY_ROLE, "content": row.get("response_text") or ""}]
    return prompt_messages(row.get("prompt_text") or "") + [turn_message(t) for t in turns]


def chat_record(row: dict[str, Any]) -> dict[str, Any]:
    """A store row as `softrl data export --format chat` writes it, and `softrl data import` reads it."""
    record = {"messages": messages_of(row), "reward": row["reward"], "passed": row["passed"],
              "prompt_id": row["prompt_id"], "task": row.get("task") or ""}
    if row.get("finish"):
        record["finish"] = row["finish"]
    return record


def transcript(turns: list[dict[str, Any]]) -> str:
    """An episode's turns as one readable text (a row's `response_text`): each turn on its own lines,
    the environment's marked with their role."""
    parts = []
    for turn in turns:
        text = turn["content"]
        if turn.get("tool_calls"):
            text += "".join(f"\n<tool_call>{json.dumps(c['function'], ensure_ascii=False)}</tool_call>"
                            for c in json.loads(turn["tool_calls"]))
        parts.append(text if turn["role"] == POLICY_ROLE else f"[{turn['role']}] {text}")
    return "\n".join(parts)
