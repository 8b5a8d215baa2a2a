"""The report of `softrl bench frontier`, per regime: a table (markdown), the numbers (JSON) and a figure
(PNG: pass@1 against KL(pi || pi0) with every grid point and each method's frontier; pass@k at matched KL)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from softrl.config import ConfigError
from softrl_bench.frontier_runs import TARGET_GAIN
from softrl.plots import save_figure


def _f(x, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pm(p: dict | None, key: str) -> str:
    if p is None:
        return "not run"
    sd, seeds, wanted = p.get(f"{key}_sd"), p.get("seeds", 1), p.get("of_seeds", p.get("seeds", 1))
    partial = f" ({seeds} of {wanted} seeds)" if seeds < wanted else ""
    return _f(p[key]) + (f" ± {_f(sd)}" if sd and seeds > 1 else "") + partial


def _lag(p: dict | None) -> str:
    lag = (p or {}).get("lag")
    return "-" if not lag else f"{lag['mean']:.1f} / {lag['median']:.0f} / {lag['max']:.0f}"


def _to_target(p: dict | None) -> str:
    """Samples generated to reach the reference's pass@1 + TARGET_GAIN: mean over the seeds that did."""
    if not p or "reached_target" not in p:
        return "-"
    seeds = p.get("seeds", 1)
    if not p["reached_target"]:
        return f"not reached (0 of {seeds})"
    sd = f" ± {p['samples_to_target_sd']:.0f}" if p["reached_target"] > 1 else ""
    return f"{p['samples_to_target']:.0f}{sd}" + (f" ({p['reached_target']} of {seeds} seeds)"
                                                   if p["reached_target"] < seeds else "")


def markdown(result: dict) -> str:
    s = result["settings"]
    grown = {m: lrs for m, lrs in result.get("method_lrs", {}).items() if lrs != s["lrs"]}
    growth = (f" (grown one rung past an edge where a method's best lay: "
              f"{', '.join(f'{m} {lrs}' for m, lrs in grown.items())})" if grown else "")
    if result.get("method_strengths"):  # `--extend-strength`
        growth += (f"; strength knobs grown so: "
                   f"{', '.join(f'{m} {knob}' for m, knob in result['method_strengths'].items())}")
    lines = [f"# Frontier, {s['task']}, regime {result['regime']}", "",
             f"{s['steps']} learner steps x {s['rows_per_step']} rows; learning rates {s['lrs']}{growth}; each method's grid "
             f"tuned on seed(s) {s['tune_seeds']}, reported on seeds {s['report_seeds']} (mean ± sd); pass@k on "
             f"{s['eval_size']} held-out prompts x 20 samples (T 0.4, top-p 0.95). Common KL (median of the best "
             f"points' KL): {_f(result['target_kl'])}. Grid points finished: {result['grid_finished']}. The "
             f"reference's pass@1 (step 0): {_f(result['reference_pass@1'])}.", "",
             "| method | best point | pass@1 | pass@10 | KL(pi‖pi0) | matched point | pass@1 at matched KL | "
             f"pass@10 at matched KL | its KL | samples generated | samples to reach the reference + {TARGET_GAIN:.2f} | "
             "lag mean / median / max | ESS fraction | clipped or masked | KL(mu‖pi) |",
             "|" + "---|" * 15]
    for m, best in result["best"].items():
        matched = result["matched"].get(m)
        b = best or {}
        lines.append(f"| {m} | {b.get('point', '-')} | {_pm(best, 'pass@1')} | {_pm(best, 'pass@10')} | "
                     f"{_pm(best, 'kl')} | {(matched or {}).get('point', '-')} | {_pm(matched, 'pass@1')} | "
                     f"{_pm(matched, 'pass@10')} | {_pm(matched, 'kl')} | {_f(b.get('samples'), 0)} | {_to_target(best)} | "
                     f"{_lag(best)} | "
                     f"{_f(b.get('iw/ess_fraction'))} | {_f(b.get('clipped_or_masked'))} | "
                     f"{_f(b.get('iw/kl_behavior'))} |")
    ks = (1, 2, 5, 10, 20)
    lines += ["", "pass@k at matched KL (report seeds):", "",
              "| method | KL | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|" + "---|" * (len(ks) + 2)]
    for m, p in result["matched"].items():
        if p:
            curve = p["pass@k"]
            lines.append(f"| {m} | {_f(p['kl'])} | " + " | ".join(_f(curve[k - 1]) if k <= len(curve) else "-"
                                                                 for k in ks) + " |")
    if result["against_frontiers"]:
        lines += ["", "SPO (and SPO-IS), AGRO and OAPL against each baseline's frontier, on the tuning seeds both (the "
                  "baseline's frontier at a KL: the best pass@1 its grid reached at no more KL; '-': none of its "
                  "points is that low): at the matched point, and at each point of our own frontier (KL: margin).",
                  "", "| method | its matched point | baseline | KL | pass@1 | baseline's frontier | margin | "
                  "along our frontier | baseline's lowest KL |", "|---|---|---|---|---|---|---|---|---|"]
        for v in result["against_frontiers"]:
            along = ", ".join(f"{p['kl']:.2f}: {_f(p['margin'], 3) if p['margin'] == p['margin'] else '-'}"
                              for p in v["along_frontier"])
            lines.append(f"| {v['method']} | {v['point']} | {v['baseline']} | {_f(v['kl'])} | {_f(v['pass@1'])} | "
                         f"{_f(v['baseline_pass@1'])} | {_f(v['margin'])} | {along} | {_f(v['baseline_lowest_kl'])} |")
    lines += ["", "Every grid point (tuning seeds):", "", "| point | pass@1 | pass@10 | KL | on its frontier |",
              "|---|---|---|---|---|"]
    for m, points in result["grid"].items():
        front = set(result["frontiers"].get(m, []))
        for p in points:
            lines.append(f"| {p['point']} | {_f(p['pass@1'])} | {_f(p['pass@10'])} | {_f(p['kl'])} | "
                         f"{'yes' if p['point'] in front else ''} |")
    return "\n".join(lines) + "\n"


