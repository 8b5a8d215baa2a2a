"""`softrl data ...`: the experience store (import, export, stats, q0, dedupe, migrate, tag, restore, compact). Results go to
stdout (with `--json`, one JSON document), messages to stderr."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from softrl.cli.common import JSON_OPT, STORE_OPT, err, fail, one_line, open_store, out as stdout, store_errors

data_app = typer.Typer(no_args_is_help=True, help="The experience store: import, export, stats, q0, dedupe, migrate, tag, restore, compact.")


@data_app.command("import")
def data_import(
    file: Path = typer.Argument(None, help="JSONL / JSON / Parquet of {prompt, response, reward} records, or an export"),
    source: str = typer.Option(None, "--source", help="source name for the rows, e.g. human or import:mydata"),
    solutions: str = typer.Option(None, "--solutions", help="instead of FILE: the known solutions of this task"),
    task: str = typer.Option("", "--task", help="task of records that name none; a record of it whose prompt is one "
                                                "of the task's prompts gets that prompt's id"),
    model: str = typer.Option(None, "--model", help="check rows' token ids against this model's vocabulary and "
                                                    "their lengths against its positions"),
    store: str = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Add trajectories to the store (all or nothing: a bad record writes nothing)."""
    from softrl.data.io import check_conflicts, read_trajectories, task_solutions

    if (file is None) == (solutions is None):
        fail("give either FILE or --solutions TASK")
    try:
        if solutions is not None:
            rows = task_solutions(_load_task(solutions), source or "human")
        else:
            vocabulary = _vocabulary(model, task) if model else None
            prompt_ids = _prompt_ids(task) if task else None
            rows = read_trajectories(file, source, task, prompt_ids, vocabulary)
            check_conflicts(rows, str(file))
            if model:
                _check_lengths(rows, model, task, file)
            if prompt_ids is not None:
                _say_unmatched(rows, task, prompt_ids)
    except (ValueError, OSError) as e:  # RecordError, ModelLoadError and ConfigError are ValueErrors
        fail(str(e))
    if not rows:  # an empty or mistyped file made an empty store where the user meant data
        fail(f"{file or solutions}: no records in it; nothing imported")
    target = open_store(store)  # a damaged table refuses the append itself
    with store_errors():
        written = target.append(rows)
    if as_json:
        typer.echo(json.dumps({"imported": written, "repeated": len(rows) - written, "store": str(target.root)}))
        return
    err.print(f"imported {written} trajectories ({len(rows) - written} repeated within the input) into {target.root}")


def _check_lengths(rows, model: str, task: str, file: Path) -> None:
    """A ValueError naming the first row longer than `model`'s positions, tokenised as a run would feed it."""
    from softrl.assemble import model_directory
    from softrl.models.loading import (encode_episode, encode_prompt, encode_response, load_tokenizer,
                                       model_positions, tokenizer_fingerprint)
    from softrl.training.batch import row_tokens, too_long_row

    directory = model_directory(model, task or "countdown")
    tok = load_tokenizer(directory)
    fingerprint = tokenizer_fingerprint(tok)
    positions = model_positions(directory)
    long = too_long_row([r.to_row() for r in rows], positions,
                        lambda row: row_tokens(row, fingerprint, lambda t: encode_prompt(tok, t),
                                               lambda t: encode_response(tok, t),
                                               lambda p, t: encode_episode(tok, p, t)), fingerprint)
    if long:
        raise ValueError(f"{file}: record {long[0] + 1} is {long[1]:,} tokens long, over the {positions:,} positions "
                         f"of model {model}: no run of it can train on the record; nothing was imported")


def _load_task(spec: str):
    from softrl.tasks.registry import load_task

    return load_task(spec)


def _prompt_ids(task: str) -> dict | None:
    """The prompts of `task` (its default size and seed) by text, or None (said) where it does not load."""
    from softrl.data.io import task_prompt_ids

    try:
        return task_prompt_ids(_load_task(task))
    except (ValueError, TypeError, OSError, ImportError) as e:
        err.print(f"note: task {task!r} does not load ({one_line(e)}): records keep prompt ids made from their "
                  "text, which a run of a task trains on only where they are its prompts' ids",
                  markup=False, highlight=False, soft_wrap=True)
        return None


