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
