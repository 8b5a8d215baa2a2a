"""A store written before `q0_rewards` existed still reads after `softrl data migrate`, and its
prompts get Q0 again."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from softrl.annotate.q0 import is_done, q0_row, soft_values
from softrl.data import ExperienceStore
from softrl.data.migrate import migrate
from softrl.data.schema import PROMPT_SCHEMA
from softrl.tasks.base import Prompt


def test_old_prompt_parts_read_with_null_rewards_and_are_estimated_again(tmp_path):
    old_dir = tmp_path / "old"
    (old_dir / "prompts").mkdir(parents=True)
    (old_dir / "softrl-store.json").write_text(json.dumps({"kind": "softrl-experience-store", "version": 1}))
    old_schema = pa.schema([f for f in PROMPT_SCHEMA if f.name != "q0_rewards"])
    old = {"prompt_id": "p1", "task": "t", "text": "x", "q0_hat": -0.5, "q0_k": 8, "q0_success": 0.25,
           "q0_beta": 0.1, "q0_model": "m", "meta": "{}", "updated_at": None}
    pq.write_table(pa.Table.from_pylist([old], schema=old_schema), old_dir / "prompts" / "part-00000000000000000000-old.parquet")
    report = migrate(old_dir, tmp_path / "new")
    assert report["prompts"]["rows"] == 1 and report["prompts"]["skipped"] == []
    store = ExperienceStore(tmp_path / "new")
    row = store.prompts()["p1"]
    assert row["q0_rewards"] is None and row["q0_k"] == 8
    assert not is_done(row, 8, "m")  # estimated again: its q0_hat is in the old r - 1 units
    store.put_prompts([q0_row(Prompt("p1", "x"), "t", [1.0, 0.5, 0.0, 0.0], [True, False, False, False], 0.1, "m")])
    row = store.prompts()["p1"]
    assert is_done(row, 4, "m") and row["q0_rewards"] == [1.0, 0.5, 0.0, 0.0]
    assert soft_values({"p1": row}, 0.1)["p1"] == row["q0_hat"] and 0 < row["q0_hat"] < 1