def _two_panels(order: list[str], shown) -> tuple:
    """(figure, left axes, right axes, colours): each method's colour from its place in `order` (all the
    benchmark's methods; `shown` ones not in it after them), so that a method has the same colour in
    every regime's figure and across lags: 10 hues, dark then light (more than matplotlib's default 10)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    pairs = plt.get_cmap("tab20").colors
    hues = pairs[0::2] + pairs[1::2]
    return fig, left, right, {m: hues[i % len(hues)] for i, m in enumerate(dict.fromkeys([*order, *shown]))}


def plot(result: dict, out: Path, order: list[str]) -> Path:
    fig, left, right, colors = _two_panels(order, result["grid"])
    for m, points in result["grid"].items():
        c = colors[m]
        left.scatter([p["kl"] for p in points], [p["pass@1"] for p in points], color=c, s=14, alpha=0.5)
        front = [p for p in points if p["point"] in set(result["frontiers"].get(m, []))]
        front.sort(key=lambda p: p["kl"])
        left.plot([p["kl"] for p in front], [p["pass@1"] for p in front], color=c, label=m)
        for key, marker in (("best", "*"), ("matched", "o")):
            p = result[key].get(m)
            if p:
                left.errorbar(p["kl"], p["pass@1"], xerr=p["kl_sd"], yerr=p["pass@1_sd"], color=c, marker=marker,
                              markersize=9 if marker == "*" else 6, markeredgecolor="black", capsize=2)
        p = result["matched"].get(m)
        if p:
            right.plot(range(1, len(p["pass@k"]) + 1), p["pass@k"], color=c, label=f"{m} (KL {p['kl']:.2f})")
    if not math.isnan(result["target_kl"]):
        left.axvline(result["target_kl"], color="grey", linestyle="--", linewidth=0.8)
    if not math.isnan(result["reference_pass@1"]):
        left.axhline(result["reference_pass@1"], color="black", linestyle=":", linewidth=0.8, label="reference")
    left.set_xscale("log")  # KLs span orders of magnitude: a collapsed run's is in the hundreds
    left.set(xlabel="KL(pi || pi0) (held-out evaluation, log scale)", ylabel="pass@1",
             title=f"{result['regime']}: grid (dots, tuning seeds), frontiers (lines),\nbest (*) and matched (o) points "
                   "on report seeds")
    right.set(xlabel="k", ylabel="pass@k", title="pass@k at matched KL (report seeds)")
    return save_figure(fig, out, left, right)


def _report(path: Path) -> dict:
    """A regime's JSON report, or a one-line error naming the file."""
    try:
        result = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a JSON report ({e}): restore it, or delete it to leave that lag out") from None
    if not isinstance(result, dict) or not isinstance(result.get("settings"), dict):
        raise ConfigError(f"{path}: not a frontier report (no 'settings' mapping): restore it, or delete it to leave that lag out")
    return result


