"""The benchmarks' outputs. Learning: a markdown table of final numbers, the claims, and one PNG of
pass@1 / pass@10 against samples generated and wall time plus reward against KL(pi || pi0).
Systems: `systems_markdown`, the tables of `softrl_bench.systems.run_systems`' result."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

COLUMNS = [("pass@1", "pass@1"), ("pass@10", "pass@10"), ("success_per_sample", "success"),
           ("kl_to_reference", "KL(pi||pi0)"), ("mean_token_entropy", "entropy"),
           ("distinct_correct_per_solved", "distinct")]


def _pm(point: dict, key: str, spread: bool = True, digits: int = 3) -> str:
    """`mean ± sd`, or the value alone where there is no spread (one seed)."""
    mean, sd = point.get(key, math.nan), point.get(f"{key}_sd", math.nan)
    if mean is None or math.isnan(mean):
        return "-"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}" if spread else f"{mean:.{digits}f}"


def markdown(agg: dict[str, list[dict]], claims: list[dict], seeds: int) -> str:
    """Final evaluation of every method (mean ± sd over seeds), then the claims whose methods ran."""
    spread = seeds > 1
    reference = next(iter(agg.values()))[0] if agg else {}
    head = ["method", "samples generated", "train time (s)"] + [label for _, label in COLUMNS]
    lines = [f"| {' | '.join(head)} |", f"|{'---|' * len(head)}"]
    lines.append(f"| reference (step 0) | 0 | 0 | {' | '.join(_pm(reference, k, spread) for k, _ in COLUMNS)} |")
    for method, points in agg.items():
        last = points[-1]
        lines.append(f"| {method} | {last['samples']:.0f} | {last['time']:.0f} | "
                     f"{' | '.join(_pm(last, k, spread) for k, _ in COLUMNS)} |")
    ran = [c for c in claims if c["verdict"] != "not run"]
    if ran:
        lines += ["", f"Claims (paired differences over the seeds both methods finished, of {seeds}; a - b, mean ± "
                      "standard error; a claim with a margin holds when a - b exceeds it by more than 2 SE):", "",
                  "| paper | claim | a vs b | compared | a - b | per seed | reproduced? |", "|---|---|---|---|---|---|---|"]
    for c in ran:
        diff = f"{c['diff']:+.3f}" + ("" if math.isnan(c["se"]) else f" ± {c['se']:.3f}")
        if c["seeds"] != seeds:
            diff += f" ({c['seeds']} seed{'s' if c['seeds'] > 1 else ''})"
        verdict = c["verdict"]
        if c.get("margin"):
            verdict += f" {'of' if verdict == 'within 2 SE' else 'than'} the margin {c['margin']:+.3f}"
        per_seed = ", ".join(f"{d:+.3f}" for d in c["per_seed"])
        lines.append(f"| {c['paper']} | {c['claim']} | {c['a']} vs {c['b']} | {c['compared']} | {diff} | {per_seed} | "
                     f"{'yes' if c['reproduced'] else 'no'} ({verdict}) |")
    missing = [f"{c['claim']} ({c['a']} vs {c['b']})" for c in claims if c["verdict"] == "not run"]
    if missing:
        lines += ["", "Claims not run (their methods are not in this benchmark): " + "; ".join(missing) + "."]
    return "\n".join(lines) + "\n"


def code_markdown(agg: dict[str, list[dict]], claims: list[dict], seeds: int, tuned: dict[str, dict],
                  card: dict, diversity: dict[str, dict[str, list[float]]]) -> str:
    """`markdown`'s table and claims for the code study, then diversity (`diversity`: arm -> measure ->
    its final value per seed), each arm's learning-rate grid on the tuning seed and the reference's
    held-out numbers from its card."""
    from softrl_bench.learning import mean_sd

    measures = list(next(iter(diversity.values()), {}))
    lines = ["", "Diversity at the end (distinct correct programs, mean ± sd over seeds):", "",
             f"| arm | {' | '.join(measures)} |", f"|---|{'---|' * len(measures)}"]
    for arm, by_measure in diversity.items():
        cells = [_pm(dict(zip(("v", "v_sd"), mean_sd(v))), "v", len(v) > 1) for v in (by_measure[m] for m in measures)]
        lines.append(f"| {arm} | {' | '.join(cells)} |")
    lrs = sorted({lr for t in tuned.values() for lr in t["grid"]})
    lines += ["", "Learning rates (final pass@1 on the tuning seed; the chosen one in bold):", "",
              f"| arm | {' | '.join(f'lr {lr:g}' for lr in lrs)} |", f"|---|{'---|' * len(lrs)}"]
    for arm, t in tuned.items():
        cells = [f"{t['grid'][lr]:.3f}" if lr in t["grid"] else "-" for lr in lrs]
        lines.append(f"| {arm} | " + " | ".join(f"**{c}**" if lr == t["lr"] else c for lr, c in zip(lrs, cells)) + " |")
    lines += episodes_table(agg, seeds > 1)
    held = card.get("heldout")
    if held:
        at = f"T {held['temperature']:g}" if "temperature" in held else "its card's temperature"
        lines += ["", f"The reference's card, on {held['problems']} held-out problems ({held['samples_per_problem']} "
                      f"samples each at {at}; the study evaluates at T 0.4): pass@1 {held['pass@1']:.3f}, "
                      f"pass@10 {held['pass@10']:.3f}."]
    return markdown(agg, claims, seeds) + "\n".join(lines) + "\n"


def episodes_table(agg: dict[str, list[dict]], spread: bool) -> list[str]:
    """For runs of episodes (their evaluations count turns): each arm's last and first turn, turns used,
    the policy's tokens per episode and per solved episode (tokens per episode / success per sample) at
    the end, and the policy tokens its training generated ("-" where its steps did not count them);
    [] for single-turn runs."""
    if not any(not math.isnan(p.get("turns_per_episode", math.nan)) for points in agg.values() for p in points):
        return []
    lines = ["", "Episodes at the end (the reward is the last turn's; mean ± sd over seeds):", "",
             "| arm | pass@1 (last turn) | pass@1 (first turn) | pass@10 (first turn) | turns | policy tokens "
             "per episode | tokens per solved episode | tokens generated in training |",
             "|---|---|---|---|---|---|---|---|"]
    first = next(iter(agg.values()))[0]
    for name, point in [("reference (step 0)", first), *((arm, points[-1]) for arm, points in agg.items())]:
        solved = point["success_per_sample"]
        per_solved = f"{point['tokens_per_sample'] / solved:,.0f}" if solved and not math.isnan(solved) else "-"
        generated = point.get("tokens", math.nan)
        lines.append(f"| {name} | {_pm(point, 'pass@1', spread)} | {_pm(point, 'first_turn_pass@1', spread)} | "
                     f"{_pm(point, 'first_turn_pass@10', spread)} | {_pm(point, 'turns_per_episode', spread, 2)} | "
                     f"{_pm(point, 'tokens_per_sample', spread, 0)} | {per_solved} | "
                     f"{'-' if generated is None or math.isnan(generated) else f'{generated:,.0f}'} |")
    return lines


def plot_learning(agg: dict[str, list[dict]], out: Path, title: str) -> Path:
    """2 x 3 panels: pass@1 and pass@10 against samples generated and against training wall time,
    reward (per-sample success) against KL(pi || pi0), and the fixed-data methods against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    panels = [(axes[0, 0], "samples", "pass@1", "samples generated"), (axes[0, 1], "samples", "pass@10", "samples generated"),
              (axes[1, 0], "time", "pass@1", "training wall time (s)"), (axes[1, 1], "time", "pass@10", "training wall time (s)"),
              (axes[0, 2], "kl_to_reference", "success_per_sample", "KL(pi || pi0) on evaluated responses (nats)")]
    has_kl = any(p["kl_to_reference"] is not None and not math.isnan(p["kl_to_reference"])
                 for points in agg.values() for p in points)
    if not has_kl:
        panels.pop()  # the KL-efficiency panel
    fixed_methods = {m for m, points in agg.items() if all(p["samples"] == 0 for p in points)}
    palette = plt.get_cmap("tab10" if len(agg) <= 10 else "tab20").colors
    colors = {method: palette[i % len(palette)] for i, method in enumerate(agg)}
    for method, points in agg.items():
        fixed = method in fixed_methods
        for ax, x, y, xlabel in panels:
            if fixed and x == "samples":
                continue  # generates nothing: drawn against steps below
            xs, ys = [p[x] for p in points], [p[y] for p in points]
            sd = [p[f"{y}_sd"] for p in points]
            ax.plot(xs, ys, marker="o", ms=3, color=colors[method], label=method)
            ax.fill_between(xs, [a - b for a, b in zip(ys, sd)], [a + b for a, b in zip(ys, sd)],
                            color=colors[method], alpha=0.12)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(y if y != "success_per_sample" else "reward (success per sample)")
        if fixed:
            for y, style in (("pass@1", "-"), ("pass@10", "--")):
                axes[1, 2].plot([p["step"] for p in points], [p[y] for p in points], style, marker="o", ms=3,
                                color=colors[method], label=f"{method} {y}")
    axes[1, 2].set_xlabel("learner step (fixed reference data)")
    axes[1, 2].set_ylabel("pass@k")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    # a panel nothing was measured for says so rather than showing empty axes
    for ax, shown, why in ((axes[0, 2], has_kl, "no KL measured (eval.stats off)"),
                           (axes[1, 2], bool(fixed_methods), "no fixed-data method in this run")):
        if not shown:
            ax.axis("off")
            ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="grey")
    axes[0, 2].set_title("KL-efficiency")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _split(split: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in split.items())


