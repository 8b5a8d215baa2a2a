"""The Trajectory: one row of the experience store (docs/DATA.md, "The store"), and the prompts and annotations tables.

Arrow schemas are the contract of the store's tables (and of exports); `Trajectory` is the Python view of one row.
A trajectory's `id` is a content hash of the prompt id and the response (its tokens under its
tokenizer when it has them, else its text), so the same response to the same prompt is one row.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

MC_TARGET = pa.struct([("t", pa.int32()), ("success", pa.float64()), ("k", pa.int32())])
DECODING = pa.struct([("temperature", pa.float32()), ("top_p", pa.float32())])
TIMESTAMP = pa.timestamp("us", tz="UTC")

TRAJECTORY_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("prompt_id", pa.string(), nullable=False),
    ("task", pa.string()),
    ("prompt_text", pa.string()),
    ("response_text", pa.string()),
    ("prompt_tokens", pa.list_(pa.int32())),
    ("response_tokens", pa.list_(pa.int32())),
    ("tokenizer", pa.string()),  # fingerprint; "" when the row holds text only
    ("reward", pa.float64()),  # the task's reward in [0, 1]; SPO's r is reward - 1
    ("passed", pa.bool_()),
    ("source", pa.string()),  # online | reference | human | import:<name> | pts | ...
    ("run_id", pa.string()),
    ("policy_version", pa.int64()),  # -1: unknown
    ("behavior_logprobs", pa.list_(pa.float32())),  # nullable: only PPO and importance weights need them
    ("decoding", DECODING),
    ("mc_targets", pa.list_(MC_TARGET)),
    ("created_at", TIMESTAMP),
])

PROMPT_SCHEMA = pa.schema([
    pa.field("prompt_id", pa.string(), nullable=False),
    ("task", pa.string()),
    ("text", pa.string()),
    ("q0_hat", pa.float64()),  # beta * log mean_k exp(r_k / beta) of the K rewards (task units), at q0_beta
    ("q0_k", pa.int64()),
    ("q0_rewards", pa.list_(pa.float64())),  # the K rewards themselves: Q0 at any other beta
    ("q0_success", pa.float64()),  # pass rate of the K samples (a statistic, not a value)
    ("q0_beta", pa.float64()),
    ("q0_model", pa.string()),
    ("meta", pa.string()),  # JSON
    ("updated_at", TIMESTAMP),
])

# MC targets arrive after the trajectory was written; the store is append-only, so they live in their
# own table and readers join the newest annotation of each trajectory onto its `mc_targets`
ANNOTATION_SCHEMA = pa.schema([
    pa.field("trajectory_id", pa.string(), nullable=False),
    ("mc_targets", pa.list_(MC_TARGET)),
    ("source", pa.string()),
    ("created_at", TIMESTAMP),
])


def now() -> datetime:
    return datetime.now(timezone.utc)


def trajectory_id(prompt_id: str, response_tokens: list[int], tokenizer: str, response_text: str) -> str:
    if response_tokens:
        content = ["tokens", prompt_id, tokenizer, list(response_tokens)]
    else:
        content = ["text", prompt_id, response_text]
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()[:32]


@dataclass
class Trajectory:
    prompt_id: str
    response_text: str
    reward: float
    passed: bool
    task: str = ""
    prompt_text: str = ""
    prompt_tokens: list[int] = field(default_factory=list)
    response_tokens: list[int] = field(default_factory=list)
    tokenizer: str = ""
    source: str = "online"
    run_id: str = ""
    policy_version: int = -1
    behavior_logprobs: list[float] | None = None
    decoding: dict[str, float] | None = None  # {"temperature": ..., "top_p": ...}
    mc_targets: list[dict[str, Any]] = field(default_factory=list)  # [{"t", "success", "k"}]
    created_at: datetime = field(default_factory=now)
    id: str = ""

    def __post_init__(self):
        if not self.id:
            self.id = trajectory_id(self.prompt_id, self.response_tokens, self.tokenizer, self.response_text)

    def to_row(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in FIELDS}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Trajectory:
        return cls(**{k: v for k, v in row.items() if k in NAMES})


FIELDS = fields(Trajectory)
NAMES = frozenset(f.name for f in FIELDS)