def _benchmark(settings: dict) -> dict:
    """A report's settings but its tuning seeds, as the reports keep them (lists, not tuples): a lag tuned on
    more seeds is the same benchmark chosen more surely; a quick run's is another."""
    return {k: v for k, v in json.loads(json.dumps(settings, default=str)).items() if k != "tune_seeds"}


def lag_results(folder: Path, stem: str, lags: list[int], settings: dict) -> tuple[dict[int, dict], list[Path]]:
    """({lag: result} of the lag reports in `folder` of the benchmark of `settings` (`_benchmark`: their tuning
    seeds may differ, and the picture names each lag's), whichever run wrote them; the reports of other
    settings, left out): a quick run's lags must not sit beside a full run's."""
    ours = _benchmark(settings)
    found = {lag: folder / f"{stem}-lag{lag}.json" for lag in sorted(lags)}
    results = {lag: _report(path) for lag, path in found.items() if path.is_file()}
    same = {lag: _benchmark(r["settings"]) == ours for lag, r in results.items()}
    return {lag: r for lag, r in results.items() if same[lag]}, [found[lag] for lag in results if not same[lag]]


def _tuning_seeds(by_lag: dict[int, dict]) -> dict[int, str]:
    return {lag: str(len(r["settings"]["tune_seeds"])) if "tune_seeds" in r["settings"] else "?"
            for lag, r in by_lag.items()}


def _methods(by_lag: dict[int, dict]) -> list[str]:
    return list(dict.fromkeys(m for r in by_lag.values() for m in r["best"]))


def lags_markdown(by_lag: dict[int, dict]) -> str:
    """Each method's best point (re-tuned at every lag) on the report seeds: pass@1 and its KL, lag by lag."""
    lags, tuning = list(by_lag), _tuning_seeds(by_lag)
    lines = ["# Frontier across policy lags", "",
             "Each method's best point at each lag (chosen on the tuning seeds), pass@1 (KL) on the report seeds; "
             "the last column: the largest lag against the smallest.", "",
             "Tuning seeds: " + ", ".join(f"lag {lag}: {n}" for lag, n in tuning.items()) + ".", "",
             "| method | " + " | ".join(f"lag {lag}" for lag in lags) + f" | lag {lags[-1]} - lag {lags[0]} |",
             "|---|" + "---|" * (len(lags) + 1)]
    for m in _methods(by_lag):
        best = [by_lag[lag]["best"].get(m) for lag in lags]
        cells = [f"{_pm(p, 'pass@1')} ({_f(p['kl'], 2)})" if p else "not run" for p in best]
        change = _f(round(best[-1]["pass@1"] - best[0]["pass@1"], 3) + 0.0) if best[0] and best[-1] else "-"  # no "-0.000"
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {change} |")
    return "\n".join(lines) + "\n"


def plot_lags(by_lag: dict[int, dict], out: Path, order: list[str]) -> Path:
    """pass@1 (report seeds, mean ± sd) and KL of each method's best point against the policy lag."""
    methods = _methods(by_lag)
    fig, left, right, colors = _two_panels(order, methods)
    for m in methods:
        points = [(lag, r["best"][m]) for lag, r in by_lag.items() if r["best"].get(m)]
        lags = [lag for lag, _ in points]
        left.errorbar(lags, [p["pass@1"] for _, p in points], yerr=[p.get("pass@1_sd", 0) for _, p in points],
                      color=colors[m], marker="o", capsize=2, label=m)
        right.plot(lags, [p["kl"] for _, p in points], color=colors[m], marker="o", label=m)
    first = next(iter(by_lag))
    reference = by_lag[first]["reference_pass@1"]
    if not math.isnan(reference):
        left.axhline(reference, color="black", linestyle=":", linewidth=0.8, label=f"reference (lag {first}'s tuning seeds)")
    tuning = _tuning_seeds(by_lag)
    mixed = len(set(tuning.values())) > 1
    ticks = [f"{lag}\n{n} seed{'' if n == '1' else 's'}" if mixed else str(lag) for lag, n in tuning.items()]
    xlabel = "policy lag (learner steps)" + (", and its tuning seeds" if mixed else "")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(by_lag), ticks)
    right.set_yscale("log", nonpositive="clip")  # a collapsed best point's KL is in the tens; a short run's may be <= 0
    left.set(xlabel=xlabel, ylabel="pass@1", title="best point at each lag, re-tuned (report seeds, mean ± sd)")
    right.set(xlabel=xlabel, ylabel="KL(pi || pi0)", title="its KL to the reference")
    return save_figure(fig, out, left, right)


