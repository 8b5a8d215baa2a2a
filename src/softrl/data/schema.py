"""The Trajectory: one row of the experience store (docs/DATA.md, "The store"), and the prompts and annotations tables.

Arrow schemas are the contract of the store's tables (and of exports); `Trajectory` is the Python view of one row.
A trajectory's `id` is a content hash of the prompt id and the response (its tokens under its
tokenizer when it has them, else its text, or an episode's turns), so the same response to the same
prompt is one row.

A trajectory may be an episode (docs/DATA.md, "Episodes"): after the prompt, the policy's turns and the
environment's (tool results, test feedback, a user's reply) in order, in `turns`. Its tokens are then
all that follows the prompt, policy and environment alike, and `action_mask` marks the policy's (the
only ones trained on). A row without `turns` is one policy turn: its response.
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
# one turn of an episode after its prompt: the policy's (assistant) or the environment's (tool, user)
TURN = pa.struct([("role", pa.string()), ("content", pa.string()),
                  ("tool_calls", pa.string()),  # assistant: OpenAI `tool_calls` as JSON text, null if none
                  ("tool_call_id", pa.string()),  # tool: the call it answers
                  ("name", pa.string()),  # tool: the tool's name, where given
                  ("reward", pa.float64())])  # a per-turn reward, where the environment gives one
POLICY_ROLE = "assistant"
ENVIRONMENT_ROLES = ("tool", "user")
FINISHES = ("done", "max_turns", "token_budget", "timeout", "env_error")  # why an episode ended

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
    ("turns", pa.list_(TURN)),  # an episode's turns after the prompt; null: one turn, the response
    ("action_mask", pa.list_(pa.bool_())),  # per response token: the policy's (true) or the environment's
    ("finish", pa.string()),  # an episode's end (FINISHES, then ": why" where there is more to say); null for one turn
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


def trajectory_id(prompt_id: str, response_tokens: list[int], tokenizer: str, response_text: str,
                  turns: list[dict] | None = None) -> str:
    if response_tokens:
        content = ["tokens", prompt_id, tokenizer, list(response_tokens)]
    elif turns:
        content = ["episode", prompt_id, [{k: turn.get(k) for k in TURN_KEYS} for turn in turns]]
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
    turns: list[dict[str, Any]] | None = None  # an episode's turns (TURN); None: one turn, the response
    action_mask: list[bool] | None = None  # per response token, the policy's or not; None: all the policy's
    finish: str | None = None  # why an episode ended (FINISHES)
    id: str = ""

    def __post_init__(self):
        if not self.id:
            self.id = trajectory_id(self.prompt_id, self.response_tokens, self.tokenizer, self.response_text,
                                    self.turns)

    @property
    def is_episode(self) -> bool:
        return bool(self.turns)

    def to_row(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in FIELDS}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Trajectory:
        return cls(**{k: v for k, v in row.items() if k in NAMES})


TURN_KEYS = tuple(f.name for f in TURN)


def new_turn(role: str, content: str, **given: Any) -> dict[str, Any]:
    """A turn (TURN) with every key, those not given None."""
    return {key: None for key in TURN_KEYS} | {"role": role, "content": content} | given
FIELDS = fields(Trajectory)
NAMES = frozenset(f.name for f in FIELDS)
