"""The store's statistics on Ray Data, for a store that outgrows one machine: the cluster's workers
each read some of the table's fragments (`ray.data.read_lance` at the snapshot's version), and the
first copy of each id is found by a distributed group-by, not in one process's memory. The same
answer as `ExperienceStore.stats` (tests/test_store.py checks both on one store)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from softrl.data.pool import id_keys
from softrl.data.store import ADDRESS, ExperienceStore, Snapshot, with_mc_targets

COLUMNS = ["id", "source", "prompt_id", "passed", "reward", "mc_targets"]


def stats_on_ray(store: ExperienceStore, snapshot: Snapshot | None = None) -> dict[str, Any]:
    """`store.stats(snapshot)`, computed by Ray Data on the Ray cluster this process is connected to
    (a local one is started when none is; `RAY_ADDRESS` names a cluster)."""
    import ray
    import ray.data
    from ray.data.aggregate import Count, Sum
    from ray.data.context import DataContext, ShuffleStrategy

    # the default hash shuffle starts aggregator actors: about 50 s before a group-by of 100 rows here
    DataContext.get_current().shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    snapshot = snapshot or store.snapshot()
    notes = store.annotations(snapshot)  # small beside the trajectories: sent to every reader
    annotated = id_keys(pa.array([k for k, v in notes.items() if v], pa.string()))
    emptied = id_keys(pa.array([k for k, v in notes.items() if not v], pa.string()))
    table = store.tables["trajectories"]

    def flags(batch: pa.Table) -> pa.Table:
        """Per row: its id, address, source, prompt, passed and reward as numbers, whether it has MC targets."""
        keys = id_keys(batch["id"])
        return pa.table({"id": batch["id"], ADDRESS: batch[ADDRESS], "source": batch["source"],
                         "prompt_id": batch["prompt_id"], "passed": pc.cast(batch["passed"], pa.int64()),
                         "reward": batch["reward"],
                         "targets": pa.array(with_mc_targets(keys, batch["mc_targets"], annotated, emptied).astype(np.int64))})

    def first_copy(group: pa.Table) -> pa.Table:
        return group.take([int(np.argmin(group[ADDRESS].to_numpy()))])

    version = table.at(snapshot.versions["trajectories"])
    total = version.count_rows()
    if not total:
        return store.summary(snapshot, {}, 0, 0)
    parts = max(1, len(version.get_fragments()))  # Ray's default of 200 shuffle partitions: minutes of tasks
    rows = ray.data.read_lance(table.uri, version=snapshot.versions["trajectories"], columns=COLUMNS,
                               storage_options=table.options, scanner_options={"with_row_address": True})
    kept = rows.map_batches(flags, batch_format="pyarrow").groupby("id", num_partitions=parts) \
        .map_groups(first_copy, batch_format="pyarrow")
    # one row per (source, prompt): small enough to finish here
    grouped = pa.Table.from_pylist(kept.groupby(["source", "prompt_id"], num_partitions=parts).aggregate(
        Count(), Sum("passed"), Sum("reward"), Sum("targets")).take_all())
    per_source = {}
    for source in sorted(set(grouped["source"].to_pylist())):
        part = grouped.filter(pc.equal(grouped["source"], source))
        count = pc.sum(part["count()"]).as_py()
        per_source[source] = {"trajectories": count, "prompts": part.num_rows,
                              "pass_rate": pc.sum(part["sum(passed)"]).as_py() / count,
                              "mean_reward": pc.sum(part["sum(reward)"]).as_py() / count,
                              "with_mc_targets": pc.sum(part["sum(targets)"]).as_py()}
    return store.summary(snapshot, per_source, total, len(pc.unique(grouped["prompt_id"])))