def _replay_ratio(fresh: dict | None, replay: dict | None) -> float | None:
    """Replay's samples to the target over fresh's, where both reached it."""
    if not (fresh and replay and fresh.get("reached_target") and replay.get("reached_target")):
        return None
    return replay["samples_to_target"] / fresh["samples_to_target"]


def _paired_ratios(fresh: dict | None, replay: dict | None) -> str:
    """Replay / fresh seed by seed (a seed's two runs share its prompts and its reference), where both of
    that seed's runs reached the target: each, then the median."""
    a, b = (fresh or {}).get("to_target_by_seed", {}), (replay or {}).get("to_target_by_seed", {})
    ratios = [b[k] / a[k] for k in a if a[k] and b.get(k)]
    return f"{', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})" if ratios else "-"


def replay_markdown(fresh: dict, replay: dict) -> str:
    """Each method at its best point with every row generated (`fresh`) and with half of them replayed:
    generated samples to reach the reference's pass@1 + TARGET_GAIN (report seeds), and the final pass@1."""
    lines = [f"# Replay: generated samples to reach the reference's pass@1 + {TARGET_GAIN:.2f}", "",
             "Each method at its best point, tuned in each regime on its own grid; the same batch of rows every step, "
             "all of it generated (fresh) or half of it this run's earlier groups (replay, each replayed once). "
             "Samples to the target are read on the straight line between the evaluations of the all-generated runs' "
             f"grid, every {fresh['target_grid']} generated samples "
             "(replay evaluates twice as often in samples: every other evaluation is read), each "
             "report seed against its own reference's pass@1; the mean over the seeds that reached it.", "",
             "| method | fresh: point | samples to target | final pass@1 (samples) | replay: point | samples to target "
             "| final pass@1 (samples) | replay / fresh, means | seed by seed |", "|---|---|---|---|---|---|---|---|---|"]
    for m in dict.fromkeys([*fresh["best"], *replay["best"]]):
        a, b = fresh["best"].get(m), replay["best"].get(m)
        ratio = _f(_replay_ratio(a, b), 2)
        lines.append(f"| {m} | {(a or {}).get('point', 'not run')} | {_to_target(a)} | {_pm(a, 'pass@1')} "
                     f"({_f((a or {}).get('samples'), 0)}) | {(b or {}).get('point', 'not run')} | {_to_target(b)} | "
                     f"{_pm(b, 'pass@1')} ({_f((b or {}).get('samples'), 0)}) | {ratio} | {_paired_ratios(a, b)} |")
    return "\n".join(lines) + "\n"


def plot_replay(fresh: dict, replay: dict, out: Path, order: list[str]) -> Path:
    """pass@1 against generated samples (report seeds' mean), each method's best point with and without replay."""
    methods = list(dict.fromkeys([*fresh["best"], *replay["best"]]))
    fig, left, right, colors = _two_panels(order, methods)
    for m in methods:
        for result, style in ((fresh, "-"), (replay, "--")):
            p = result["best"].get(m)
            if p and p.get("pass@1_by_samples"):
                x, y = zip(*p["pass@1_by_samples"])
                left.plot(x, y, style, color=colors[m], marker="o", markersize=3, label=f"{m}, {result['regime']}")
        ratio = _replay_ratio(fresh["best"].get(m), replay["best"].get(m))
        if ratio is not None:
            right.bar(m, ratio, color=colors[m])
    target = fresh["reference_pass@1"] + TARGET_GAIN
    if not math.isnan(target):
        left.axhline(target, color="grey", linestyle=":", linewidth=0.8,
                     label=f"reference + {TARGET_GAIN:.2f} (tuning seed)")
    right.axhline(1.0, color="black", linewidth=0.8)
    left.set(xlabel="samples generated", ylabel="pass@1", title="best points, report seeds' mean: fresh (—), replay (--)")
    right.set(xlabel="method", ylabel="samples to target, replay / fresh",
              title="below 1: replay reaches the target with fewer samples")
    return save_figure(fig, out, left, right)


