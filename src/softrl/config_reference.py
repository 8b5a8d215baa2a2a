"""docs/USAGE.md's configuration reference, generated from the config models: every section and
key with its default and meaning, and every registered objective's options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

import softrl.objectives as registry
from softrl.config import RunConfig, Section


def config_reference() -> str:
    """Markdown tables of every section and key, from the models (docs/USAGE.md embeds this)."""
    lines = []
    top = [(n, f) for n, f in RunConfig.model_fields.items() if not isinstance(f.default_factory, type)]
    lines += ["### top level", "", "| key | default | meaning |", "|---|---|---|"]
    lines += [f"| `{n}` | `{_default(f)}` | {f.description or ''} |" for n, f in top]
    for name, f in RunConfig.model_fields.items():
        if isinstance(f.default_factory, type) and issubclass(f.default_factory, Section):
            lines += ["", f"### `{name}`", "", "| key | default | meaning |", "|---|---|---|"]
            for key, sub in f.default_factory.model_fields.items():
                lines.append(f"| `{name}.{key}` | `{_default(sub)}` | {sub.description or ''} |")
    lines += ["", "### objectives: `data.objective` and `data.objectives.SOURCE`", "",
              "`algorithm` picks the loss; `weight` and the options of that algorithm may follow "
              "(docs/ALGORITHMS.md).", "", "| algorithm | key | default | meaning |", "|---|---|---|---|"]
    for name, objective in registry.REGISTRY.items():
        lines.append(f"| `{name}` | | | {objective.summary} |")
        lines += [f"| | `{key}` | `{_default(sub)}` | {sub.description or ''} |"
                  for key, sub in objective.options.model_fields.items() if key != "algorithm"]
    return "\n".join(lines) + "\n"


def _default(field) -> Any:
    if field.default_factory is not None:
        value = field.default_factory()
        return value.model_dump() if isinstance(value, BaseModel) else value
    return float(f"{field.default:.4g}") if isinstance(field.default, float) else field.default


REFERENCE_START, REFERENCE_END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def write_reference(doc: str | Path) -> bool:
    """Replace the block between the markers in `doc` with `config_reference()`; True if it changed.
    `python -m softrl.config_reference docs/USAGE.md` runs it; a test fails when the doc is stale."""
    path = Path(doc)
    text = path.read_text()
    head, _, rest = text.partition(REFERENCE_START)
    _, _, tail = rest.partition(REFERENCE_END)
    new = f"{head}{REFERENCE_START}\n{config_reference()}{REFERENCE_END}{tail}"
    path.write_text(new)
    return new != text


if __name__ == "__main__":
    import sys

    for doc in sys.argv[1:]:
        print(f"{doc}: {'updated' if write_reference(doc) else 'already current'}")
