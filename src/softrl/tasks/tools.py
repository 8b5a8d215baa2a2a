"""Tools the policy calls through `tool_calls`: how its text carries a call, and a calculator for countdown.

A policy writes a call in its text as Hermes-style chat templates and `models.loading.plain_turn` render
one: `<tool_call>{"name": ..., "arguments": ...}</tool_call>` after its content (arguments an object, or
the JSON text of one as OpenAI messages keep them). `parse_tool_calls` reads the calls back into an
OpenAI assistant message's `tool_calls`; a block that is no call (not JSON, no name) stays text. An
environment that has `tools` (a list of OpenAI function specs) gets its episodes' policy turns parsed
so (rollout.episodes), and answers each call with a `tool` message naming its `tool_call_id`.

`countdown-tools`: countdown's problems with a calculator. The policy may call `calculate` with an
expression (Fractions, never eval) to check it before answering; the episode ends at a turn without a
call, and the reward is countdown's grade of that answer: calling the tool well is what earns it.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

from softrl.tasks.base import Prompt
from softrl.tasks.countdown import CountdownTask, ExpressionError, parse_expression
from softrl.tasks.environment import Messages

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
CALCULATE = {"type": "function", "function": {
    "name": "calculate", "description": "the exact value of an arithmetic expression (+ - * / and parentheses)",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def parse_tool_calls(text: str, turn: int) -> tuple[str, list[dict[str, Any]]]:
    """(the text without its calls, the calls as OpenAI `tool_calls` with ids `call_{turn}_{j}`)."""
    calls, kept = [], text
    for block in TOOL_CALL.finditer(text):
        try:
            call = json.loads(block.group(1))
        except json.JSONDecodeError:
            continue
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and call["name"]):
            continue
        arguments = call.get("arguments", {})
        calls.append({"id": f"call_{turn}_{len(calls)}", "type": "function", "function": {
            "name": call["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
        kept = kept.replace(block.group(0), "", 1)
    return (kept.rstrip() if calls else text), calls


def _value(number: Fraction) -> str:
    return str(number.numerator) if number.denominator == 1 else f"{number.numerator}/{number.denominator}"


class CalculatorEnvironment:
    """Answers each `calculate` call with the expression's exact value (or the error, one line); a call to
    any other tool, or with arguments that are no JSON object with an `expression` text, with an error
    naming it. Done at the first policy turn without a call. Deterministic: a calculator."""

    deterministic = True
    tools = [CALCULATE]

    def is_completed(self, messages: Messages, state: dict) -> bool:
        return not messages[-1].get("tool_calls")

    def env_response(self, messages: Messages, state: dict) -> tuple[Messages, dict]:
        return [{"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                 "content": self.answer(call["function"]["name"], call["function"]["arguments"])}
                for call in messages[-1]["tool_calls"]], state

    @staticmethod
    def answer(name: str, arguments: str) -> str:
        if name != "calculate":
            return f"error: unknown tool {name!r}; the tools are: calculate"
        try:
            given = json.loads(arguments)
        except json.JSONDecodeError:
            return f"error: the arguments are not JSON: {arguments[:80]!r}"
        expression = given.get("expression") if isinstance(given, dict) else None
        if not isinstance(expression, str):
            return "error: calculate needs {\"expression\": TEXT}"
        try:
            return _value(parse_expression(expression)[0])
        except (ExpressionError, ZeroDivisionError) as e:
            return f"error: {e or 'division by zero'}"


class CountdownToolsTask(CountdownTask):
    """countdown with a calculator: the prompt names the tool; graded on the answer of the last turn."""

    name = "countdown-tools"
    max_new_tokens = 48  # a turn's: an expression, or a call with one

    def __init__(self, **config):
        super().__init__(**config)
        self._prompts = [Prompt(p.id.replace("countdown-", "countdown-tools-", 1), p.text + "tools: calculate\n", p.meta)
                         for p in self._prompts]

    def make_environment(self) -> CalculatorEnvironment:
        return CalculatorEnvironment()


def synthetic_episode(prompt: Prompt, right: list[str], wrong: list[str], rng, max_turns: int,
                      p_correct: float) -> list[dict[str, Any]]:
    """An episode of the bootstrap's supervised data as chat messages: each turn but the last calls the
    calculator on an expression (right with probability `p_correct`, else a near miss not tried yet)
    and answers with it at once where the value is the target; the last turn answers without a call,
    right with probability `p_correct`. The tool's answers are the environment's, as in a rollout. A
    change here changes the bootstrap's data: bump the "format" of its fingerprint."""
    target = str(prompt.meta["target"])
    turns: list[dict[str, Any]] = []
    tried: set[str] = set()

    def pick() -> str:
        untried = [w for w in wrong if w not in tried]
        return rng.choice(right if not untried or rng.random() < p_correct else untried)

    for turn in range(max_turns - 1):
        expression = pick()
        tried.add(expression)
        arguments = json.dumps({"expression": expression})
        call = {"id": f"call_{turn}_0", "type": "function", "function": {"name": "calculate", "arguments": arguments}}
        value = CalculatorEnvironment.answer("calculate", arguments)
        turns += [{"role": "assistant", "content": "", "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": call["id"], "name": "calculate", "content": value}]
        if value == target:
            return turns + [{"role": "assistant", "content": expression}]
    return turns + [{"role": "assistant", "content": pick()}]
