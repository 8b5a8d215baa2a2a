"""Write the figures of a GPU lease into docs/bench/gpu.json, from the results measure.sh brought back.

    mkdir -p /tmp/gpu && tar xzf <files_at>/results.tgz -C /tmp/gpu
    .venv/bin/python benchmarks/gpu/record.py /tmp/gpu --commit <the commit that ran> [--demo-cpu demo-cpu.json]

Reads what the steps wrote (env.log, learner/systems.json, e2e-*/systems.json, demo.log) and merges the
figures it finds into the file: a figure this lease measured replaces the old one, a figure it did not
measure keeps its earlier value, and `measured` says which lease (commit, date, device) each figure
comes from. A figure no lease measured is absent, never a guess. `--demo-cpu` is `softrl demo --json`'s
output on the CPU, same seed and steps as the GPU's demo step."""

import argparse
import datetime
import json
import subprocess
from pathlib import Path
from statistics import median

E2E_STEPS = ("e2e-big", "e2e-mid", "e2e-small")  # largest model first
# the targets; softrl against TRL counts only as the median of at least MIN_PAIRS pairs
MIN_PAIRS = 3
TARGETS = {"softrl_over_trl": (">=", 2.0), "learner_peak_fraction": (">=", 0.40),
           "spo_over_ppo_memory": ("<=", 0.55), "demo_gain_gap": ("<=", 0.03)}


def read_json(path: Path) -> dict | None:
    """The JSON object in `path` (the last line that parses, for a log with other lines), or None."""
    if not path.is_file():
        return None
    text = path.read_text()
    decoder = json.JSONDecoder()
    # the last object that parses, from any line that opens one (env.py prints one indented object;
    # a log may hold warnings before and after it)
    starts = [i for i in range(len(text)) if text[i] == "{" and (i == 0 or text[i - 1] == "\n")]
    for start in reversed(starts):
        try:
            return decoder.raw_decode(text, start)[0]
        except json.JSONDecodeError:
            continue
    return None


def learner_figures(systems: dict) -> dict:
    """Fraction of the bf16 peak (SPO's median step) and SPO/PPO peak memory: the median of the rounds'
    ratios where the benchmark finished; a step cut off at its limit writes only each method's medians
    so far, and their ratio stands in."""
    learner = systems.get("learner", {})
    if not {"spo", "ppo"} <= set(learner):
        return {}
    rounds = systems.get("learner_rounds", {}).get("spo_over_ppo_memory")
    memory = median(rounds) if rounds else learner["spo"]["peak_mib"] / learner["ppo"]["peak_mib"]
    spo = learner["spo"]
    return {"learner_peak_fraction": spo["of_peak"], "spo_over_ppo_memory": memory,
            "learner": {"model_params": spo["params"], "rounds": spo["rounds"],
                        "micro_batch_tokens": spo.get("micro_batch_tokens"),
                        "peak_gib": {m: r["peak_mib"] / 1024 for m, r in learner.items()},
                        "step_s": {m: r["step_s"] for m, r in learner.items()},
                        "of_peak": {m: r["of_peak"] for m, r in learner.items()},
                        "matmul_peak_flops": systems.get("matmul_peak_flops")}}


def trl_figures(systems: dict, step: str) -> dict:
    """softrl's fastest mode over TRL's fastest setting, samples/s pair by pair over each side's clock."""
    from softrl_bench.end_to_end import against_trl

    rounds = systems.get("rounds") or {}
    compared = against_trl(rounds)
    if not compared:
        return {}
    mode = compared["softrl_fastest"]
    return {"softrl_over_trl": {
        "by_pair": compared["vs_trl"][mode]["by_pair"], "median": compared["vs_trl"][mode]["median"],
        "softrl_mode": mode, "trl": compared["trl_fastest"], "step": step, "model": systems.get("model"),
        "steady_by_pair": compared["vs_trl_steady"][mode]["by_pair"],
        "every_mode": {m: v["by_pair"] for m, v in compared["vs_trl"].items()}}}


def demo_gain(result: dict | None) -> float | None:
    if not result or result.get("pass@1_after") is None or result.get("pass@1_before") is None:
        return None
    return result["pass@1_after"] - result["pass@1_before"]


