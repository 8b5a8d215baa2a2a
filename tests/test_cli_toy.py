"""`softrl toy` as a user runs it: the installed command, JSON on stdout, a PNG, clear errors."""

import json
import os
import shutil
import subprocess
import sys

import pytest

SOFTRL = shutil.which("softrl", path=os.path.dirname(sys.executable)) or shutil.which("softrl")


def _run(*args, cwd):
    return subprocess.run([SOFTRL, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
def test_toy_json_and_plot(tmp_path):
    out = tmp_path / "toy"
    proc = _run("toy", "--steps", "40", "--methods", "spo-terminal-bce,agro-on,kl-pg", "--json",
                "--out", str(out), "--workers", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {(r["method"], r["data"]) for r in rows} == {
        ("spo-terminal-bce", "off-policy"), ("spo-terminal-bce", "on-policy"), ("agro-on", "on-policy"),
        ("kl-pg", "off-policy"), ("kl-pg", "on-policy"),
    }
    assert all(set(r) == {"method", "data", "final_kl"} and r["final_kl"] >= 0 for r in rows)
    assert (out / "kl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == rows and len(saved["curves"]["kl-pg/off-policy"]) == 41


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
def test_toy_table_and_bad_method(tmp_path):
    proc = _run("toy", "--steps", "5", "--methods", "ppo", "--workers", "1", "--out", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0 and "ppo" in proc.stdout and "on-policy" in proc.stdout
    bad = _run("toy", "--methods", "spo-terminal-bce,dpo", "--out", str(tmp_path), cwd=tmp_path)
    assert bad.returncode == 2
    assert "unknown method 'dpo'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")
def test_toy_progress_and_messages_go_to_stderr(tmp_path):
    """FORCE_COLOR makes rich draw its progress bar though stderr is a pipe: the bar's line erases land on
    stderr, and stdout holds only the result (one JSON document, or the table)."""
    args = [SOFTRL, "toy", "--steps", "5", "--methods", "ppo", "--workers", "1", "--out", str(tmp_path)]
    env = {**os.environ, "FORCE_COLOR": "1"}
    as_json = subprocess.run([*args, "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert as_json.returncode == 0, as_json.stderr
    assert "\x1b[2K" in as_json.stderr  # the bar was drawn, on stderr
    assert [r["method"] for r in json.loads(as_json.stdout)] == ["ppo"]  # nothing else on stdout
    table = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0 and "on-policy" in table.stdout, table.stderr
    assert "\x1b[2K" not in table.stdout and "plot:" not in table.stdout and "plot:" in table.stderr


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "softrl", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "toy" in proc.stdout
