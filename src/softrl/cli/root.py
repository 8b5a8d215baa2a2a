"""The `softrl` app: one module per command group (MODULES, side by side), and the groups other
installed packages add under the `softrl.commands` entry points (the benchmarks' `softrl bench`).
Each module names what it adds: COMMANDS (name -> function), GROUPS (name -> sub-app) and, where an
older spelling is kept, ALIASES ((group, name) -> function)."""

from __future__ import annotations

import os

import typer

from softrl.cli import annotate, data, models, sandbox, toy, train
from softrl.cli.common import DEBUG_ENV, err, finite_floats, one_line

MODULES = (train, data, annotate, models, toy, sandbox)

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="softrl: RL post-training of language models from any data: SPO (Soft Policy Optimization, "
                       "Cohen et al. 2025) and AGRO (Any-Generation Reward Optimization).")


@app.callback()
def main() -> None:
    """softrl: RL post-training of language models from any data: SPO (Soft Policy Optimization, Cohen et
    al. 2025) and AGRO (Any-Generation Reward Optimization)."""


for module in MODULES:
    for name, function in module.COMMANDS.items():
        app.command(name)(function)
    for name, group in module.GROUPS.items():
        app.add_typer(group, name=name)
# older spellings kept where users rely on them: (group, name) -> a command of another module
GROUPS = {name: group for module in MODULES for name, group in module.GROUPS.items()}
for module in MODULES:
    for (group, name), function in getattr(module, "ALIASES", {}).items():
        GROUPS[group].command(name)(function)


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
                      highlight=False, markup=False)
            continue
        target.add_typer(group, name=point.name)


add_installed_groups(app)


def command_line():
    """The click command of `app`, every float option finite: still part of loading the command line
    (a Ctrl-C here is the console script's to answer, not the command's)."""
    command = typer.main.get_command(app)
    finite_floats(command)
    return command


def click_errors() -> tuple:
    """(UsageError, ClickException, NoArgsIsHelpError, Abort) of the click that parses the command line:
    typer's own copy in the typer installed here, click itself in typers before it had one."""
    try:
        from typer._click import exceptions
        from typer.exceptions import Abort
    except ImportError:
        from click import exceptions
        from click.exceptions import Abort
    return exceptions.UsageError, exceptions.ClickException, getattr(exceptions, "NoArgsIsHelpError", ()), Abort


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
    usage, other, no_args, abort = click_errors()
    try:
        status = command.main(args, prog_name="softrl", standalone_mode=False)
    except no_args as e:  # `softrl data`: the group's help
        e.show()
        sys.exit(e.exit_code)
    except usage as e:  # a bad option or value: one line naming it, not a boxed usage text
        where = " ".join(["softrl", *e.ctx.command_path.split()[1:], "--help"]) if e.ctx else "softrl --help"
        typer.echo(f"error: {e.format_message()} ({where})", err=True)
        sys.exit(e.exit_code)
    except other as e:
        typer.echo(f"error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    except Exception as e:  # noqa: BLE001 - the boundary: one line, the traceback behind --debug
        typer.echo(f"error: {one_line(e)} (--debug shows where)", err=True)
        sys.exit(1)
    sys.exit(status if isinstance(status, int) else 0)