def systems_markdown(result: dict) -> str:
    """The systems numbers as markdown tables, with the ratios (`result["ratios"]`)."""
    from softrl_bench.end_to_end import median_speed

    fixed = " (fixed work: EOS ignored, every sample that long)" if result.get("fixed_work") else ""
    lines = [f"Model `{result['model']}`, task {result['task']}, batch {result['batch']}, "
             f"{result['max_new_tokens']} new tokens{fixed}, lr {result.get('lr')}, beta {result.get('beta', 0):.4g}, "
             f"device {result.get('device', 'cpu')}, {result['threads']} torch threads, {result['cpu']}.", ""]
    learner = result.get("learner")
    if learner:
        peak = result["matmul_peak_flops"]
        lines += [f"Measured matmul peak: {peak / 1e9:.1f} GFLOP/s.", "",
                  "| learner step | time (s) | peak memory (MiB) | FLOP per step | achieved GFLOP/s | of matmul peak "
                  "| split (s) |", "|---|---|---|---|---|---|---|"]
        for m, r in learner.items():
            lines.append(f"| {m} | {r['step_s']:.3f} | {r['peak_mib']:.0f} | {r['step_flops']:.3g} | "
                         f"{r['achieved_flops'] / 1e9:.2f} | {r['of_peak']:.1%} | {_split(r.get('split_s', {}))} |")
        for key, what in (("spo_over_ppo_time", "step time"), ("spo_over_ppo_memory", "peak memory")):
            by_round = result.get("learner_rounds", {}).get(key)
            if by_round:
                lines.append(f"\nSPO / PPO {what}, round by round (methods alternating): "
                             f"{', '.join(f'{x:.2f}x' for x in by_round)} (median {statistics.median(by_round):.2f}x)")
    rounds = result.get("rounds", {})
    if rounds:
        lines += ["", "| end to end (GRPO loss) | steps | samples/s, round by round | median samples/s "
                  "| after the first step | median split of a step (s) | whole run with setup (s) |",
                  "|---|---|---|---|---|---|---|"]
        for name, runs in rounds.items():
            done = [r for r in runs if "samples_per_s" in r]
            split = _split(done[-1]["split_s"]) if done and done[-1].get("split_s") else "-"
            speeds = ", ".join(f"{r['samples_per_s']:.1f}" if r in done else "failed" for r in runs)
            steady = [r["steady_samples_per_s"] for r in done if r.get("steady_samples_per_s")]
            middle = f"{median_speed(runs):.1f}" if done else "-"
            walls = ", ".join(f"{r['wall_s']:.0f}" for r in runs if "wall_s" in r) or "-"
            lines.append(f"| {name} | {done[0]['steps'] if done else '-'} | {speeds} | {middle} | "
                         f"{f'{statistics.median(steady):.1f}' if steady else '-'} | {split} | {walls} |")
        lines += [f"\n{name} failed: {r['error']}" for name, runs in rounds.items() for r in runs[:1] if "error" in r]
    for label, key in (("", "vs_trl"), (" after the first step", "vs_trl_steady")):
        for mode, r in result.get(key, {}).items():
            if r["by_pair"]:
                lines.append(f"\nsoftrl {mode} / TRL ({result.get('trl_fastest', 'trl')}) samples/s{label}, round by "
                             f"round: {', '.join(f'{x:.2f}x' for x in r['by_pair'])} (median {r['median']:.2f}x)")
    ray = result.get("ray", {})
    if ray:
        lines += ["", "| Ray runtime | steps | samples | training wall time (s) | samples/s |", "|---|---|---|---|---|"]
        lines += [f"| model_update_interval {k} | {r['steps']} | {r['samples']} | {r['seconds']:.1f} | "
                  f"{r['samples_per_s']:.1f} |" for k, r in ray.items()]
    sync = result.get("sync")
    if sync:
        update = sync["update"]
        lines += ["", f"| weight update to {update['workers']} workers | seconds, round by round | median (s) |",
                  "|---|---|---|"]
        lines += [f"| {m} | {', '.join(f'{x:.3f}' for x in v)} | {update['median_s'][m]:.3f} |"
                  for m, v in update["seconds"].items()]
        if sync["intervals"]:
            lines += ["", "| Ray runtime, weight sync | interval 1: wall time (s) | interval 10: wall time (s) | 10 / 1 |",
                      "|---|---|---|---|"]
        lines += [f"| {m} | {r['1']['seconds']:.1f} | {r['10']['seconds']:.1f} | {r['10']['seconds'] / r['1']['seconds']:.2f} |"
                  for m, r in ((m, {str(k): v for k, v in runs.items()}) for m, runs in sync["intervals"].items())]
    ratios = result.get("ratios", {})
    if ratios:
        lines += ["", "Ratios (`systems.json` \"ratios\"):"]
        lines += [f"- {k}: {v:.3f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in ratios.items()]
    return "\n".join(lines) + "\n"


def plot_intervals(agg: dict[str, list[dict]], intervals: tuple[int, ...], out: Path, title: str) -> Path:
    """Final pass@1 and pass@10 (mean ± sd over seeds) against the weight-update interval, one line per
    method; `agg`'s keys are `METHOD-iK`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(name.rsplit("-i", 1)[0] for name in agg))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key in zip(axes, ("pass@1", "pass@10")):
        for method in methods:
            ks = [k for k in intervals if f"{method}-i{k}" in agg]
            last = [agg[f"{method}-i{k}"][-1] for k in ks]
            ax.errorbar(ks, [p[key] for p in last], yerr=[p[f"{key}_sd"] for p in last], marker="o", capsize=3,
                        label=method, linestyle="-" if method.startswith(("spo", "agro")) else "--")
        if agg:
            reference = next(iter(agg.values()))[0][key]
            ax.axhline(reference, color="grey", linewidth=0.8, linestyle=":", label="reference")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(intervals), [str(k) for k in intervals])
        ax.set_xlabel("learner steps between weight updates to generation")
        ax.set_ylabel(f"final {key}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _store_sources(census: dict | None) -> str:
    """`reference 1234 (401 passed), online A 960 (350 passed)`: what a run's store held at its start."""
    if not census:
        return "-"
    parts = []
    for source, s in census["sources"].items():
        if source == "online":
            parts += [f"online of {run} {r['trajectories']} ({r['passed']} passed)"
                      for run, r in census.get("online_by_run", {}).items()]
        else:
            parts.append(f"{source} {s['trajectories']} ({round(s['pass_rate'] * s['trajectories'])} passed)")
    return f"{census['trajectories']}: " + ", ".join(parts)


def grow_markdown(result: dict) -> str:
    """`softrl_bench.grow.report`'s result: per lineage, each run's store at its start, the samples it generated
    before reaching A's final pass@1 and pass@10, its final numbers; then the paired comparisons."""
    lines = ["| lineage | run | store at its start (trajectories: by source) | samples to A's pass@1 "
             "| samples to A's pass@10 | samples generated | final pass@1 | final pass@10 |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["lineages"]:
        targets = row.get("targets", {})
        for role in (r for r in row if isinstance(row[r], dict) and "curve" in row[r]):  # the roles that ran
            r, last = row[role], row[role]["curve"][-1]
            if role == "A":
                cells = [f"target {targets[k]:.3f}" for k in ("pass@1", "pass@10")]
            else:
                reach = r.get("samples_to", {})
                cells = [f"{reach[k]:.0f}" if reach.get(k) is not None else "not reached" for k in ("pass@1", "pass@10")]
            lines.append(f"| {row['lineage']} | {role} | {_store_sources(r['store_at_start'])} | {cells[0]} | {cells[1]} "
                         f"| {last['samples']:.0f} | {last['pass@1']:.3f} | {last['pass@10']:.3f} |")
    claims = [c for c in result["comparisons"] if c["verdict"] != "not run"]
    if claims:
        lines += ["", "Paired over lineages (a - b, mean ± standard error):", "",
                  "| a vs b | compared | a - b | per lineage | expected | reproduced? |", "|---|---|---|---|---|---|"]
        for c in claims:
            se = "" if math.isnan(c["se"]) else f" ± {c['se']:.3f}"
            lines.append(f"| {c['a']} vs {c['b']} | {c['compared']} | {c['diff']:+.3f}{se} | "
                         f"{', '.join(f'{d:+.3f}' for d in c['per_seed'])} | {c['expected']} | "
                         f"{'yes' if c['reproduced'] else 'no'} ({c['verdict']}) |")
    return "\n".join(lines) + "\n"


def write_report(report: Path, stem: str, table: str, data: dict) -> None:
    """A study's table and numbers: REPORT/STEM.md and REPORT/STEM.json."""
    report.mkdir(parents=True, exist_ok=True)
    (report / f"{stem}.md").write_text(table)
    (report / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str))