def lease_figures(results: Path, demo_cpu: Path | None) -> tuple[dict, str | None]:
    """(figures, device name) of one lease's results folder."""
    env = read_json(results / "env.log") or {}
    figures: dict = {}
    # the profile step's learner is the same measurement, one round of fewer timed steps
    learner = read_json(results / "learner" / "systems.json") or read_json(results / "learner-profile" / "systems.json")
    if learner:
        figures.update(learner_figures(learner))
    for step in E2E_STEPS:  # the largest model that compared both sides
        systems = read_json(results / step / "systems.json")
        if systems and (found := trl_figures(systems, step)):
            figures.update(found)
            break
    gpu = demo_gain(read_json(results / "demo.log"))
    if gpu is not None:
        figures["demo_gain_gpu"] = gpu
        cpu = demo_gain(read_json(demo_cpu)) if demo_cpu else None
        if demo_cpu and cpu is None:
            raise SystemExit(f"record: {demo_cpu} holds no `softrl demo --json` result")
        if cpu is not None:  # the gap only of the same lease's two demos, never of another lease's CPU run
            figures.update(demo_gain_cpu=cpu, demo_gain_gap=abs(gpu - cpu))
    if env.get("bf16_matmul_peak_flops"):
        figures["bf16_matmul_peak_tflops"] = env["bf16_matmul_peak_flops"] / 1e12
    return figures, env.get("gpu")


def headline(value) -> float | None:
    """A figure's one number: the median of pair-by-pair ratios, or the figure itself."""
    return value.get("median") if isinstance(value, dict) else value


def smaller_model(new: dict, old: dict | None) -> bool:
    return old is not None and E2E_STEPS.index(new["step"]) > E2E_STEPS.index(old["step"])


def pooled(new: dict, old: dict | None, lease: dict, old_lease: dict | None) -> dict:
    """softrl against TRL with the pairs of an earlier lease of the same comparison (step, model, modes, GPU)
    added: each pair ran A B in one call, so pairs from two leases are as alternate as pairs from one."""
    same = ("step", "model", "softrl_mode", "trl")
    if not old or not old_lease or old_lease.get("device") != lease["device"] \
            or any(old.get(k) != new.get(k) for k in same):
        return {**new, "leases": [{**lease, "pairs": len(new["by_pair"])}]}
    by_pair = old["by_pair"] + new["by_pair"]
    earlier = old.get("leases") or [{**old_lease, "pairs": len(old["by_pair"])}]
    return {**new, "by_pair": by_pair, "median": median(by_pair),
            "steady_by_pair": old.get("steady_by_pair", []) + new["steady_by_pair"],
            "every_mode": {m: old.get("every_mode", {}).get(m, []) + v for m, v in new["every_mode"].items()},
            "leases": earlier + [{**lease, "pairs": len(new["by_pair"])}]}


def record(results: Path, into: Path, commit: str, date: str, demo_cpu: Path | None = None,
           device: str | None = None) -> dict:
    """`device`: the GPU's name, for a lease that ran no `env` step."""
    figures, found = lease_figures(results, demo_cpu)
    device = found or device
    old = json.loads(into.read_text()) if into.is_file() else {}
    out = {k: v for k, v in old.items() if k not in ("targets",)}
    lease = {"commit": commit, "date": date, "device": device}
    out.setdefault("measured", {})
    if "demo_gain_gpu" in figures and "demo_gain_gap" not in figures:
        for stale in ("demo_gain_cpu", "demo_gain_gap"):  # a CPU demo of another lease is no pair for this one
            out.pop(stale, None)
            out["measured"].pop(stale, None)
    for name, value in figures.items():
        if name == "softrl_over_trl":
            if smaller_model(value, out.get(name)):
                continue  # a comparison on a smaller model does not replace one on a larger
            value = pooled(value, out.get(name), lease, out["measured"].get(name))
        out[name] = value
        out["measured"][name] = lease
    if figures:
        out["device"] = device or old.get("device")
        out["commit"], out["date"] = commit, date
    out["targets"] = {}
    for name, (sense, bound) in TARGETS.items():
        value = headline(out.get(name))
        if value is None:
            continue
        verdict = {"target": f"{sense} {bound}", "value": value,
                   "met": value >= bound if sense == ">=" else value <= bound}
        pairs = len(out[name]["by_pair"]) if isinstance(out[name], dict) else None
        if pairs is not None and pairs < MIN_PAIRS:
            verdict.update(met=None, why=f"{pairs} pair(s) of the {MIN_PAIRS} the target needs")
        out["targets"][name] = verdict
    into.parent.mkdir(parents=True, exist_ok=True)
    into.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the unpacked results.tgz of the lease's last call")
    parser.add_argument("--into", type=Path, default=Path("docs/bench/gpu.json"))
    parser.add_argument("--commit", default=None, help="the commit the lease ran (default: HEAD)")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--demo-cpu", type=Path, default=None, help="`softrl demo --json` on the CPU")
    parser.add_argument("--device", default=None, help="the GPU's name, where the lease ran no `env` step")
    args = parser.parse_args()
    if not args.results.is_dir():
        parser.error(f"{args.results} is not a folder (unpack the lease's results.tgz there)")
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True, check=True).stdout.strip()
    out = record(args.results, args.into, commit, args.date, args.demo_cpu, args.device)
    print(json.dumps(out["targets"], indent=1))


if __name__ == "__main__":
    main()
