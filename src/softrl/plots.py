"""Plots of a run directory's metrics.jsonl (`softrl plot RUN_DIR`), and how every figure is saved."""

from __future__ import annotations

import json
import math
from pathlib import Path

PANELS = [
    ("reward", [("online_pass_rate", "online samples: pass rate"), ("reward", "batch: mean reward")]),
    ("pass@k (held-out)", [("eval/pass@1", "pass@1"), ("eval/pass@10", "pass@10")]),
    ("KL to the reference", [("kl_ref/online", "online samples: mean log pi/pi0 (estimates KL)"),
                             ("kl_ref/offline", "offline samples: mean log pi/pi0")]),
    ("loss", [("loss", "total")]),
]


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run directory?")
    lines = path.read_text(errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            if number == len(lines):  # torn by a crash mid-write: the run resumes before it
                break
            raise ValueError(f"{path}, line {number}: not a JSON record") from None
        step = record.get("step") if isinstance(record, dict) else None
        if type(step) is not int or step < 0:
            raise ValueError(f"{path}, line {number}: a record needs a 'step' (an integer >= 0)")
        # what is drawn is a number; anything else a record holds is kept but never plotted
        records.append(record)
    return records


def plot_run(run_dir: str | Path) -> list[Path]:
    """One PNG with reward, pass@k, KL and loss against steps; returns its path(s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (title, series) in zip(axes.flat, PANELS):
        for key, label in series:
            points = [(r["step"], r[key]) for r in records
                      if type(r.get(key)) in (int, float) and math.isfinite(r[key])]
            if points:
                ax.plot(*zip(*points), marker="o" if key.startswith("eval/") else None, label=label)
        ax.set_title(title)
        ax.set_xlabel("learner step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    out = Path(run_dir) / "training.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [out]


def save_figure(fig, out: Path, *legends) -> Path:
    """Small legends on the given axes, the layout tightened, `fig` written to `out` and closed."""
    import matplotlib.pyplot as plt

    for ax in legends:
        if ax.get_legend_handles_labels()[0]:  # an axis with nothing labelled yet (a partial report) has none
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
