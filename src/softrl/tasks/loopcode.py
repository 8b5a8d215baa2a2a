"""tinycode-loops: programs with a loop, a condition and an accumulator, composed from parts.

A problem reads integers, keeps those that pass a filter, maps each and reduces them ("Take those
that are even. Square each. Print their sum."), with constants drawn per problem. Its known
solutions are written from templates (a loop, and a list comprehension, each also with other
variable names); expected outputs come from running the first in-process (trusted code of this
module). The combinations of filter, map and reducer are split once: the bootstrap reference learns
from the `seen` ones, and the task's prompts (training and evaluation) are `heldout` combinations
whose programs it never saw, so it must compose parts it knows. That is where its headroom comes from.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from softrl.rewards.sandbox import Sandbox
from softrl.tasks.base import Prompt
from softrl.tasks.tinycode import GeneratedCodeTask, rename_variables, run_reference, wrong_programs


@dataclass(frozen=True)
class Part:
    name: str
    phrase: str  # the statement's sentence, `{k}` for the constant
    code: str  # an expression over `x`, `{k}` for the constant
    constants: tuple[int, ...] = ()


FILTERS = (
    Part("all", "Take all of them.", "True"),
    Part("even", "Take those that are even.", "x % 2 == 0"),
    Part("odd", "Take those that are odd.", "x % 2 == 1"),
    Part("positive", "Take those that are positive.", "x > 0"),
    Part("negative", "Take those that are negative.", "x < 0"),
    # not 0: "greater than 0" is `positive`'s very program, perhaps a held-out combination's
    Part("above", "Take those greater than {k}.", "x > {k}", tuple(k for k in range(-5, 10) if k)),
    Part("below", "Take those less than {k}.", "x < {k}", tuple(k for k in range(-5, 10) if k)),
    Part("multiple", "Take those divisible by {k}.", "x % {k} == 0", (3, 4, 5)),
)
MAPS = (
    Part("same", "", "x"),
    Part("square", "Square each.", "x * x"),
    Part("double", "Double each.", "2 * x"),
    Part("negate", "Negate each.", "-x"),
    Part("abs", "Take the absolute value of each.", "abs(x)"),
    Part("add", "Add {k} to each.", "x + {k}", tuple(range(1, 10))),
    Part("times", "Multiply each by {k}.", "x * {k}", tuple(range(3, 10))),
)
# reducer -> (sentence, loop: init / update (over `v`) / print, comprehension: print over `vs`)
REDUCERS = {
    "sum": ("Print their sum.", "t = 0", "t += v", "print(t)", "print(sum(vs))"),
    "count": ("Print how many there are.", "c = 0", "c += 1", "print(c)", "print(len(vs))"),
    "list": ("Print them in order, separated by spaces.", "r = []", "r.append(v)", "print(*r)", "print(*vs)"),
    "reverse": ("Print them in reverse order, separated by spaces.", "r = []", "r.append(v)", "print(*r[::-1])",
                "print(*vs[::-1])"),
    "max": ("Print the largest, or NONE if there is none.", "m = None", "if m is None or v > m:\n    m = v",
            "print('NONE' if m is None else m)", "print(max(vs) if vs else 'NONE')"),
    "min": ("Print the smallest, or NONE if there is none.", "m = None", "if m is None or v < m:\n    m = v",
            "print('NONE' if m is None else m)", "print(min(vs) if vs else 'NONE')"),
}
SPLITS = ("heldout", "seen")
HELDOUT_SHARE = 0.4


def combinations() -> list[tuple[Part, Part, str]]:
    """Every (filter, map, reducer); counting ignores the map, so only `same` is counted."""
    return [(f, m, r) for f in FILTERS for m in MAPS for r in REDUCERS if r != "count" or m.name == "same"]


def combination_name(f: Part, m: Part, r: str) -> str:
    return f"{f.name}-{m.name}-{r}"


def split_of(name: str) -> str:
    """A fixed split by a hash of the combination's name (stable across runs and machines)."""
    fraction = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "heldout" if fraction < HELDOUT_SHARE else "seen"


def _indent(block: str, depth: int) -> str:
    return "\n".join(" " * (4 * depth) + line for line in block.splitlines())


