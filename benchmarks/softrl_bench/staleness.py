"""`softrl bench staleness`: the tabular reproduction of SPO on stale data (`tabular.staleness`), as a table
of the plateau success rate against the lag for each candidate cause and fix, and a figure."""

from __future__ import annotations

from pathlib import Path


def markdown(rows: list[dict]) -> str:
    lags = sorted({r["lag"] for r in rows})
    by = {(r["variant"], r["lr"], r["lag"]): r for r in rows}
    head = " | ".join(f"lag {k}" for k in lags)
    lines = ["Success rate of pi at its plateau (exact; the last quarter of training, mean ± sd over seeds), by the lag "
             "of the data; the drop from the freshest to the stalest data; KL(pi ‖ pi0) at the stalest; the share "
             "of rows that were failed and past the BCE clip over the run.", "",
             f"| variant | lr | {head} | drop | KL at lag {lags[-1]} | failed rows past the clip |",
             "|" + "---|" * (len(lags) + 5)]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        for lr in sorted({r["lr"] for r in rows if r["variant"] == variant}):
            cells = [by[variant, lr, k] for k in lags]
            drop = cells[0]["success_plateau"] - cells[-1]["success_plateau"]
            lines.append(f"| {variant} | {lr:g} | " + " | ".join(
                f"{c['success_plateau']:.3f} ± {c['success_plateau_sd']:.3f}" for c in cells) +
                f" | {drop:+.3f} | {cells[-1]['kl_ref']:.2f} | {sum(c['clipped'] for c in cells) / len(cells):.5f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs = sorted({r["lr"] for r in rows})
    fig, axes = plt.subplots(1, len(lrs), figsize=(5 * len(lrs), 4.2), sharey=True, squeeze=False)
    for ax, lr in zip(axes[0], lrs):
        for variant in dict.fromkeys(r["variant"] for r in rows):
            cells = sorted((r for r in rows if r["variant"] == variant and r["lr"] == lr), key=lambda r: r["lag"])
            ax.errorbar([c["lag"] + 1 for c in cells], [c["success_plateau"] for c in cells],
                        yerr=[c["success_plateau_sd"] for c in cells], label=variant, marker="o", capsize=2)
        ax.set(xscale="log", xlabel="lag + 1 (learner steps)", title=f"lr {lr:g}")
    axes[0][0].set_ylabel("success rate at the plateau (exact)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("SPO (terminal loss) on data from its own weights L steps ago; policy cannot represent pi*")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
