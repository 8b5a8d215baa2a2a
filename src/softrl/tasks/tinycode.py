"""tinycode: tiny stdin/stdout programming problems, graded by running the response in the sandbox.

Each problem family has a statement, an input generator and a reference solution (Python source,
also the expected answer for tests). Expected outputs are computed by running the reference
solution in-process on the generated inputs (it is trusted code of this module).
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import sys
from dataclasses import dataclass

from softrl.rewards.sandbox import Limits, Sandbox
from softrl.tasks.base import Grade, Prompt, Task, extract_code
from softrl.tasks.code import grade_stdio


@dataclass(frozen=True)
class Family:
    name: str
    statement: str
    make_input: object  # (rng) -> str
    solution: str
    variants: tuple[str, ...] = ()  # other correct programs, written differently

    @property
    def solutions(self) -> list[str]:
        """The written programs, then each again with its variables renamed (a different correct text)."""
        written = [self.solution, *self.variants]
        return written + [r for r in dict.fromkeys(map(rename_variables, written)) if r not in written]


# one-letter names people also spell out; `x` and `i` stay (loop variables read fine either way)
RENAMES = {"xs": "nums", "s": "line", "n": "k", "w": "word", "t": "total", "m": "best", "c": "count", "r": "res",
           "f": "fibs", "a": "prev", "b": "cur"}


def rename_variables(program: str) -> str:
    return re.sub(r"\b(%s)\b" % "|".join(RENAMES), lambda m: RENAMES[m.group(1)], program)


def _ints(rng: random.Random, n_max: int = 8, lo: int = -20, hi: int = 20) -> str:
    return " ".join(str(rng.randint(lo, hi)) for _ in range(rng.randint(1, n_max)))


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdeilmnorstu") for _ in range(rng.randint(1, 9)))


FAMILIES = [
    Family("sum", "Read integers on one line and print their sum.", _ints,
           "print(sum(map(int, input().split())))",
           ("xs = [int(x) for x in input().split()]\nprint(sum(xs))",
            "t = 0\nfor x in input().split():\n    t += int(x)\nprint(t)",
            "s = input()\nprint(sum(int(v) for v in s.split()))", "import sys\nprint(sum(map(int, sys.stdin.read().split())))")),
    Family("max", "Read integers on one line and print the largest.", _ints,
           "print(max(map(int, input().split())))",
           ("xs = sorted(int(x) for x in input().split())\nprint(xs[-1])",
            "xs = list(map(int, input().split()))\nm = xs[0]\nfor x in xs:\n    m = max(m, x)\nprint(m)",
            "print(max(int(v) for v in input().split()))", "xs = list(map(int, input().split()))\nxs.sort()\nprint(xs[-1])")),
    Family("reverse", "Read a word and print it reversed.", _word, "print(input().strip()[::-1])",
           ("s = input().strip()\nprint(''.join(reversed(s)))", "s = input().strip()\nr = ''\nfor c in s:\n    r = c + r\nprint(r)",
            "w = input().strip()\nprint(w[::-1])", "s = list(input().strip())\ns.reverse()\nprint(''.join(s))")),
    Family("vowels", "Read a word and print how many vowels (a, e, i, o, u) it has.", _word,
           "print(sum(c in 'aeiou' for c in input()))",
           ("s = input()\nprint(len([c for c in s if c in 'aeiou']))",
            "n = 0\nfor c in input():\n    if c in 'aeiou':\n        n += 1\nprint(n)",
            "w = input()\nprint(sum(w.count(v) for v in 'aeiou'))", "print(len([c for c in input() if c in 'aeiou']))")),
    Family("sort", "Read integers on one line and print them in increasing order, separated by spaces.", _ints,
           "print(*sorted(map(int, input().split())))",
           ("xs = sorted(int(x) for x in input().split())\nprint(' '.join(map(str, xs)))",
            "xs = list(map(int, input().split()))\nxs.sort()\nprint(*xs)",
            "print(*sorted(int(v) for v in input().split()))", "xs = sorted(map(int, input().split()))\nprint(*xs)")),
    Family("square", "Read an integer n and print n squared.", lambda r: str(r.randint(-99, 99)),
           "n = int(input())\nprint(n * n)", ("print(int(input()) ** 2)", "n = int(input())\nprint(n ** 2)",
           "x = int(input())\nprint(x * x)", "n = abs(int(input()))\nprint(n * n)")),
    Family("palindrome", "Read a word and print YES if it reads the same backwards, otherwise NO.",
           lambda r: (lambda w: w + w[::-1][r.randint(0, 1):] if r.random() < 0.5 else w)(_word(r)),
           "w = input().strip()\nprint('YES' if w == w[::-1] else 'NO')",
           ("s = input().strip()\nif s == s[::-1]:\n    print('YES')\nelse:\n    print('NO')",
            "s = input().strip()\nprint(['NO', 'YES'][s == ''.join(reversed(s))])",
            "w = input().strip()\nif w[::-1] == w:\n    print('YES')\nelse:\n    print('NO')", "w = input().strip()\nok = w == w[::-1]\nprint('YES' if ok else 'NO')")),
    Family("fib", "Read n (0 <= n <= 30) and print the n-th Fibonacci number (F0 = 0, F1 = 1).",
           lambda r: str(r.randint(0, 30)), "a, b = 0, 1\nfor _ in range(int(input())):\n    a, b = b, a + b\nprint(a)",
           ("n = int(input())\nf = [0, 1]\nfor i in range(n):\n    f.append(f[-1] + f[-2])\nprint(f[n])",
            "a, b = 0, 1\nn = int(input())\nwhile n:\n    a, b = b, a + b\n    n -= 1\nprint(a)",
            "n = int(input())\na, b = 0, 1\nfor i in range(n):\n    a, b = b, a + b\nprint(a)", "x, y = 0, 1\nfor _ in range(int(input())):\n    x, y = y, x + y\nprint(x)")),
    Family("count-even", "Read integers on one line and print how many are even.", _ints,
           "print(sum(int(x) % 2 == 0 for x in input().split()))",
           ("print(len([x for x in input().split() if int(x) % 2 == 0]))",
            "c = 0\nfor x in map(int, input().split()):\n    if x % 2 == 0:\n        c += 1\nprint(c)",
            "xs = list(map(int, input().split()))\nprint(sum(1 for x in xs if x % 2 == 0))", "print(sum(1 - int(x) % 2 for x in input().split()))")),
    Family("factorial", "Read n (0 <= n <= 12) and print n factorial.", lambda r: str(r.randint(0, 12)),
           "import math\nprint(math.factorial(int(input())))",
           ("n = int(input())\nr = 1\nfor i in range(2, n + 1):\n    r *= i\nprint(r)",
            "from math import prod\nprint(prod(range(1, int(input()) + 1)))",
            "n = int(input())\nf = 1\nwhile n > 1:\n    f *= n\n    n -= 1\nprint(f)", "from math import factorial\nprint(factorial(int(input())))")),
]


def run_reference(source: str, stdin: str) -> str:
    """Run a trusted reference solution in-process, capturing stdout."""
    stream, out = io.StringIO(stdin), io.StringIO()

    def read_line(*_):
        line = stream.readline()
        if not line:
            raise EOFError("EOF when reading a line")
        return line.rstrip("\n")

    saved_stdin, sys.stdin = sys.stdin, stream
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, "reference.py", "exec"), {"__name__": "__main__", "input": read_line})
    finally:
        sys.stdin = saved_stdin
    return out.getvalue()


class GeneratedCodeTask(Task):
    """Generated stdin/stdout problems whose prompts carry their tests and known solutions in `meta`,
    graded in the sandbox; subclasses fill `_prompts`."""

    parallel_grading = True
    _prompts: list[Prompt]
    _sandbox: Sandbox | None = None

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox(limits=Limits(wall_s=1.0, memory_mb=256))
        return self._sandbox

    def prompts(self) -> list[Prompt]:
        return list(self._prompts)

    def grade(self, prompt: Prompt, response: str) -> Grade:
        return grade_stdio(self.sandbox, extract_code(response), prompt.meta["tests"])

    def reference_solutions(self, prompt: Prompt) -> list[str]:
        return list(prompt.meta["solutions"])


class TinyCodeTask(GeneratedCodeTask):
    """Prompt: statement plus two examples; response: a Python program (fenced or bare)."""

    name = "tinycode"
    max_new_tokens = 120

    def __init__(self, size: int = 200, seed: int = 0, tests: int = 5, families: list[str] | None = None,
                 sandbox: Sandbox | None = None):
        known = {f.name: f for f in FAMILIES}
        chosen = families or list(known)
        unknown = [f for f in chosen if f not in known]
        if unknown:
            raise ValueError(f"unknown tinycode family {unknown[0]!r}; choose from {', '.join(known)}")
        if size < 1 or tests < 1:
            raise ValueError(f"size and tests must be >= 1, got size={size}, tests={tests}")
        self._sandbox = sandbox
        self._prompts = []
        for i in range(size):
            rng = random.Random(f"tinycode:{seed}:{i}")
            family = known[chosen[i % len(chosen)]]
            inputs = list(dict.fromkeys(family.make_input(rng) for _ in range(tests + 2)))
            cases = [(x, run_reference(family.solution, x)) for x in inputs]
            examples = "\n".join(f"Input: {x}\nOutput: {y.strip()}" for x, y in cases[:2])
            text = f"{family.statement}\n{examples}\n"
            self._prompts.append(Prompt(f"tinycode-{seed}-{i}", text, {"family": family.name, "tests": cases,
                                                                       "solutions": family.solutions}))


MUTATIONS = (("sum(", "max("), ("max(", "min("), ("[::-1]", ""), (" + ", " - "), ("n * n", "n * 2"), ("** 2", "** 3"),
             ("'YES'", "'NO'"), ("% 2 == 0", "% 2 == 1"), ("[-1]", "[0]"), ("range(2, n + 1)", "range(2, n)"),
             ("'aeiou'", "'aeio'"), ("sorted(", "list("), ("r = 1", "r = 2"), ("0, 1", "1, 1"), ("+ 1)", ")"))


def wrong_programs(solutions: list[str], tests: list[tuple[str, str]],
                   mutations: tuple[tuple[str, str], ...] = MUTATIONS) -> list[str]:
    """Plausible wrong programs: one-edit mutants of the correct ones that fail at least one test."""
    out = []
    for program in solutions:
        for old, new in mutations:
            if old in program:
                mutant = program.replace(old, new, 1)
                try:
                    wrong = any(run_reference(mutant, x).split() != y.split() for x, y in tests)
                except Exception:  # noqa: BLE001 - a mutant that crashes is wrong too
                    wrong = True
                if wrong and mutant not in out:
                    out.append(mutant)
    return out