def _more_surely_tuned(path: Path, settings: dict) -> list | None:
    """The tuning seeds of the report at `path` where it is of the benchmark of `settings` tuned on more seeds
    than they say; None otherwise (none there, or one that is damaged or of other settings: replaced)."""
    try:
        kept = _report(path)["settings"] if path.is_file() else None
    except ConfigError:
        return None
    if kept is None or _benchmark(kept) != _benchmark(settings):
        return None
    return kept["tune_seeds"] if len(kept.get("tune_seeds", [])) > len(settings["tune_seeds"]) else None


def write_reports(s, regimes: list[str], methods: list[str] | None, tune_seeds: int, seeds: int, report: Path,
                  stem: str) -> list[str]:
    """Each regime's table, JSON and figure under `report` (not over one of the same benchmark tuned on more
    seeds), then the lags picture from this run's lags and those reported before of the same benchmark
    (`_benchmark`), unless a lag report of other settings would drop out of a picture already drawn (it is
    then left as it was); returns the lines to show (the tables, what was left out)."""
    from softrl_bench import frontier as fr

    report.mkdir(parents=True, exist_ok=True)
    lines, settings = [], fr.report_settings(s, tune_seeds, seeds)
    for name in regimes:
        path = report / f"{stem}-{name}"
        before = _more_surely_tuned(path.with_suffix(".json"), settings)
        if before:  # the default --tune-seeds 1 must not quietly undo a retune
            lines.append(f"{path.name}: left as it was: tuned on seeds {before}, this run on "
                         f"{settings['tune_seeds']} (give --tune-seeds {len(before)}, or delete it)")
            continue
        result = fr.regime_result(s, fr.REGIMES[name], methods, tune_seeds, seeds)
        if not any(result["grid"].values()):  # a report of nothing never replaces one of something
            lines.append(f"{path.name}: no finished run (in {s.kept}); its report is left as it was")
            continue
        table = markdown(result)
        path.with_suffix(".md").write_text(table)
        path.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
        plot(result, path.with_suffix(".png"), list(fr.METHODS))
        lines.append(table)
    pair = [report / f"{stem}-{name}.json" for name in ("fresh", "replay")]
    if all(path.is_file() for path in pair):
        fresh, replay = map(_report, pair)
        # all settings, tuning seeds too: the ratio is read seed by seed between one method's two runs, whose
        # points must be chosen alike
        if fresh["settings"] == replay["settings"] and fresh.get("target_grid") == replay.get("target_grid"):
            (report / f"{stem}-replay-samples.md").write_text(replay_markdown(fresh, replay))
            plot_replay(fresh, replay, report / f"{stem}-replay-samples.png", list(fr.METHODS))
        else:
            differ = sorted(k for k in {*fresh["settings"], *replay["settings"]}
                            if fresh["settings"].get(k) != replay["settings"].get(k))
            differ += ["target_grid"] * (fresh.get("target_grid") != replay.get("target_grid"))  # a report from before it
            lines.append(f"{stem}-replay-samples: not rewritten, {pair[0].name} and {pair[1].name} were made with "
                         f"other settings ({', '.join(differ)}): rerun the one that differs")
    by_lag, others = lag_results(report, stem, list(fr.LAGS), settings)
    across = report / f"{stem}-lags.md"
    if others and across.is_file():  # redrawn from fewer lags it would lose the others' columns
        lines.append(f"{stem}-lags: left as it was: {', '.join(p.name for p in others)} made with other settings "
                     f"(rerun those lags with these settings to redraw it)")
    elif len(by_lag) > 1:
        lines += [f"{stem}-lags: {path.name} left out (made with other settings)" for path in others]
        across.write_text(lags_markdown(by_lag))
        plot_lags(by_lag, report / f"{stem}-lags.png", list(fr.METHODS))
    return lines
