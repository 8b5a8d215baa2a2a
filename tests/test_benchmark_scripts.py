"""The scripts under benchmarks/ are run by hand (their numbers are in the docs), not by CI: at least
they must compile and show their help."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parent.parent / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_script_compiles(script):
    compile(script.read_text(), str(script), "exec")


def test_generation_backends_script_shows_its_help():
    script = Path(__file__).parent.parent / "benchmarks" / "generation_backends.py"
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "--compile" in out.stdout, out.stderr[-1000:]


BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


@pytest.mark.parametrize("script", sorted([*BENCHMARKS.glob("*.sh"), *(BENCHMARKS / "gpu").glob("*.sh")]),
                         ids=lambda p: p.name)
def test_benchmark_shell_script_parses(script):
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


# The plan's call with a lean tree (benchmarks/gpu/lean.sh on: docs/bench, the kept outcomes, figures and
# reference weights no GPU step reads, stays behind) carries every wheel at once: .whl/core, base, both
# halves of pylance and the demo's cache (benchmarks/gpu/carry.sh's lean call, 2026-11-28: 5.38 + 0.44 +
# 22.97 x 2 + 6.85 MiB). The device refuses a call over 64 MiB, so a tree whose code grows past the rest
# would cost a lease its calls. (The whole tree, 36 MiB with three kept references, no longer fits beside
# even one half of pylance: the plan runs lean.)
LEAN_CALL_MIB = 58.6
CALL_LIMIT_MIB = 64
STAYS_BEHIND = "docs/bench/"


def test_the_working_tree_leaves_room_for_the_gpu_plans_wheels():
    root = Path(__file__).parent.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout: which files would travel is unknown")
    # what the device sends: tracked files, and untracked ones git does not ignore, less what lean.sh keeps back
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, text=True, check=True)
    sizes = {name: (root / name).lstat().st_size for name in listed.stdout.split("\0")
             if name and not name.startswith(STAYS_BEHIND) and ((root / name).is_symlink() or (root / name).is_file())}
    tree_mib = sum(sizes.values()) / 2**20
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert tree_mib + LEAN_CALL_MIB <= CALL_LIMIT_MIB, (
        f"the lean working tree is {tree_mib:.1f} MiB: with the {LEAN_CALL_MIB} MiB of wheels the lean call carries "
        f"it passes the device's {CALL_LIMIT_MIB} MiB; largest: {', '.join(largest)}")


def _gpu_record():
    import importlib.util

    path = Path(__file__).parent.parent / "benchmarks" / "gpu" / "record.py"
    spec = importlib.util.spec_from_file_location("gpu_record", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lease(root: Path, **steps) -> Path:
    for name, content in steps.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return root


def test_gpu_record_merges_leases_and_judges_targets_only_on_enough_pairs(tmp_path):
    record = _gpu_record().record
    learner = {"matmul_peak_flops": 7e14, "learner": {
        m: {"params": 10**9, "rounds": 2, "peak_mib": mib, "step_s": 1.0, "of_peak": peak}
        for m, mib, peak in (("spo", 25_000, 0.125), ("ppo", 50_000, 0.11), ("grpo", 25_000, 0.13))}}
    e2e = {"model": "m", "rounds": {"softrl-sync": [{"samples_per_s": 8.0, "steady_samples_per_s": 70.0}],
                                    "trl-dynamic": [{"samples_per_s": 4.0, "steady_samples_per_s": 14.0}]}}
    first = _lease(tmp_path / "one", **{"env.log": {"gpu": "H100", "bf16_matmul_peak_flops": 7.7e14},
                                        "learner/systems.json": learner, "e2e-mid/systems.json": e2e})
    into = tmp_path / "gpu.json"
    out = record(first, into, "aaa", "2026-11-27")
    assert out["device"] == "H100" and out["spo_over_ppo_memory"] == pytest.approx(0.5)
    assert out["softrl_over_trl"]["by_pair"] == [2.0] and out["softrl_over_trl"]["steady_by_pair"] == [5.0]
    assert out["targets"]["spo_over_ppo_memory"]["met"] is True
    assert out["targets"]["learner_peak_fraction"]["met"] is False
    # one pair is no verdict on a target that needs the median of three
    assert out["targets"]["softrl_over_trl"]["met"] is None and "1 pair" in out["targets"]["softrl_over_trl"]["why"]
    assert "demo_gain_gpu" not in out and "demo_gain_gap" not in out["targets"]  # not measured: absent
    # a later lease with three pairs and the demo: its figures replace, the learner's stay from the first
    e2e["rounds"] = {"softrl-async": [{"samples_per_s": s} for s in (9.0, 10.0, 11.0)],
                     "trl-dynamic": [{"samples_per_s": 4.0}] * 3}
    demo_cpu = tmp_path / "cpu.json"
    demo_cpu.write_text(json.dumps({"pass@1_before": 0.4, "pass@1_after": 0.6}))
    second = _lease(tmp_path / "two", **{"env.log": {"gpu": "H200"}, "e2e-mid/systems.json": e2e,
                                         "demo.log": 'loading\n{"pass@1_before": 0.4, "pass@1_after": 0.65}\n'})
    out = record(second, into, "bbb", "2026-12-01", demo_cpu)
    assert out["softrl_over_trl"]["median"] == pytest.approx(2.5) and out["targets"]["softrl_over_trl"]["met"]
    assert out["measured"]["softrl_over_trl"]["commit"] == "bbb"
    assert out["measured"]["spo_over_ppo_memory"] == {"commit": "aaa", "date": "2026-11-27", "device": "H100"}
    assert out["demo_gain_gpu"] == pytest.approx(0.25) and out["demo_gain_cpu"] == pytest.approx(0.2)
    assert out["targets"]["demo_gain_gap"]["met"] is False  # 0.05 apart
    assert json.loads(into.read_text()) == out
    # a third lease: a comparison on the smaller model keeps the larger one's; its log has warnings
    # around env.py's indented JSON
    env = "UserWarning: something\n" + json.dumps({"gpu": "H100", "bf16_matmul_peak_flops": 8e14}, indent=1) + "\nbye\n"
    third = _lease(tmp_path / "three", **{"env.log": env, "e2e-small/systems.json": e2e})
    out = record(third, into, "ccc", "2026-12-02")
    assert out["softrl_over_trl"]["step"] == "e2e-mid" and out["measured"]["softrl_over_trl"]["commit"] == "bbb"
    assert out["bf16_matmul_peak_tflops"] == pytest.approx(800) and out["device"] == "H100"
    # a fourth lease of the second's comparison on its GPU (named here: no env step): its pair joins those three
    e2e["rounds"] = {"softrl-async": [{"samples_per_s": 4.0}], "trl-dynamic": [{"samples_per_s": 4.0}]}
    fourth = _lease(tmp_path / "four", **{"e2e-mid/systems.json": e2e})
    out = record(fourth, into, "ddd", "2026-12-03", device="H200")
    assert out["softrl_over_trl"]["by_pair"] == pytest.approx([2.25, 2.5, 2.75, 1.0])
    assert out["softrl_over_trl"]["median"] == pytest.approx(2.375)
    assert [lease["pairs"] for lease in out["softrl_over_trl"]["leases"]] == [3, 1]
    # on another GPU the comparison starts over
    out = record(fourth, into, "eee", "2026-12-04", device="H100")
    assert out["softrl_over_trl"]["by_pair"] == [1.0] and out["targets"]["softrl_over_trl"]["met"] is None


def test_frontier_paired_pairs_points_by_seed(tmp_path):
    """The paired column is the mean of per-seed differences over the seeds both points finished, not the
    difference of the two means: seed 2 of the point is missing, so the baseline's seed 2 must not count."""
    base = {0: 0.60, 1: 0.50, 2: 0.90}
    point = {0: 0.65, 1: 0.45}
    kept = tmp_path / "runs.jsonl"
    lines = [{"key": f"lag64/{name}-s{seed}", "settings": {},
              "outcome": {"pass@1": p1, "pass@10": 0.8, "kl": 1.0}}
             for name, runs in (("base_lr1", base), ("ours_lr1", point)) for seed, p1 in runs.items()]
    kept.write_text("".join(json.dumps(line) + "\n" for line in lines))
    script = Path(__file__).parent.parent / "benchmarks" / "frontier_paired.py"
    out = subprocess.run([sys.executable, str(script), "lag64", "base_lr1", "ours_lr1", "--kept", str(kept),
                          "--seeds", "3"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-1000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| ours_lr1 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2" and cells[2] == "0.550 ± 0.141"
    assert cells[5] == "0.000 ± 0.071" and cells[6] == "+0.050, -0.050"
    first = subprocess.run([sys.executable, str(script), "lag64", "base_lr1", "ours_lr1", "--kept", str(kept),
                            "--seeds", "3", "--first", "1"], capture_output=True, text=True, check=False)
    row = next(line for line in first.stdout.splitlines() if line.startswith("| ours_lr1 "))
    assert [c.strip() for c in row.strip("|").split("|")][5] == "-0.050"
    for bad, named in ((["ours_lr2", "--kept", str(kept)], "'ours_lr2'"),
                       (["ours_lr1", "--kept", str(tmp_path / "none.jsonl")], "none.jsonl")):
        out = subprocess.run([sys.executable, str(script), "lag64", "base_lr1", *bad], capture_output=True, text=True,
                             check=False)
        assert out.returncode != 0 and named in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
