"""The scripts under benchmarks/ are run by hand (their numbers are in the docs), not by CI: at least
they must compile and show their help."""

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


@pytest.mark.parametrize("script", sorted((Path(__file__).parent.parent / "benchmarks" / "gpu").glob("*.sh")),
                         ids=lambda p: p.name)
def test_gpu_plan_script_parses(script):
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


# The wheels the GPU plan's first two calls carry beside the working tree: .whl/core, .whl/base and one
# half of pylance (benchmarks/gpu/carry.sh on 2026-11-27: 5.38 + 0.44 + 22.95 MiB). The device refuses a
# call over 64 MiB, so a tree that grows past the rest would cost a lease its calls.
CARRIED_MIB = 28.8
CALL_LIMIT_MIB = 64


def test_the_working_tree_leaves_room_for_the_gpu_plans_wheels():
    root = Path(__file__).parent.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout: which files would travel is unknown")
    # what the device sends: tracked files, and untracked ones git does not ignore
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, text=True, check=True)
    sizes = {name: (root / name).lstat().st_size for name in listed.stdout.split("\0")
             if name and ((root / name).is_symlink() or (root / name).is_file())}
    tree_mib = sum(sizes.values()) / 2**20
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert tree_mib + CARRIED_MIB <= CALL_LIMIT_MIB, (
        f"the working tree is {tree_mib:.1f} MiB: with the {CARRIED_MIB} MiB of wheels a GPU call carries it "
        f"passes the device's {CALL_LIMIT_MIB} MiB; largest: {', '.join(largest)}")
