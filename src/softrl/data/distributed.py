"""The store's statistics and the per-prompt rewards that Q0 is made of, on Ray Data, for a store that
outgrows one machine: the cluster's workers each read some of the table's pieces (the storage's
`distributed` reader at the snapshot's version), and the first copy of each id is found by a
distributed group-by, not in one process's memory. The same answers as `ExperienceStore.stats` and
`ExperienceStore.rewards_by_prompt` (tests/test_store.py checks each pair on one store)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from softrl.data.pool import id_keys
from softrl.data.storage import HANDLE, Table
from softrl.data.store import PROMPT_REWARDS, ExperienceStore, Snapshot, StoreError, TargetIndex
from softrl.network import NetworkError, ray_module, start_or_join_ray

COLUMNS = ["id", "source", "prompt_id", "passed", "reward", "mc_targets"]
MAX_PARTITIONS = 64


def connected():
    """The `ray` module, connected to the cluster of `RAY_ADDRESS` (a local Ray on loopback started when
    none is; `network.start_or_join_ray`), with the sort-based shuffle that this module's group-bys use."""
    address = os.environ.get("RAY_ADDRESS") or None
    try:
        ray = ray_module(address)
        import ray.data
        from ray.data.context import DataContext, ShuffleStrategy
    except ImportError:
        raise StoreError("--ray needs Ray Data: pip install 'softrl[ray]'") from None
    # the default hash shuffle starts aggregator actors: about 50 s before a group-by of 100 rows here
    DataContext.get_current().shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    if not ray.is_initialized():
        try:
            start_or_join_ray(ray, address, "RAY_ADDRESS", include_dashboard=False, log_to_driver=False,
                              configure_logging=False)
        except NetworkError as e:
            raise StoreError(str(e)) from None
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"the Ray cluster at {address} (RAY_ADDRESS)" if address else "a local Ray"
            raise StoreError(f"{where}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return ray


def first_copy(group: pa.Table) -> pa.Table:
    """The row of a group of one id's copies committed first (the lowest row handle)."""
    return group.take([int(np.argmin(group[HANDLE].to_numpy()))])


def partitions(table: Table, version: int) -> int:
    return min(MAX_PARTITIONS, max(1, table.parts(version)))  # Ray's default 200: minutes of tasks


def stats_on_ray(store: ExperienceStore, snapshot: Snapshot | None = None) -> dict[str, Any]:
    """`store.stats(snapshot)`, computed by Ray Data on the Ray cluster this process is connected to
    (a local one is started when none is; `RAY_ADDRESS` names a cluster)."""
    connected()
    from ray.data.aggregate import Count, Sum

    snapshot = snapshot or store.snapshot()
    notes = store.annotations(snapshot)  # small beside the trajectories: sent to every reader
    targets = TargetIndex(notes)
    table = store.tables["trajectories"]

    def flags(batch: pa.Table) -> pa.Table:
        """Per row: its id, handle, source, prompt, passed and reward as numbers, whether it has MC targets."""
        keys = id_keys(batch["id"])
        known = {f"{k}_known": pc.cast(pc.is_valid(batch[k]), pa.int64()) for k in ("passed", "reward")}
        return pa.table({"id": batch["id"], HANDLE: batch[HANDLE], "source": batch["source"],
                         "prompt_id": batch["prompt_id"], "passed": pc.cast(batch["passed"], pa.int64()),
                         "reward": batch["reward"], **known,  # a null is left out of the means, as locally
                         "targets": pa.array(targets.of(keys, batch["mc_targets"]).astype(np.int64))})

    version = snapshot.versions["trajectories"]
    stored = table.count(version)
    if not stored:
        return store.summary(snapshot, {}, 0, 0)
    parts = partitions(table, version)
    rows = table.distributed(version, COLUMNS)
    kept = rows.map_batches(flags, batch_format="pyarrow").groupby("id", num_partitions=parts) \
        .map_groups(first_copy, batch_format="pyarrow")
    # one row per (source, prompt): small enough to finish here
    grouped = pa.Table.from_pylist(kept.groupby(["source", "prompt_id"], num_partitions=parts).aggregate(
        Count(), Sum("passed"), Sum("reward"), Sum("targets"), Sum("passed_known"), Sum("reward_known")).take_all())
    per_source = {}
    for source in sorted(set(grouped["source"].to_pylist())):
        part = grouped.filter(pc.equal(grouped["source"], source))
        total = {c: pc.sum(part[f"sum({c})"]).as_py() or 0 for c in ("passed", "reward", "targets", "passed_known",
                                                                     "reward_known")}
        mean = {c: total[c] / total[f"{c}_known"] if total[f"{c}_known"] else None for c in ("passed", "reward")}
        per_source[source] = {"trajectories": pc.sum(part["count()"]).as_py(), "prompts": part.num_rows,
                              "pass_rate": mean["passed"], "mean_reward": mean["reward"],
                              "with_mc_targets": total["targets"]}
    return store.summary(snapshot, per_source, stored, len(pc.unique(grouped["prompt_id"])))


def rewards_on_ray(store: ExperienceStore, source: str, snapshot: Snapshot | None = None) -> pa.Table:
    """`store.rewards_by_prompt(source, snapshot)` on Ray Data: the source's rows read in pieces with the
    filter pushed down (four small columns), first copies by a group-by on the id, then one row per
    prompt with its rewards in commit order; the prompts' texts are taken here, one row each."""
    connected()
    snapshot = snapshot or store.snapshot()
    table = store.tables["trajectories"]
    version = snapshot.versions["trajectories"]
    if not table.count(version, pc.field("source") == source):
        return PROMPT_REWARDS.empty_table()

    def per_prompt(group: pa.Table) -> pa.Table:
        group = group.sort_by(HANDLE)
        return pa.table({"prompt_id": group["prompt_id"][:1], HANDLE: group[HANDLE][:1],
                         "rewards": [group["reward"].to_pylist()], "passed": [group["passed"].to_pylist()]})

    parts = partitions(table, version)
    rows = table.distributed(version, ["id", "prompt_id", "reward", "passed"], {"source": source})
    firsts = rows.groupby("id", num_partitions=parts).map_groups(first_copy, batch_format="pyarrow")
    found = pa.Table.from_pylist(firsts.groupby("prompt_id", num_partitions=parts).map_groups(
        per_prompt, batch_format="pyarrow").take_all())
    return store.prompt_rewards(snapshot, found["prompt_id"].to_pylist(), found[HANDLE].to_numpy(),
                                found["rewards"].to_pylist(), found["passed"].to_pylist())
