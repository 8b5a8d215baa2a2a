"""Stored rows a run's offline pool leaves out because they are not its task's prompts: rows of its
sources that name no task, or whose prompt ids are none of the task's (e.g. human records imported
with ids made from their text). Said in one line: how many of which source, an example prompt id
from the store and one from the task, and how to import them so that a run trains on them."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import pyarrow.compute as pc

from softrl.data.store import ExperienceStore, Snapshot

TEXT_ID = re.compile(r"prompt-[0-9a-f]{16}")  # `tasks.base.prompt_id_of`: an id made from a prompt's text


def unmatched_rows(store: ExperienceStore, sources: list[str], task: str, prompt_ids: Sequence[str],
                   passed: bool | None = None, other_prompts: bool = False, snapshot: Snapshot | None = None) -> str | None:
    """The line that says which rows of `sources` (passed ones only with `passed`) a run of `task`
    with `prompt_ids` leaves out although they may be meant for it, or None: rows that name no task,
    and rows of `task` whose ids were made from a text that is none of its prompts'. `other_prompts`:
    also rows of the task's other prompts (ids of another task.size or task.seed); rows naming
    another task are that task's. Read at `snapshot` (the newest versions without one)."""
    nameless_or_foreign = pc.field("task").is_null() | (pc.field("task") == "") \
        | ((pc.field("task") == task) & ~pc.field("prompt_id").isin(list(prompt_ids)))
    candidates = store.trajectories(snapshot, source=sources, passed=passed, columns=["id"], unique=False,
                                    where=nameless_or_foreign)["id"].to_pylist()  # few: read by filter
    # the first copy of each of their ids among all rows of the sources decides, as the pool's reads do
    table = store.trajectories(snapshot, source=sources, passed=passed, columns=["source", "task", "prompt_id"],
                               where=pc.field("id").isin(candidates)) if candidates else None
    if table is None:
        return None
    ids, first = set(prompt_ids), next(iter(prompt_ids), None)
    per_source: Counter[str] = Counter()
    foreign, nameless, split, example, example_of_split = 0, 0, 0, None, False
    for source, named, prompt_id in zip(table["source"].to_pylist(), table["task"].to_pylist(),
                                        table["prompt_id"].to_pylist()):
        nameless_row, foreign_row = not named, prompt_id not in ids
        if named not in (task, "", None) or not (nameless_row or foreign_row):
            continue
        of_split = not nameless_row and not TEXT_ID.fullmatch(prompt_id or "")
        if of_split and not other_prompts:
            continue
        per_source[source] += 1
        nameless += nameless_row
        split += of_split
        if foreign_row:
            foreign += 1
            if example is None or (example_of_split and not of_split):  # rather one of the rows meant for it
                example, example_of_split = prompt_id, of_split
    if not per_source:
        return None
    total, reasons = sum(per_source.values()), []
    if foreign:
        which = ("its prompt id is" if total == 1 else "their prompt ids are") if foreign == total \
            else f"{foreign} have prompt ids that are"
        reasons.append(f"{which} none of task {task}'s {len(ids)} prompt ids (e.g. {example!r} in the store"
                       + (f", {first!r} in the task)" if first else ")"))
    if nameless:
        reasons.append("it names no task" if total == 1
                       else f"{'they' if nameless == total else nameless} name no task")
    counts = ", ".join(f"{n} {s}" for s, n in per_source.most_common())
    source = next(iter(per_source)) if len(per_source) == 1 else "SOURCE"
    fix = ""
    if split < total:
        fix = (f"import them again with `softrl data import FILE --source {source} --task {task}` (a record whose "
               "prompt is one of the task's prompts gets that prompt's id), or give each record its task prompt's "
               "'prompt_id'")
    if split:
        fix += ("; " if fix else "") + (f"{split} are of other prompts of the task: rows for a run of another "
                                        "task.size or task.seed")
    rows = "row in {} is" if total == 1 else "rows in {} are"
    return f"{counts} {rows.format(store.root)} not trained on: {'; '.join(reasons)}: {fix}"