def programs(cond: str, value: str, reducer: str) -> list[str]:
    """The written solutions: a loop with a condition, and a list comprehension."""
    _, init, update, shown, comprehension = REDUCERS[reducer]
    body = update if value == "x" or reducer == "count" else f"v = {value}\n{update}"
    body = re.sub(r"\bv\b", "x", body) if value == "x" else body
    loop = (f"{init}\nfor x in map(int, input().split()):\n"
            + (_indent(body, 1) if cond == "True" else f"    if {cond}:\n{_indent(body, 2)}") + f"\n{shown}")
    kept = f"[{value} for x in xs]" if cond == "True" else f"[{value} for x in xs if {cond}]"
    listed = f"xs = [int(s) for s in input().split()]\nvs = {kept}\n{comprehension}"
    return [loop, listed]


def _ints(rng: random.Random) -> str:
    return " ".join(str(rng.randint(-20, 20)) for _ in range(rng.randint(1, 8)))


class LoopCodeTask(GeneratedCodeTask):
    """Prompt: the statement plus two examples; response: a Python program (fenced or bare); graded on
    the examples and `tests` hidden tests in the sandbox."""

    name = "tinycode-loops"
    max_new_tokens = 200

    def __init__(self, size: int = 200, seed: int = 0, tests: int = 5, split: str = "heldout",
                 sandbox: Sandbox | None = None):
        if split not in SPLITS:
            raise ValueError(f"unknown tinycode-loops split {split!r}; choose from {', '.join(SPLITS)}")
        if size < 1 or tests < 1:
            raise ValueError(f"size and tests must be >= 1, got size={size}, tests={tests}")
        self._sandbox = sandbox
        chosen = [c for c in combinations() if split_of(combination_name(*c)) == split]
        self._prompts = [self._problem(chosen, seed, i, tests, self.name) for i in range(size)]

    @staticmethod
    def _problem(chosen: list[tuple[Part, Part, str]], seed: int, i: int, tests: int, name: str) -> Prompt:
        """Problem `i` of `seed` (the same problems under every task built on these, ids of task `name`)."""
        rng = random.Random(f"tinycode-loops:{seed}:{i}")
        f, m, r = rng.choice(chosen)
        k_filter, k_map = (rng.choice(p.constants) if p.constants else 0 for p in (f, m))
        statement = " ".join(s for s in ("Read integers on one line.", f.phrase.format(k=k_filter),
                                         m.phrase.format(k=k_map), REDUCERS[r][0]) if s)
        written = programs(f.code.format(k=k_filter), m.code.format(k=k_map), r)
        solutions = written + [p for p in dict.fromkeys(map(rename_variables, written)) if p not in written]
        inputs = list(dict.fromkeys(_ints(rng) for _ in range(tests + 2)))
        cases = [(x, run_reference(solutions[0], x)) for x in inputs]
        examples = "\n".join(f"Input: {x}\nOutput: {y.strip()}" for x, y in cases[:2])
        return Prompt(f"{name}-{seed}-{i}", f"{statement}\n{examples}\n",
                      {"combination": combination_name(f, m, r), "tests": cases, "solutions": solutions,
                       "constants": (k_filter, k_map)})


# one-edit slips: a bound off by one, a wrong operation or accumulation. None turns one part into
# another, in text or in meaning (max into min, even into odd, square into double, count into sum, a
# reversal lost): that would teach another combination's program, perhaps a held-out one
MUTATIONS = ((" > ", " >= "), (" < ", " <= "), (" + ", " - "), ("t += ", "t = "), ("print(*r)", "print(r)"),
             ("print(*vs)", "print(vs)"), ("m = v", "m = x"), ("else 'NONE'", "else 0"))


def plausible_wrong(prompt: Prompt) -> list[str]:
    """Wrong programs for `prompt`, for the bootstrap's training: one-edit slips of its solutions, and the
    solutions of `seen` combinations one part away (the right program for a misread statement), each
    failing at least one of its tests. Never a held-out combination's program: the reference must not
    learn those, not even as a mistake."""
    f_name, m_name, r = prompt.meta["combination"].split("-")
    k_filter, k_map = prompt.meta["constants"]
    siblings = []
    for f, m, reducer in combinations():
        differs = (f.name != f_name) + (m.name != m_name) + (reducer != r)
        if differs == 1 and split_of(combination_name(f, m, reducer)) == "seen":
            k_f = k_filter if f.name == f_name or not f.constants else f.constants[len(f.constants) // 2]
            k_m = k_map if m.name == m_name or not m.constants else m.constants[len(m.constants) // 2]
            siblings.append(programs(f.code.format(k=k_f), m.code.format(k=k_m), reducer)[0])
    tests = prompt.meta["tests"]
    failing = [p for p in siblings if any(run_reference(p, x) != y for x, y in tests)]
    return wrong_programs(prompt.meta["solutions"], tests, MUTATIONS) + failing
