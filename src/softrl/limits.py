"""The documented limits on inputs (docs/USAGE.md, "When something goes wrong"), in one place: a
value beyond one is refused in one line naming it, before it can fill the memory or hang."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

MAX_SEED = 2**32 - 1  # numpy's bound; torch's and Python's are wider
MAX_PROMPTS = 10_000_000  # a task's size: a generated task builds every prompt up front
MAX_RECORD_CHARS = 16 * 2**20  # characters of one JSONL record (a dataset or import line); no context is longer
MAX_CHARS_PER_TOKEN = 32  # a prompt longer than the model's positions x this cannot fit (text averages 3-5
# characters a token): refused before it is tokenized, which for megabytes takes a minute and gigabytes
MAX_SANDBOX_INPUT = 16 * 2**20  # `softrl sandbox`'s program, stdin and tests file
MAX_TIMEOUT = 86_400  # seconds of a sandbox run: a day (Python's timers overflow near 1e7 s)
MAX_TOY_SEQUENCES = 2**20  # V**L of `softrl toy`'s exact problem, which enumerates every sequence


class StrictModel(BaseModel):
    """Settings as people write them: an unknown key, a number that is not finite (inf and nan pass a
    `gt=0` bound, then explode inside a run) and a boolean where a number goes (pydantic's lax mode
    reads `steps: true` as 1) are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if _holds_boolean(value) and _numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError("must be a number, not a boolean")
        return value


def _holds_boolean(value: Any) -> bool:
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, bool) or isinstance(value, (list, tuple)) and any(isinstance(v, bool) for v in value)


def _numeric(annotation: Any) -> bool:
    """int or float, alone or inside (`int | None`, `tuple[float, float]`, `dict[str, float]`); bool is not."""
    return annotation in (int, float) or any(_numeric(a) for a in typing.get_args(annotation))
