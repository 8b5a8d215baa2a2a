"""`softrl sandbox run|test|probe`: untrusted Python programs in the sandbox of the code rewards."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from softrl.cli.common import JSON_OPT, err, fail
from softrl.limits import MAX_SANDBOX_INPUT, MAX_TIMEOUT


sandbox_app = typer.Typer(no_args_is_help=True, help="Run untrusted Python programs in the sandbox.")


def _make_sandbox(backend: str, unsafe: bool, timeout: float, memory_mb: int):
    import warnings

    from softrl.rewards.sandbox import Limits, Sandbox, SandboxError

    if not 0 < timeout <= MAX_TIMEOUT or not memory_mb > 0:  # named as the options, not as the Limits fields
        fail(f"--timeout must be in (0, {MAX_TIMEOUT}] seconds and --memory-mb > 0, got --timeout {timeout}, "
             f"--memory-mb {memory_mb}")
    try:
        limits = Limits(wall_s=timeout, memory_mb=memory_mb)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sandbox = Sandbox(backend, limits, unsafe=unsafe)
        for w in caught:
            typer.echo(f"warning: {w.message}", err=True)
        return sandbox
    except (ValueError, SandboxError) as e:
        fail(str(e))


def _read_text(path: Path, what: str) -> str:
    """The file's text, read no further than the limit (a device such as /dev/zero never ends)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SANDBOX_INPUT + 1)
        if len(data) > MAX_SANDBOX_INPUT:
            fail(f"{what} {path} is over the {MAX_SANDBOX_INPUT // 2**20} MiB limit")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {what} {path}: {e}")


PROGRAM_ARG = typer.Argument(..., help="the Python program")
MEMORY_OPT = typer.Option(512, "--memory-mb", help="address-space limit, MiB")
BACKEND_OPT = typer.Option("auto", help="auto | bwrap | landlock | unsafe")
UNSAFE_OPT = typer.Option(False, "--unsafe", help="allow running unsandboxed when no backend works")


@sandbox_app.command("run")
def sandbox_run(
    program: Path = PROGRAM_ARG,
    stdin: Path = typer.Option(None, "--stdin", help="file given as standard input"),
    timeout: float = typer.Option(5.0, help="wall-clock limit, seconds (CPU limit too)"),
    memory_mb: int = MEMORY_OPT,
    backend: str = BACKEND_OPT,
    unsafe: bool = UNSAFE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Run PROGRAM once; status, output, exit code and times."""
    source = _read_text(program, "program")
    data = _read_text(stdin, "stdin file") if stdin else ""
    result = _make_sandbox(backend, unsafe, timeout, memory_mb).run(source, data)
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
    else:
        typer.echo(result.stdout, nl=False)
        typer.echo(result.stderr, err=True, nl=False)
        err.print(f"status: {result.status}  exit code: {result.exit_code}  wall: {result.wall_s:.3f} s")
    raise typer.Exit(0 if result.status == "passed" else 1)


@sandbox_app.command("test")
def sandbox_test(
    program: Path = PROGRAM_ARG,
    tests: Path = typer.Option(..., "--tests", help='JSONL, one {"input": ..., "output": ...} per line'),
    timeout: float = typer.Option(5.0, help="per-test wall-clock limit, seconds"),
    memory_mb: int = MEMORY_OPT,
    backend: str = BACKEND_OPT,
    unsafe: bool = UNSAFE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Run PROGRAM on every stdin/stdout test of TESTS in one sandbox."""
    source = _read_text(program, "program")
    cases = []
    for number, line in enumerate(_read_text(tests, "tests file").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as e:
            fail(f"{tests}:{number}: not a JSON test ({type(e).__name__}: {str(e)[:80]})")
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("input", "output")):
            fail(f"{tests}:{number}: a test needs string fields 'input' and 'output'")
        cases.append((record["input"], record["output"]))
    if not cases:
        fail(f"{tests}: no tests")
    results = _make_sandbox(backend, unsafe, timeout, memory_mb).run_tests(source, cases)
    passed = all(r.passed for r in results)
    if as_json:
        typer.echo(json.dumps({"passed": passed, "results": [
            {"status": r.status, "wall_s": r.wall_s, "exit_code": r.exit_code} for r in results]}))
    else:
        for i, r in enumerate(results, start=1):
            typer.echo(f"test {i}: {r.status} ({r.wall_s:.3f} s)")
        typer.echo("passed" if passed else "failed")
    raise typer.Exit(0 if passed else 1)


@sandbox_app.command("probe")
def sandbox_probe(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Which sandbox backend works on this machine, and why the others do not."""
    from softrl.rewards.sandbox import choose_backend, probe

    report = probe()
    try:
        chosen = choose_backend()
    except Exception:  # noqa: BLE001 - reported below as "none"
        chosen = None
    if as_json:
        typer.echo(json.dumps({"backends": {b: {"works": ok, "reason": why} for b, (ok, why) in report.items()},
                               "chosen": chosen}))
        return
    for backend, (ok, why) in report.items():
        typer.echo(f"{backend:9s} {'works' if ok else 'unavailable'}: {why}")
    typer.echo(f"default backend: {chosen or 'none (only unsafe=True would run programs)'}")


COMMANDS: dict = {}
GROUPS = {"sandbox": sandbox_app}
