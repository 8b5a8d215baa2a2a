"""Countdown: reach a target from given numbers with + - * / and parentheses, each number at most once.

Responses are parsed by a small recursive-descent parser and evaluated exactly with Fractions
(never with eval). Problems are generated from a random expression, so each has a solution; a
brute-force solver (`solve`) finds one for tests and offline data.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from softrl.tasks.base import Grade, Prompt, Task, extract_answer

_TOKEN = re.compile(r"\s*(?:(\d+)|(.))")


class ExpressionError(ValueError):
    pass


def parse_expression(text: str) -> tuple[Fraction, list[int]]:
    """Value and the numbers used, of `text` in the grammar
    expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ; factor := INT | '(' expr ')'."""
    tokens = []
    for number, symbol in _TOKEN.findall(text.strip()):
        if number:
            tokens.append(int(number))
        elif symbol.strip():
            if symbol not in "+-*/()":
                raise ExpressionError(f"unexpected character {symbol!r}")
            tokens.append(symbol)
    if not tokens:
        raise ExpressionError("empty expression")
    pos = 0
    used: list[int] = []

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def expr() -> Fraction:
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value

    def term() -> Fraction:
        value = factor()
        while peek() in ("*", "/"):
            if take() == "*":
                value *= factor()
            else:
                divisor = factor()
                if divisor == 0:
                    raise ExpressionError("division by zero")
                value /= divisor
        return value

    def factor() -> Fraction:
        token = peek()
        if isinstance(token, int):
            used.append(take())
            return Fraction(token)
        if token == "(":
            take()
            value = expr()
            if take_if(")"):
                return value
            raise ExpressionError("missing ')'")
        raise ExpressionError(f"expected a number or '(' at token {pos + 1}")

    def take_if(symbol: str) -> bool:
        if peek() == symbol:
            take()
            return True
        return False

    value = expr()
    if pos != len(tokens):
        raise ExpressionError(f"unexpected {tokens[pos]!r} at token {pos + 1}")
    return value, used


def check(numbers: list[int], target: int, answer: str) -> tuple[bool, str]:
    """Is `answer` an expression over a sub-multiset of `numbers` equal to `target`? (ok, reason)."""
    try:
        value, used = parse_expression(answer)
    except ExpressionError as e:
        return False, f"unparsable: {e}"
    extra = Counter(used) - Counter(numbers)
    if extra:
        return False, f"uses numbers not available: {sorted(extra.elements())}"
    if value != target:
        return False, f"evaluates to {value}, not {target}"
    return True, "ok"


def solve(numbers: list[int], target: int) -> str | None:
    """An expression reaching `target` from a sub-multiset of `numbers`, or None (exhaustive search)."""

    @lru_cache(maxsize=None)
    def reach(items: tuple[tuple[Fraction, str], ...]) -> str | None:
        for value, text in items:
            if value == target:
                return text
        for i in range(len(items)):
            for j in range(len(items)):
                if i == j:
                    continue
                (a, ta), (b, tb) = items[i], items[j]
                rest = tuple(x for k, x in enumerate(items) if k not in (i, j))
                # every composite is parenthesised: a / (b / c) must not print as a/b/c
                options = [(a + b, f"({ta}+{tb})"), (a - b, f"({ta}-{tb})"), (a * b, f"({ta}*{tb})")]
                if b != 0:
                    options.append((a / b, f"({ta}/{tb})"))
                for value, text in options:
                    found = reach(tuple(sorted(rest + ((value, text),))))
                    if found is not None:
                        return found
        return None

    return reach(tuple(sorted((Fraction(n), str(n)) for n in numbers)))


@dataclass(frozen=True)
class CountdownConfig:
    size: int = 1000
    seed: int = 0
    min_numbers: int = 4
    max_numbers: int = 4
    max_number: int = 6
    max_target: int = 100
    max_combined: int = 2  # the target combines at most this many of the numbers (difficulty)

    def __post_init__(self) -> None:
        if not 2 <= self.min_numbers <= self.max_numbers <= 6:
            raise ValueError(f"need 2 <= min_numbers <= max_numbers <= 6, got {self.min_numbers}, {self.max_numbers}")
        if not 2 <= self.max_combined <= self.max_numbers:
            raise ValueError(f"need 2 <= max_combined <= max_numbers, got max_combined={self.max_combined}")
        if self.size < 1 or self.max_number < 2 or self.max_target < 1:
            raise ValueError("size, max_number and max_target must be positive (max_number >= 2)")


def make_problem(rng: random.Random, cfg: CountdownConfig) -> tuple[list[int], int]:
    """Random numbers and a target made by combining a random subset of them (so it is reachable)."""
    while True:
        numbers = [rng.randint(1, cfg.max_number) for _ in range(rng.randint(cfg.min_numbers, cfg.max_numbers))]
        pool = [Fraction(n) for n in rng.sample(numbers, rng.randint(2, min(cfg.max_combined, len(numbers))))]
        while len(pool) > 1:
            a, b = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
            op = rng.choice("+-*/" if b != 0 else "+-*")
            pool.append({"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op])
        if pool[0].denominator == 1 and 1 <= pool[0] <= cfg.max_target and pool[0] not in numbers:
            return numbers, int(pool[0])


class CountdownTask(Task):
    """Prompt: `3 7 25 -> 178` and a newline; response: an expression (last line or <answer>)."""

    name = "countdown"
    max_new_tokens = 24

    def __init__(self, **config):
        self.config = CountdownConfig(**config)
        self._prompts = []
        for i in range(self.config.size):
            numbers, target = make_problem(random.Random(f"countdown:{self.config.seed}:{i}"), self.config)
            text = f"{' '.join(map(str, numbers))} -> {target}\n"
            self._prompts.append(Prompt(f"countdown-{self.config.seed}-{i}", text, {"numbers": numbers, "target": target}))

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    def grade(self, prompt: Prompt, response: str) -> Grade:
        ok, reason = check(prompt.meta["numbers"], prompt.meta["target"], extract_answer(response))
        return Grade(float(ok), ok, {"reason": reason})

    def reference_solutions(self, prompt: Prompt) -> list[str]:
        found = solve(prompt.meta["numbers"], prompt.meta["target"])
        return [] if found is None else [found]


def all_expressions(numbers: list[int], limit: int = 20000) -> dict[str, Fraction]:
    """Distinct expressions over sub-multisets of `numbers` (each used at most once) and their values,
    with no redundant outer parentheses; at most `limit` of them (search order is deterministic)."""
    found: dict[str, Fraction] = {}

    def grow(items: list[tuple[Fraction, str]]) -> None:
        if len(found) >= limit:
            return
        for value, text in items:
            found.setdefault(text[1:-1] if text.startswith("(") and _balanced(text[1:-1]) else text, value)
        for i in range(len(items)):
            for j in range(len(items)):
                if i == j or len(found) >= limit:
                    continue
                (a, ta), (b, tb) = items[i], items[j]
                rest = [x for k, x in enumerate(items) if k not in (i, j)]
                combos = [(a + b, f"({ta}+{tb})"), (a - b, f"({ta}-{tb})"), (a * b, f"({ta}*{tb})")]
                if b != 0:
                    combos.append((a / b, f"({ta}/{tb})"))
                for value, text in combos:
                    grow(rest + [(value, text)])

    grow([(Fraction(n), str(n)) for n in numbers])
    return found


def _balanced(text: str) -> bool:
    depth = 0
    for c in text:
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0