def _say_unmatched(rows, task: str, prompt_ids: dict) -> None:
    """One line where records of `task` have prompts that are none of its prompts."""
    ids = {i for i, _ in prompt_ids.values()}
    unmatched = [r for r in rows if r.task == task and r.prompt_id not in ids]
    if unmatched:
        err.print(f"note: {len(unmatched)} of the {len(rows)} records have prompts that are none of task {task}'s "
                  f"(at its default size and seed; e.g. {unmatched[0].prompt_text[:60]!r}): they keep prompt ids made "
                  "from their text, which a run of the task does not train on; give them the task's 'prompt_id' where "
                  "they are its prompts", markup=False, highlight=False, soft_wrap=True)


def _vocabulary(model: str, task: str) -> tuple[str, int]:
    """`--model` (a directory, a hub id, 'bootstrap' or a prepared name) as (tokenizer fingerprint, ids)."""
    from softrl.assemble import model_directory
    from softrl.models.loading import vocabulary

    return vocabulary(model_directory(model, task or "countdown"))


@data_app.command("export")
def data_export(
    out: Path = typer.Argument(..., help="output file: .parquet, .jsonl or .jsonl.gz; NAME.hf: a Hugging Face dataset"),
    source: list[str] = typer.Option(None, "--source", help="only these sources (repeatable)"),
    task: list[str] = typer.Option(None, "--task", help="only these tasks (repeatable)"),
    passed: bool = typer.Option(None, "--passed/--failed", help="only passed (or only failed) trajectories"),
    form: str = typer.Option("rows", "--format", help="rows: every column of the store; chat: each row as an "
                             "OpenAI chat conversation ({messages, reward, ...}; .jsonl), what `data import` reads"),
    store: str = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Write the store's trajectories (deduplicated, MC targets joined) to a file."""
    from softrl.data.io import export

    target = open_store(store, create=False)
    with store_errors():  # streamed: the pool holds row addresses and narrow columns, rows are taken 10,000 at a time
        pool = target.pool(source=source or None, task=task or None, passed=passed, copy=False)  # one pass
    try:
        with store_errors():
            n = export(pool.tables(), out, store, form)
    except (ValueError, OSError) as e:  # a write error from a file object names no path: this one is it
        fail(str(e) if str(out) in str(e) else f"{out}: {one_line(e)}")
    if as_json:
        typer.echo(json.dumps({"exported": n, "file": str(out)}))
        return
    err.print(f"exported {n} trajectories to {out}")


@data_app.command("stats")
def data_stats(store: str = STORE_OPT, as_json: bool = JSON_OPT,
               on_ray: bool = typer.Option(False, "--ray", help="compute on Ray Data: the cluster of RAY_ADDRESS, "
                                                                   "else a local Ray (a store beyond one machine)")) -> None:
    """Trajectories, prompts and pass rate per source: a table on stdout (--json: the same figures as JSON)."""
    target = open_store(store, create=False)
    with store_errors():
        if on_ray:
            from softrl.data.distributed import stats_on_ray

            stats = stats_on_ray(target)
        else:
            stats = target.stats()
    if as_json:
        typer.echo(json.dumps(stats))
        return
    table = Table(title=f"{target.root}: {stats['trajectories']} trajectories, {stats['prompts']} prompts "
                        f"({stats['prompts_with_q0']} with Q0), {stats['duplicates']} duplicate rows")
    for column in ("source", "trajectories", "prompts", "pass rate", "mean reward", "with MC targets"):
        table.add_column(column, justify="left" if column == "source" else "right")
    for source, s in stats["sources"].items():
        table.add_row(source, str(s["trajectories"]), str(s["prompts"]), f"{s['pass_rate']:.3f}",
                      f"{s['mean_reward']:.3f}", str(s["with_mc_targets"]))
    stdout.print(table)


@data_app.command("dedupe")
def data_dedupe(store: str = STORE_OPT, as_json: bool = JSON_OPT) -> None:
    """Commit the store's trajectories without duplicate rows, as a new version (older versions stay readable)."""
    target = open_store(store, create=False)  # a damaged table fails the read, or refuses the deletion
    with store_errors():
        before, after = target.dedupe()
    if as_json:
        typer.echo(json.dumps({"before": before, "after": after, "removed": before - after}))
        return
    err.print(f"{before} rows -> {after} trajectories ({before - after} duplicates removed)")


@data_app.command("migrate")
def data_migrate(
    old: str = typer.Argument(..., help="a store of the old format (a directory of Parquet part files)"),
    new: str = typer.Argument(..., help="the new store: a new directory or s3://bucket/prefix"),
    as_json: bool = JSON_OPT,
) -> None:
    """Copy an old-format store into a new store, checking each table's rows and content hash (OLD is kept)."""
    from softrl.data.migrate import migrate

    with store_errors():
        report = migrate(old, new)
    for table in report.values():
        for line in table["skipped"]:
            err.print(f"[yellow]skipped[/yellow] {line}", markup=True, highlight=False, soft_wrap=True)
    if as_json:
        typer.echo(json.dumps({"from": old, "to": new, "tables": report}))
        return
    for name, table in report.items():
        stdout.print(f"{name}: {table['rows']} rows, sha256 {table['sha256'][:16]} (checked)", highlight=False)
    err.print(f"migrated {old} -> {new}; {old} is unchanged")


@data_app.command("tag")
def data_tag(
    name: str = typer.Argument(..., help="the tag, e.g. paper-v1"),
    version: int = typer.Option(None, "--version", help="the trajectories table's version (default: the newest)"),
    delete: bool = typer.Option(False, "--delete", help="remove the tag instead (a user's, or the hold of a run "
                                                        "that will not be resumed: `data compact` lists them)"),
    store: str = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Tag every table's version (the newest, or as of --version) so that it survives `data compact`;
    a run reads it with data.store_version=NAME."""
    from softrl.data.versions import tag, untag

    if delete and version is not None:
        fail("--version tags a version; --delete removes a tag from every version: give one of them")
    target = open_store(store, create=False)
    if delete:
        with store_errors():
            gone = untag(target, name)
        if as_json:
            typer.echo(json.dumps({"deleted": name, "versions": gone}))
        else:
            err.print(f"deleted tag {name} (it kept trajectories version {gone['trajectories']})")
        return
    with store_errors():
        snapshot = tag(target, name, version)
    if as_json:
        typer.echo(json.dumps({"tag": name, "versions": snapshot.versions}))
        return
    err.print(f"tagged {name}: " + ", ".join(f"{t} version {v}" for t, v in snapshot.versions.items()))


@data_app.command("restore")
def data_restore(
    at: str = typer.Argument(..., help="a version of the trajectories table, or a tag"),
    store: str = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Make an earlier version (or a tag) of every table the newest again, as a new version: the way back
    from a damaged table (the versions between stay readable)."""
    from softrl.data.versions import restore

    target = open_store(store, create=False)
    with store_errors():
        snapshot = restore(target, int(at) if at.isdigit() else at)
    if as_json:
        typer.echo(json.dumps({"restored": at, "versions": snapshot.versions}))
        return
    err.print(f"restored {at}: " + ", ".join(f"{t} now version {v}" for t, v in snapshot.versions.items()))


@data_app.command("compact")
def data_compact(
    keep: int = typer.Option(1, "--keep-versions", min=1, help="newest versions kept (tagged ones always are)"),
    store: str = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Rewrite each table into one piece (rows and their order unchanged) and remove old versions
    but the newest --keep-versions and tagged ones (a running run's snapshot is tagged: kept); a finished
    run pinned to a removed version (data.store_version) can no longer read it."""
    from softrl.data.versions import compact, holds

    target = open_store(store, create=False, writes=True)  # every table checked first: none compacted of a damaged store
    with store_errors():
        report, held = compact(target, keep), holds(target)
    if as_json:
        typer.echo(json.dumps({"store": target.root, "tables": report, "held_by_runs": held}))
        return
    for name, table in report.items():
        err.print(f"{name}: {'compacted' if table['rewritten'] else 'already compact'}, "
                  f"{table['versions_removed']} old versions removed")
    for name, version in held.items():
        err.print(f"kept: trajectories version {version}, held by a run that reads it until it finishes ({name}; "
                  f"a run that will not be resumed: softrl data tag {name} --delete)", highlight=False, soft_wrap=True)


COMMANDS: dict = {}
GROUPS = {"data": data_app}
