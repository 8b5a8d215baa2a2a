"""Bad input and faults, driven through the `softrl` command as a user meets them: for each, exit
status 1 or 2, no traceback, a line that names the offending key, file or value, and the experience
store unchanged. Then resume after a crash at awkward moments (a checkpoint half-written, a torn
metrics line, a damaged newest checkpoint, a run killed before its first checkpoint), and
`--debug` / SOFTRL_DEBUG=1, which show the traceback."""

import gzip
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import softrl  # noqa: E402
from test_training import SOFTRL, seed_store, tiny_overrides  # noqa: E402

pytestmark = pytest.mark.skipif(SOFTRL is None, reason="softrl console script not installed")


def write(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def jsonl(*records) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


GOOD = {"prompt": "Use 1 2 3 to make 6", "response": "1+2+3", "reward": 1.0}
# a model of 512 positions, its config only: a case that needs its weights or tokenizer fails otherwise
CONFIG_ONLY = {"model/config.json": json.dumps({"model_type": "llama", "max_position_embeddings": 512})}
# a 15 MB prompt, under the record limit: it took 46 s and 6.9 GB to be tokenized, then refused
HUGE_PROMPT = {**CONFIG_ONLY, "huge.jsonl": jsonl({"id": "huge", "problem": "x" * (15 * 10**6), "answer": "7"})}
HUGE_REFUSED = "prompt 'huge' of task 'math' has 15,000,000 characters, more than the model's 512 positions"

# (id, arguments after `softrl`, {relative path: content} to create first, what the error must name).
# "{d}" in an argument is the case's directory; every case may touch the store in {d}/store.
CASES = [
    # --- configuration: values at the door ---
    ("lr-inf", ["train", "optim.lr=inf"], {}, "optim.lr"),
    ("lr-nan", ["train", "optim.lr=nan"], {}, "optim.lr"),
    ("lr-negative", ["train", "optim.lr=-1"], {}, "optim.lr"),
    ("beta-inf", ["train", "beta=inf"], {}, "beta"),
    ("seed-huge", ["train", "seed=1e23"], {}, "seed"),
    ("seed-overflow", ["train", "seed=99999999999999999999"], {}, "seed"),
    ("seed-negative", ["train", "seed=-5"], {}, "seed"),
    ("task-seed-huge", ["train", "task.seed=4294967296"], {}, "task.seed"),
    ("temperature-range-reversed", ["train", "sampling.temperature_range=[0.8, 0.1]"], {}, "temperature_range"),
    ("temperature-range-zero", ["train", "sampling.temperature_range=[0, 0.5]"], {}, "temperature_range"),
    ("temperature-zero", ["train", "sampling.temperature=0"], {}, "sampling.temperature"),
    ("top-p-above-1", ["train", "sampling.top_p=2"], {}, "top_p"),
    ("mix-negative", ["train", "data.mix={online: -1}"], {}, "mix"),
    ("mix-unknown-source", ["train", "data.mix={bogus: 1}"], {}, "bogus"),
    ("mix-nan", ["train", "data.mix={online: .nan}"], {}, "mix"),
    ("algorithm-unknown", ["train", "data.objective.algorithm=nope"], {}, "algorithm"),
    ("objective-option-inf", ["train", "data.objective.terminal=inf"], {}, "terminal"),
    ("device-unknown", ["train", "model.device=gpu"], {}, "model.device"),
    ("lora-unknown-option", ["train", "model.lora={rank: 3}"], {}, "rank"),
    ("task-size-zero", ["train", "task.size=0"], {}, "task.size"),
    ("steps-not-a-number", ["train", "optim.steps=abc"], {}, "optim.steps"),
    ("runtime-unknown", ["train", "runtime.kind=k8s"], {}, "runtime.kind"),
    ("unknown-key", ["train", "nosuch.key=1"], {}, "nosuch"),
    ("override-not-key-value", ["train", "task.size=4", "optim.lr"], {}, "key=value"),
    ("eval-samples-zero", ["train", "eval.samples=0"], {}, "eval.samples"),
    ("keep-checkpoints-zero", ["train", "log.keep_checkpoints=0"], {}, "keep_checkpoints"),
    ("name-escapes-out-dir", ["train", "name=../../../tmp/escape"], {}, "name"),
    ("name-with-slash", ["train", "name=a/b"], {}, "name"),
    ("name-dot-dot", ["train", "name=.."], {}, "name"),
    # --- configuration files ---
    ("config-missing", ["train", "{d}/nope.yaml"], {}, "nope.yaml"),
    ("config-binary", ["train", "{d}/bin.yaml"], {"bin.yaml": b"\xff\xfe\x00\x81garbage"}, "bin.yaml"),
    ("config-bad-yaml", ["train", "{d}/bad.yaml"], {"bad.yaml": "optim: {lr: [\n"}, "bad.yaml"),
    ("config-not-a-mapping", ["train", "{d}/list.yaml"], {"list.yaml": "- 1\n- 2\n"}, "list.yaml"),
    ("config-is-a-directory", ["train", "{d}"], {}, "{d}"),
    # --- what a run names wrongly or loads ---
    ("task-unknown", ["train", "task.name=nosuchtask", "model.path=bootstrap"], {}, "nosuchtask"),
    ("task-dataset-missing", ["train", "task.name=math:{d}/none.jsonl"], {}, "none.jsonl"),
    ("model-path-missing", ["train", "model.path={d}/no-model"], {}, "no-model"),
    ("out-dir-under-a-file", ["train", "out_dir={d}/file/runs", "task.size=2", "task.eval_size=1", "q0.k=2"],
     {"file": "not a directory"}, "file"),
    # --- data import ---
    ("import-missing-file", ["data", "import", "{d}/none.jsonl", "--store", "{d}/store"], {}, "none.jsonl"),
    ("import-binary", ["data", "import", "{d}/bin.jsonl", "--store", "{d}/store"],
     {"bin.jsonl": b"\xff\xfe\x81\x00\x00"}, "bin.jsonl"),
    ("import-gzip-garbage", ["data", "import", "{d}/bad.jsonl.gz", "--store", "{d}/store"],
     {"bad.jsonl.gz": b"not gzip at all"}, "bad.jsonl.gz"),
    ("import-bad-json-line", ["data", "import", "{d}/bad.jsonl", "--store", "{d}/store"],
     {"bad.jsonl": jsonl(GOOD, "{not json")}, "bad.jsonl:2"),
    ("import-missing-reward", ["data", "import", "{d}/r.jsonl", "--store", "{d}/store"],
     {"r.jsonl": jsonl({"prompt": "p", "response": "r"})}, "reward"),
    ("import-reward-wrong-type", ["data", "import", "{d}/r.jsonl", "--store", "{d}/store"],
     {"r.jsonl": jsonl({**GOOD, "reward": "high"})}, "reward"),
    ("import-reward-nan", ["data", "import", "{d}/r.jsonl", "--store", "{d}/store"],
     {"r.jsonl": '{"prompt": "p", "response": "r", "reward": NaN}\n'}, "reward"),
    ("import-reward-out-of-range", ["data", "import", "{d}/r.jsonl", "--store", "{d}/store"],
     {"r.jsonl": jsonl({**GOOD, "reward": 5})}, "reward"),
    ("import-prompt-wrong-type", ["data", "import", "{d}/r.jsonl", "--store", "{d}/store"],
     {"r.jsonl": jsonl({**GOOD, "prompt": 3})}, "prompt"),
    ("import-json-not-a-list", ["data", "import", "{d}/r.json", "--store", "{d}/store"],
     {"r.json": json.dumps({"a": 1})}, "r.json"),
    ("import-unknown-suffix", ["data", "import", "{d}/r.txt", "--store", "{d}/store"], {"r.txt": "x"}, "r.txt"),
    ("import-solutions-unknown-task", ["data", "import", "--solutions", "nosuchtask", "--store", "{d}/store"], {},
     "nosuchtask"),
    ("import-nothing", ["data", "import", "--store", "{d}/store"], {}, "FILE"),
    ("import-store-under-a-file", ["data", "import", "{d}/ok.jsonl", "--store", "{d}/file/store"],
     {"ok.jsonl": jsonl(GOOD), "file": "x"}, "file"),
    # --- data export and the store ---
    ("export-unknown-suffix", ["data", "export", "{d}/out.txt", "--store", "{d}/store"], {}, "out.txt"),
    ("export-under-a-file", ["data", "export", "{d}/file/out.jsonl", "--store", "{d}/store"], {"file": "x"}, "file"),
    ("export-no-store", ["data", "export", "{d}/out.jsonl", "--store", "{d}/nostore"], {}, "nostore"),
    ("export-into-the-store", ["data", "export", "{d}/store/trajectories/x.parquet", "--store", "{d}/store"], {},
     "inside the store"),
    ("stats-no-store", ["data", "stats", "--store", "{d}/nostore"], {}, "nostore"),
    # --- sandbox ---
    ("sandbox-timeout-inf", ["sandbox", "run", "{d}/p.py", "--timeout", "inf"], {"p.py": "print(1)"}, "timeout"),
    ("sandbox-timeout-nan", ["sandbox", "run", "{d}/p.py", "--timeout", "nan"], {"p.py": "print(1)"}, "timeout"),
    ("sandbox-timeout-negative", ["sandbox", "run", "{d}/p.py", "--timeout", "-1"], {"p.py": "print(1)"}, "timeout"),
    ("sandbox-missing-program", ["sandbox", "run", "{d}/none.py"], {}, "none.py"),
    ("sandbox-missing-stdin", ["sandbox", "run", "{d}/p.py", "--stdin", "{d}/none.txt"], {"p.py": "print(1)"},
     "none.txt"),
    ("sandbox-binary-program", ["sandbox", "run", "{d}/p.py"], {"p.py": b"\xff\xfe\x00"}, "p.py"),
    ("sandbox-stdin-over-limit", ["sandbox", "run", "{d}/p.py", "--stdin", "{d}/big.txt"],
     {"p.py": "print(1)", "big.txt": "x" * (17 * 2**20)}, "big.txt"),
    # --- limits ---
    ("import-record-over-limit", ["data", "import", "{d}/big.jsonl", "--store", "{d}/store"],
     {"big.jsonl": jsonl({**GOOD, "prompt": "x" * (17 * 2**20)})}, "big.jsonl:1"),
    ("eval-prompt-beyond-any-context", ["eval", "--model", "{d}/model", "--task", "math:{d}/huge.jsonl"], HUGE_PROMPT,
     HUGE_REFUSED),
    ("train-prompt-beyond-any-context", ["train", "model.path={d}/model", "task.name=math:{d}/huge.jsonl"], HUGE_PROMPT,
     HUGE_REFUSED),
    ("q0-prompt-beyond-any-context", ["q0", "math:{d}/huge.jsonl", "--model", "{d}/model", "--store", "{d}/store"],
     HUGE_PROMPT, "at most 16,384 characters"),
    # --- hub ids the local cache ({d}/hf, empty) lacks: refused at once, the hub never asked ---
    ("eval-hub-model-not-cached", ["eval", "--model", "someorg/nosuchmodel"], {},
     "model someorg/nosuchmodel: no such local directory, and the hub id is not in the local cache ({d}/hf/hub)"),
    ("train-hub-model-not-cached", ["train", "model.path=someorg/nosuchmodel"], {},
     "(`hf download someorg/nosuchmodel`, with the same hf_home)"),
    ("eval-model-is-a-file", ["eval", "--model", "{d}/config.json"], {"config.json": "{}"},
     "model {d}/config.json is a file: give the model's directory"),
    # a mistyped bare name (no `/`): 35 s of the hub's retries offline before the line
    ("eval-bare-model-name-mistyped", ["eval", "--model", "tinyy"], {},
     "model tinyy: no such local directory, and the hub id is not in the local cache ({d}/hf/hub)"),
    ("import-hub-dataset-not-cached", ["data", "import", "hf:someorg/nosuchdata", "--store", "{d}/store"], {},
     "hub dataset someorg/nosuchdata is not in the local datasets cache ({d}/hf/datasets)"),
    ("import-exported-row-wrong-type", ["data", "import", "{d}/rows.jsonl", "--store", "{d}/store"],
     {"rows.jsonl": jsonl({"prompt_id": "p", "response_text": "r", "reward": 1.0, "response_tokens": [1.5]})},
     "response_tokens"),
    ("task-field-wrong-type", ["eval", "--model", "bootstrap", "--task", "math:{d}/m.jsonl"],
     {"m.jsonl": jsonl({"id": "a", "problem": 7, "answer": "7"})}, "must be a string, got int"),
    # --- inputs that never end, or would fill the memory ---
    ("sandbox-stdin-endless", ["sandbox", "run", "{d}/p.py", "--stdin", "/dev/zero"], {"p.py": "print(1)"}, "/dev/zero"),
    ("sandbox-program-endless", ["sandbox", "run", "/dev/zero"], {}, "/dev/zero"),
    ("import-endless", ["data", "import", "/dev/zero", "--store", "{d}/store"], {}, "not a regular file"),
    ("import-an-empty-file", ["data", "import", "{d}/empty.jsonl", "--store", "{d}/store"], {"empty.jsonl": "\n"},
     "{d}/empty.jsonl: no records in it; nothing imported"),
    ("import-a-plain-directory", ["data", "import", "{d}/rows.jsonl", "--store", "{d}/store"],
     {"rows.jsonl/part.txt": "a"}, "a directory, and not a hugging face dataset saved with save_to_disk"),
    ("config-endless", ["train", "/dev/zero"], {}, "not a regular file"),
    ("config-nested-too-deeply", ["train", "{d}/deep.yaml"], {"deep.yaml": "optim: " + "[" * 5000 + "]" * 5000},
     "nested too deeply"),
    ("override-huge-integer", ["train", "task.size=" + "9" * 5000], {}, "task.size"),
    ("config-billion-laughs", ["train", "{d}/laughs.yaml"], {"laughs.yaml": "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\na1: &a1 [*a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0]\na2: &a2 [*a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1]\na3: &a3 [*a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2, *a2]\na4: &a4 [*a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3, *a3]\noptim: {lr: *a4}\n"}, "optim.lr"),
    ("task-size-absurd", ["train", "task.size=99999999999999"], {}, "task.size"),
    ("toy-too-many-sequences", ["toy", "--steps", "1", "--vocab", "100", "--length", "10"], {}, "--length"),
    ("toy-unknown-environment", ["toy", "--turns", "2", "--env", "random"], {}, "--env 'random'"),
    ("serve-unknown-model", ["serve", "--model", "no/such/model", "--port", "0"], {}, "no/such/model"),
    ("bootstrap-unknown-task", ["bootstrap", "chess-tools"], {}, "chess-tools"),
    ("sandbox-timeout-overflow", ["sandbox", "run", "{d}/p.py", "--timeout", "1e7"], {"p.py": "print(1)"}, "--timeout"),
    ("lora-rank-zero", ["train", "model.lora={r: 0}"], {}, "model.lora"),
    ("lora-modules-not-a-list", ["train", "model.lora={target_modules: 5}"], {}, "model.lora"),
    ("import-negative-token", ["data", "import", "{d}/rows.jsonl", "--store", "{d}/store"],
     {"rows.jsonl": jsonl({"prompt_id": "p", "response_text": "r", "reward": 1.0, "response_tokens": [-5]})},
     "response_tokens"),
    ("import-mc-target-empty", ["data", "import", "{d}/rows.jsonl", "--store", "{d}/store"],
     {"rows.jsonl": jsonl({"prompt_id": "p", "response_text": "r", "reward": 1.0, "mc_targets": [{"a": 1}]})},
     "mc_targets"),
    ("import-logprobs-not-finite", ["data", "import", "{d}/rows.jsonl", "--store", "{d}/store"],
     {"rows.jsonl": '{"prompt_id": "p", "response_text": "r", "reward": 1, "response_tokens": [3], "behavior_logprobs": [NaN]}\n'},
     "behavior_logprobs"),
    ("import-prompt-id-not-text", ["data", "import", "{d}/rows.jsonl", "--store", "{d}/store"],
     {"rows.jsonl": jsonl({**GOOD, "prompt_id": 5})}, "prompt_id"),
    # an empty token list or prompt passed import, then ended the first training step in a reshape error
    ("import-response-tokens-empty", ["data", "import", "{d}/rows.jsonl", "--store", "{d}/store"],
     {"rows.jsonl": jsonl(GOOD, {"prompt_id": "p", "prompt_text": "q", "response_text": "r", "reward": 1.0,
                                 "tokenizer": "t", "prompt_tokens": [3], "response_tokens": []})},
     "rows.jsonl:2: field 'response_tokens' must hold at least one token"),
    ("import-row-without-prompt", ["data", "import", "{d}/rows.jsonl", "--store", "{d}/store"],
     {"rows.jsonl": jsonl(GOOD, {"prompt_id": "p", "response_text": "r", "reward": 1.0, "response_tokens": []})},
     "rows.jsonl:2: field 'prompt_text' must hold the prompt's text"),
    ("import-record-prompt-empty", ["data", "import", "{d}/rows.jsonl", "--store", "{d}/store"],
     {"rows.jsonl": jsonl(GOOD, {**GOOD, "prompt": ""})}, "rows.jsonl:2: field 'prompt' must be a non-empty text"),
    ("import-lone-surrogate", ["data", "import", "{d}/rows.jsonl", "--store", "{d}/store"],
     {"rows.jsonl": '{"prompt": "p", "response": "r\\ud800", "reward": 1}\n'}, "rows.jsonl:1"),
    ("plot-record-without-step", ["plot", "{d}/run"], {"run/metrics.jsonl": '{"loss": 1}\n'}, "metrics.jsonl, line 1"),
    ("q0-seed-negative", ["q0", "countdown", "--seed", "-1", "--store", "{d}/store"], {}, "--seed"),
    # --- q0, pts, eval, plot ---
    ("q0-temperature-zero", ["q0", "countdown", "--size", "2", "--k", "2", "--temperature", "0", "--store", "{d}/store"],
     {}, "temperature"),
    ("q0-temperature-negative", ["q0", "countdown", "--size", "2", "--k", "2", "--temperature", "-1", "--store",
                                 "{d}/store"], {}, "temperature"),
    ("q0-temperature-nan", ["q0", "countdown", "--size", "2", "--k", "2", "--temperature", "nan", "--store",
                            "{d}/store"], {}, "temperature"),
    ("q0-unknown-task", ["q0", "nosuchtask", "--store", "{d}/store"], {}, "nosuchtask"),
    ("q0-beta-inf", ["q0", "countdown", "--beta", "inf", "--store", "{d}/store"], {}, "beta"),
    ("q0-neither-task-nor-store", ["q0", "--store", "{d}/store"], {}, "give TASK to sample"),
    ("q0-task-and-from-store", ["q0", "countdown", "--from-store", "--store", "{d}/store"], {}, "not both"),
    ("q0-sampling-option-from-store", ["q0", "--from-store", "--k", "8", "--store", "{d}/store"], {},
     "--k: only when sampling a TASK"),
    ("q0-stored-option-sampling", ["q0", "countdown", "--min-k", "4", "--force", "--store", "{d}/store"], {},
     "--min-k, --force: only with --from-store"),
    ("pts-unknown-task", ["pts", "nosuchtask", "--store", "{d}/store"], {}, "nosuchtask"),
    ("pts-threshold-nan", ["pts", "countdown", "--threshold", "nan", "--store", "{d}/store"], {}, "threshold"),
    ("eval-model-missing", ["eval", "--model", "{d}/no-model"], {}, "no-model"),
    ("eval-unknown-task", ["eval", "--model", "bootstrap", "--task", "nosuchtask"], {}, "nosuchtask"),
    ("eval-top-p-nan", ["eval", "--model", "bootstrap", "--top-p", "nan"], {}, "top-p"),
    ("plot-missing-run", ["plot", "{d}/no-run"], {}, "no-run"),
    ("plot-corrupt-metrics", ["plot", "{d}/run"], {"run/metrics.jsonl": '{"step": 1}\n{torn\n{"step": 2}\n'},
     "metrics.jsonl"),
    ("toy-lr-inf", ["toy", "--lr", "inf", "--steps", "1"], {}, "lr"),
    # --- values that were silently dropped or coerced ---
    ("steps-boolean", ["train", "optim.steps=true"], {}, "optim.steps: must be a number, not a boolean"),
    ("objective-option-boolean", ["train", "data.objective.terminal=false"], {}, "data.objective.terminal"),
    ("mix-boolean", ["train", "data.mix={online: true}"], {}, "data.mix"),
    ("name-with-newline", ["train", "name=a\nb"], {}, "name: must hold printable characters only"),
    ("config-duplicate-key", ["train", "{d}/dup.yaml"], {"dup.yaml": "optim:\n  lr: 1.0e-3\n  lr: 3.0e-4\n"},
     "key 'lr' is given twice (line 3)"),
    ("config-dotted-and-nested", ["train", "{d}/both.yaml"], {"both.yaml": "optim: {lr: 1.0e-3}\noptim.lr: 3.0e-4\n"},
     "optim.lr is given twice"),
    ("config-top-level-false", ["train", "{d}/false.yaml"], {"false.yaml": "false\n"}, "must be a mapping"),
    ("config-alias-bomb-in-options", ["train", "{d}/bomb.yaml"], {"bomb.yaml": "l0: &l0 [x, x, x, x, x, x, x, x, x]\nl1: &l1 [*l0, *l0, *l0, *l0, *l0, *l0, *l0, *l0, *l0]\nl2: &l2 [*l1, *l1, *l1, *l1, *l1, *l1, *l1, *l1, *l1]\nl3: &l3 [*l2, *l2, *l2, *l2, *l2, *l2, *l2, *l2, *l2]\nl4: &l4 [*l3, *l3, *l3, *l3, *l3, *l3, *l3, *l3, *l3]\nl5: &l5 [*l4, *l4, *l4, *l4, *l4, *l4, *l4, *l4, *l4]\nl6: &l6 [*l5, *l5, *l5, *l5, *l5, *l5, *l5, *l5, *l5]\nl7: &l7 [*l6, *l6, *l6, *l6, *l6, *l6, *l6, *l6, *l6]\nl8: &l8 [*l7, *l7, *l7, *l7, *l7, *l7, *l7, *l7, *l7]\n" + "task:\n  options:\n    x: [*l8, *l8]\n"},
     "aliases"),
]


def hub_free_environ() -> dict[str, str]:
    """This environment without the Hugging Face cache and hub settings (the test's own HF_HOME rules)."""
    hub = ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    return {k: v for k, v in os.environ.items() if k not in hub}


def snapshot(store: Path) -> dict:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("args,files,names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_the_store_is_unchanged(tmp_path, args, files, names):
    for relative, content in files.items():
        write(tmp_path / relative, content)
    store = tmp_path / "store"
    seed_store(tmp_path)
    before = snapshot(store)
    argv = [a.replace("{d}", str(tmp_path)) for a in args]
    if argv[0] == "train":  # a tiny run wherever the case leaves it so: a bad value fails before any work
        argv += [f"data.store={store}", f"out_dir={tmp_path}/runs"] * (not any(a.startswith("out_dir=") for a in argv))
    out = subprocess.run([SOFTRL, *argv], capture_output=True, text=True, timeout=300,
                         env={**hub_free_environ(), "SOFTRL_DEBUG": "", "HF_HOME": str(tmp_path / "hf")})
    text = out.stdout + out.stderr
    assert out.returncode in (1, 2), text[-1500:]
    assert "Traceback" not in text, text[-3000:]
    assert len(out.stderr) < 2000, out.stderr[:500]  # short, however large the bad value (YAML aliases)
    expected = names.replace("{d}", str(tmp_path)).lower()
    assert any(expected in line.lower() for line in out.stderr.splitlines()), out.stderr[-1500:]
    assert snapshot(store) == before
    assert not (tmp_path.parent / "tmp" / "escape").exists()


@pytest.mark.parametrize("args, says", [
    (["data", "compact", "--keep-versions", "0"], "error: Invalid value for '--keep-versions': Input should be greater "
                                                  "than or equal to 1 (softrl data compact --help)"),
    (["data", "restore", "-3"], "error: No such option: -3 (softrl data restore --help)"),
    (["nosuchcommand"], "error: No such command 'nosuchcommand'. (softrl --help)"),
])
def test_a_usage_error_is_one_line_naming_the_option(args, says):
    """A bad option value or name printed click's usage text and a boxed error, five or six lines."""
    out = subprocess.run([SOFTRL, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.splitlines() == [says], out.stderr


def test_cases_cover_every_command_family():
    families = {c[1][0] if c[1][0] != "data" else f"data {c[1][1]}" for c in CASES}
    assert len(CASES) >= 60
    assert {"train", "data import", "data export", "sandbox", "q0", "pts", "eval", "plot"} <= families


# --- --debug -------------------------------------------------------------------------------------
def test_debug_shows_the_traceback(tmp_path):
    args = [SOFTRL, "data", "import", str(tmp_path / "none.jsonl"), "--store", str(tmp_path / "store")]
    quiet = subprocess.run(args, capture_output=True, text=True)
    assert "Traceback" not in quiet.stderr and quiet.returncode in (1, 2)
    for loud in (subprocess.run(args + ["--debug"], capture_output=True, text=True),
                 subprocess.run(args, capture_output=True, text=True, env={**os.environ, "SOFTRL_DEBUG": "1"})):
        assert loud.returncode != 0 and "Traceback" in loud.stderr, loud.stderr[-1000:]


# --- resume from any crash point -----------------------------------------------------------------
def run_args(root: Path, tiny, **extra) -> list[str]:
    seed_store(root)
    return [SOFTRL, "train", *tiny_overrides(str(tiny[0]), str(root), **{"log.checkpoint_every": 1,
                                                                         "log.keep_checkpoints": 3, **extra})]


def losses(root: Path) -> list[tuple[int, float]]:
    lines = (root / "run" / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], round(r["loss"], 6)) for r in map(json.loads, lines) if "loss" in r]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny):
    """A complete 4-step run (a checkpoint every step, the last 3 kept) and its losses."""
    root = tmp_path_factory.mktemp("finished")
    out = subprocess.run(run_args(root, tiny), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return root, losses(root)


def resumed_from(finished, tmp_path, damage, tiny) -> tuple[subprocess.CompletedProcess, Path]:
    """A copy of the finished run cut back to step 3 (as if killed after it: checkpoints 2 and 3),
    `damage`d, then --resume."""
    root, _ = finished
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    run = copy / "run"
    shutil.rmtree(run / "final")
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoints" / "step-000004")
    kept = [line for line in (run / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 3]
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in kept))
    damage(run)
    out = subprocess.run(run_args(copy, tiny) + ["--resume"], capture_output=True, text=True, timeout=600)
    return out, copy


def test_setup_of_the_resume_cases_is_the_run_itself(finished, tmp_path, tiny):
    """Cut back to step 3 with nothing damaged, --resume gives the uninterrupted run's losses."""
    out, copy = resumed_from(finished, tmp_path, lambda run: None, tiny)
    assert out.returncode == 0, out.stderr[-2000:]
    assert losses(copy) == finished[1]


def test_a_torn_last_metrics_line_resumes(finished, tmp_path, tiny):
    def tear(run):
        with (run / "metrics.jsonl").open("a") as f:
            f.write('{"step": 4, "loss": 0.12')

    out, copy = resumed_from(finished, tmp_path, tear, tiny)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert losses(copy) == finished[1]


def test_a_half_written_checkpoint_is_ignored(finished, tmp_path, tiny):
    """Killed while writing checkpoint 4: its temporary folder is left; the run resumes from step 3."""
    def half(run):
        partial = run / "checkpoints" / ".step-000004.tmp"
        partial.mkdir()
        (partial / "state.pt").write_bytes(b"\x80\x02partial")

    out, copy = resumed_from(finished, tmp_path, half, tiny)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "resumed from step-000003" in " ".join(out.stderr.split())
    assert losses(copy) == finished[1]


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(finished, tmp_path, tiny):
    def truncate(run):
        state = run / "checkpoints" / "step-000003" / "state.pt"
        state.write_bytes(state.read_bytes()[:100])

    out, copy = resumed_from(finished, tmp_path, truncate, tiny)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    said = " ".join(out.stderr.split())
    assert "step-000003 does not load" in said and "resumed from step-000002" in said
    assert losses(copy) == finished[1]


def test_every_checkpoint_damaged_is_one_line(finished, tmp_path, tiny):
    def ruin(run):
        for state in (run / "checkpoints").glob("step-*/state.pt"):
            state.write_bytes(b"garbage")

    out, _ = resumed_from(finished, tmp_path, ruin, tiny)
    assert out.returncode in (1, 2) and "Traceback" not in out.stderr, out.stderr[-2000:]
    said = " ".join(out.stderr.split())
    assert "no checkpoint" in said and "loads" in said and out.stderr.count("error:") == 1


def test_a_run_killed_before_its_first_checkpoint_starts_over(finished, tmp_path, tiny):
    """Its directory holds the config, the evaluation before training and a half-written first
    checkpoint: --resume starts over from step 0 and says so (and a plain run is told to --resume)."""
    def before_first(run):
        shutil.rmtree(run / "checkpoints")
        (run / "checkpoints" / ".step-000001.tmp").mkdir(parents=True)
        kept = (run / "metrics.jsonl").read_text().splitlines()[:1]
        (run / "metrics.jsonl").write_text(kept[0] + "\n")

    out, copy = resumed_from(finished, tmp_path, before_first, tiny)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "starting the run over from step 0" in " ".join(out.stderr.split())  # rich wraps long lines
    assert losses(copy) == finished[1]


def test_gzip_export_round_trip_is_not_a_failure_case(tmp_path):
    """The suffix cases above are refusals; a .jsonl.gz export is valid (a control for them)."""
    seed_store(tmp_path)
    out = subprocess.run([SOFTRL, "data", "export", str(tmp_path / "x.jsonl.gz"), "--store", str(tmp_path / "store")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert gzip.open(tmp_path / "x.jsonl.gz", "rt").readline().startswith("{")


def test_a_prompt_longer_than_the_model_is_named(tmp_path, tiny):
    """The tiny model has 256 positions: a 2,000-character prompt is refused by name before sampling."""
    write(tmp_path / "long.jsonl", jsonl({"id": "long-one", "problem": "1 + " * 500 + "1", "answer": "501"}))
    out = subprocess.run([SOFTRL, "eval", "--model", str(tiny[0]), "--task", f"math:{tmp_path}/long.jsonl",
                          "--samples", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode in (1, 2) and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "'long-one'" in out.stderr and "256 positions" in out.stderr


def test_eval_passes_a_reward_function_its_prompts(tmp_path, tiny):
    """`--task module:function` needs prompts: without them one line says how to give them; with
    `--task-option prompts=PATH` the evaluation runs."""
    write(tmp_path / "myreward.py", "def reward(prompt, response):\n    return float('1' in response)\n")
    write(tmp_path / "p.jsonl", jsonl({"id": "a", "prompt": "say 1"}, {"id": "b", "prompt": "say 11"}))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    args = [SOFTRL, "eval", "--model", str(tiny[0]), "--task", "myreward:reward", "--samples", "2",
            "--max-new-tokens", "4", "--json"]
    without = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert without.returncode in (1, 2) and "--task-option prompts=PATH" in " ".join(without.stderr.split())
    given = subprocess.run(args + ["--task-option", f"prompts={tmp_path}/p.jsonl"], capture_output=True, text=True,
                           env=env, timeout=300)
    assert given.returncode == 0, given.stderr[-2000:]
    assert json.loads(given.stdout.strip().splitlines()[-1])["problems"] == 2


WRONG_TYPES = [7, 1.5, True, None, [], ["x"], {}, {"a": 1}, "s"]
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("kind", ["codecontests", "taco", "humaneval", "mbpp", "math", "import", "exported"])
def test_a_field_of_any_wrong_type_is_a_record_error(tmp_path, kind):
    """Every field of a good record of each dataset shape, replaced in turn by values of every JSON
    type: reading it either succeeds or raises RecordError (the CLI's one line naming file and
    line), never another exception. Exported rows must also convert to the store's column types."""
    from softrl.data.io import read_trajectories
    from softrl.data.schema import Trajectory
    from softrl.tasks.records import RecordError
    from softrl.tasks.registry import load_task

    if kind == "import":
        good, read = dict(GOOD, passed=True, prompt_id="p", task="t"), lambda p: read_trajectories(p, None)
    elif kind == "exported":
        row = Trajectory("p", "r", 1.0, True, prompt_text="q", response_tokens=[1, 2], policy_version=2,
                         behavior_logprobs=[-0.5, -0.1]).to_row()
        good = {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in row.items()}
        read = lambda p: read_trajectories(p, None)  # noqa: E731
    else:
        good = json.loads((FIXTURES / f"{kind}.jsonl").read_text().splitlines()[0])
        read = lambda p: load_task(f"{kind}:{p}").prompts()  # noqa: E731
    read(write(tmp_path / "good.jsonl", jsonl(good)))
    escaped = []
    for key in good:
        for value in WRONG_TYPES:
            path = write(tmp_path / "bad.jsonl", jsonl({**good, key: value}))
            try:
                read(path)
            except RecordError as e:
                assert str(path) in str(e)
            except Exception as e:  # noqa: BLE001 - what the test is looking for
                escaped.append((key, value, f"{type(e).__name__}: {e}"))
    assert not escaped, escaped


def test_an_exported_row_with_a_truncating_type_is_refused(tmp_path):
    """Arrow would store policy_version 1.5 as 1 and token 2.5 as 2 without a word."""
    from softrl.data.io import read_trajectories
    from softrl.tasks.records import RecordError

    for key, value in (("policy_version", 1.5), ("response_tokens", [1, 2.5])):
        path = write(tmp_path / "rows.jsonl", jsonl({"prompt_id": "p", "response_text": "r", "reward": 1.0, key: value}))
        with pytest.raises(RecordError, match=key):
            read_trajectories(path, None)


def test_import_with_a_model_refuses_token_ids_outside_its_vocabulary(tmp_path, tiny):
    """Token ids of the model's tokenizer beyond its vocabulary passed import and ended the first
    training step in an index error: `data import --model` refuses the row in one line naming file,
    line, id and the ids the model has, and writes nothing; the good row alone imports."""
    from softrl.data import ExperienceStore
    from softrl.models.loading import tokenizer_fingerprint

    n = tiny[1].get_input_embeddings().num_embeddings
    good = {"prompt_id": "p", "prompt_text": "q", "response_text": "r", "reward": 1.0,
            "tokenizer": tokenizer_fingerprint(tiny[2]), "prompt_tokens": [3], "response_tokens": [4, 5]}
    rows = write(tmp_path / "rows.jsonl", jsonl(good, {**good, "response_text": "s", "response_tokens": [4, n]}))
    store = tmp_path / "store"
    args = [SOFTRL, "data", "import", str(rows), "--model", str(tiny[0]), "--store", str(store)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"error: {rows}:2: field 'response_tokens' holds token id {n}, outside the model's vocabulary (ids 0 to {n - 1})"]
    assert not store.exists()
    write(rows, jsonl(good))
    assert subprocess.run(args, capture_output=True, text=True, timeout=300).returncode == 0
    assert ExperienceStore(store).trajectories().num_rows == 1


def test_import_with_a_model_refuses_a_record_longer_than_its_positions(tmp_path, tiny):
    """A record far longer than the model's positions imported and was trained on without a word:
    `data import --model` measures it as a run would tokenise it and refuses it in one line naming
    file, record, length and positions, writing nothing."""
    positions = tiny[1].config.max_position_embeddings
    good = {"prompt_id": "p", "prompt_text": "q", "response_text": "r", "reward": 1.0}
    rows = write(tmp_path / "rows.jsonl", jsonl(good, {**good, "response_text": "x" * (2 * positions)}))
    store = tmp_path / "store"
    out = subprocess.run([SOFTRL, "data", "import", str(rows), "--model", str(tiny[0]), "--store", str(store)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    line, = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {rows}: record 2 is ") and f"over the {positions} positions of model " in line, line
    assert not store.exists()


# --- what the store does not name is not read; what it names and cannot read is said -----------
def test_train_ignores_files_no_store_version_names_and_a_corrupt_table_is_one_line(tmp_path, tiny):
    seed_store(tmp_path)
    data = tmp_path / "store" / "trajectories.lance" / "data"
    stray = data / "left-by-a-killed-writer.lance"  # written, never committed: no version names it
    stray.write_bytes(b"not really lance")
    out = subprocess.run([SOFTRL, "train", *tiny_overrides(str(tiny[0]), str(tmp_path), **{"optim.steps": 1})],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert stray.exists()  # never deleted
    committed = next(p for p in data.iterdir() if p != stray)
    committed.write_bytes(b"garbage" * 10)
    out = subprocess.run([SOFTRL, "data", "stats", "--store", str(tmp_path / "store")], capture_output=True, text=True)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
    assert "trajectories.lance" in out.stderr and "Traceback" not in out.stderr


def test_pts_names_a_source_the_store_lacks(tmp_path, tiny):
    seed_store(tmp_path)
    out = subprocess.run([SOFTRL, "pts", "countdown", "--model", str(tiny[0]), "--source", "nosuchsource", "--k", "2",
                          "--size", "6", "--store", str(tmp_path / "store")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "no trajectories of source 'nosuchsource'" in " ".join(out.stderr.split())


# --- faults while training: a signal, a second run of the same name, a full disk ----------------
def newest_checkpoint(run: Path) -> Path:
    found = sorted(p for p in (run / "checkpoints").iterdir() if p.name.startswith("step-"))
    return found[-1]


def assert_loads(checkpoint: Path) -> int:
    """The checkpoint's step; it loads (state and weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    state = torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=False)
    AutoModelForCausalLM.from_pretrained(checkpoint / "policy")
    assert checkpoint.name == f"step-{state['progress']['step']:06d}"
    return state["progress"]["step"]


def wait_for(path: Path, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()[1][-2000:]}"
        assert time.time() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


def test_ctrl_c_while_typer_builds_the_command_is_one_line():
    """The last part of loading, typer turning the app into a click command, is loading too: a Ctrl-C
    there (the 1-second case below, on a busy machine) is one line and 130, not a traceback."""
    code = ("import softrl.cli as cli\n"
            "def interrupted():\n    raise KeyboardInterrupt\n"
            "cli.command_line = interrupted\n"
            "from softrl.command import main\nmain()\n")
    done = subprocess.run([sys.executable, "-c", code, "data", "stats", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130 and done.stderr.strip() == "interrupted", done.stderr[-2000:]


@pytest.mark.parametrize("delay", [0.05, 0.3, 1.0])
def test_ctrl_c_while_the_command_line_loads_is_one_line(delay):
    """Ctrl-C before the command runs (typer, rich, torch still importing, a second or more) ends with one
    line and status 130, never a traceback; after that the command's own handling takes over."""
    proc = subprocess.Popen([SOFTRL, "data", "stats", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    # a signal before softrl's code runs (the interpreter starting, the console script's `import re`,
    # tens of milliseconds on a busy machine) meets Python's own handler, which no program can replace
    assert "Traceback" not in err or str(Path(softrl.__file__).parent) not in err, err[-2000:]
    # while importing: "interrupted", 130; before Python's own handler is in place: killed by the signal;
    # once the command runs: typer's silent 130; after it: done
    # or, earlier still, while the interpreter imports `site` (a loaded machine, CI 2026-11-28): Python's
    # own fatal error, status 1, before any program's code
    assert (proc.returncode == 130 and err.strip() in ("interrupted", "")) or proc.returncode == -signal.SIGINT \
        or (proc.returncode == 0 and "Usage" in out) \
        or (proc.returncode == 1 and err.startswith("Fatal Python error: init_import_site")), (proc.returncode, err)


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT]], ids=["sigterm", "ctrl-c-twice"])
def test_a_signal_stops_the_run_in_one_line_and_resume_continues(tmp_path, tiny, signals):
    """SIGTERM stops after the step in progress, with a checkpoint of it; a second Ctrl-C stops at
    once. Either way: exit status 128 + the signal, one line naming the step of the newest complete
    checkpoint (which loads; no temporary folder is left) and the command that continues, no
    traceback; that command then finishes the run with every step logged once."""
    args = run_args(tmp_path, tiny, **{"optim.steps": 8, "log.checkpoint_every": 2})
    run = tmp_path / "run"
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(run / "checkpoints" / "step-000002", proc, "the first checkpoint")
    for i, sig in enumerate(signals):
        time.sleep(0.3 * i)  # two signals at once would be delivered as one
        proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signals[0], stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    said = [line for line in stderr.splitlines() if "stopped by" in line]
    assert len(said) == 1 and said[0] == stderr.strip().splitlines()[-1], stderr[-2000:]
    newest = newest_checkpoint(run)
    step = assert_loads(newest)
    name = signal.Signals(signals[0]).name
    assert said[0].startswith(f"stopped by {name} at step {step} (checkpoint {newest}): continue with softrl train "), said
    assert said[0].endswith(" --resume")
    assert not list((run / "checkpoints").glob(".*.tmp")) and not (run / "final").exists()
    logged = [s for s, _ in losses(tmp_path)]
    if len(signals) == 1:  # stopped after the step in progress, which was checkpointed
        assert step == max(logged) >= 2
    before = dict(losses(tmp_path))

    again = shlex.split(said[0].split("continue with ", 1)[1])
    assert again[:2] == ["softrl", "train"]
    resumed = subprocess.run([SOFTRL, *again[1:]], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {newest.name}" in " ".join(resumed.stderr.split())
    after = losses(tmp_path)
    assert [s for s, _ in after] == list(range(1, 9))  # continuous: no step twice, none missing
    assert all(before[s] == loss for s, loss in after if s <= step)  # what was kept is kept
    assert (run / "final").is_dir() and not (run / ".lock").exists()


def test_ctrl_c_in_python_raises_run_stopped_and_resume_ends_as_an_uninterrupted_run(finished, tmp_path, tiny):
    """softrl.train: Ctrl-C during step 2 ends that step, checkpoints it (checkpoints are due only at
    the end here) and raises RunStopped, a KeyboardInterrupt of one line with the step and how to
    continue; resume=True then ends with the losses of the uninterrupted run."""
    import softrl
    from softrl.config import load_config
    from softrl.runtime.stop import RunStopped

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"log.checkpoint_every": 4}))
    handler = signal.getsignal(signal.SIGINT)

    class CtrlC(softrl.Callback):
        def on_step(self, metrics):
            if metrics["step"] == 2:
                os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt) as caught:
        softrl.train(config, callbacks=[CtrlC()], progress=False)
    e = caught.value
    assert isinstance(e, RunStopped) and e.step == 2 and e.exit_status == 130
    run = tmp_path / "run"
    assert str(e) == (f"stopped by SIGINT at step 2 (checkpoint {run / 'checkpoints' / 'step-000002'}): "
                      "continue with resume=True (softrl.train) or --resume (softrl train)")
    assert len(caught.traceback) <= 2  # raised from softrl.train, not from deep in the runtime
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000002"]
    assert signal.getsignal(signal.SIGINT) is handler  # the handlers are put back
    softrl.train(config, resume=True, progress=False)
    straight = dict(finished[1])
    assert [s for s, _ in losses(tmp_path)] == [1, 2, 3, 4]
    assert all(abs(straight[s] - loss) < 1e-4 for s, loss in losses(tmp_path))


def test_a_second_run_of_the_same_name_is_refused_while_the_first_trains(tmp_path, tiny):
    """Started while another process trains in the run directory, a run, and a --resume of it, are
    refused in one line naming the directory and that process; they touch nothing there. The lock
    dies with its process: after kill -9 the directory can be taken again."""
    from softrl.runtime.faults import RunLock

    args = run_args(tmp_path, tiny, **{"optim.steps": 1000, "log.checkpoint_every": 1000})
    run = tmp_path / "run"
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(run / "metrics.jsonl", first, "the first run's metrics")
        assert (run / ".lock").read_text().strip() == str(first.pid)
        config = (run / "config.yaml").read_bytes()
        second = [subprocess.Popen(args + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for extra in ([], ["--resume"])]
        for proc in second:
            _, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 2 and "Traceback" not in stderr, stderr[-2000:]
            assert stderr.strip() == (f"error: run directory {run} is in use by process {first.pid}, which is still "
                                      "training in it: wait for it to end or stop it (then --resume), or give this "
                                      "run another name=..."), stderr[-2000:]
        assert first.poll() is None and (run / "config.yaml").read_bytes() == config
        assert not (run / "checkpoints").exists()  # a --resume that got in would have started the run over
    finally:
        first.kill()
        first.communicate()
    assert (run / ".lock").exists()  # left by the killed run, and locking nothing
    RunLock(run).acquire().release()


@pytest.mark.parametrize("where", ["checkpoint", "metrics", "store"])
def test_a_full_disk_is_one_line_and_what_was_written_before_stays(tmp_path, tiny, monkeypatch, where):
    """ENOSPC while writing step 4's checkpoint, step 3's metrics line or step 3's online samples (committed
    with step 4's, at its checkpoint):
    one DiskFullError line naming it; the checkpoint of step 2 loads, no temporary file or torn line
    is left, the store rows before it are all there, the run directory is released, and --resume
    finishes the run once there is space."""
    import errno

    import torch

    from softrl.config import load_config
    from softrl.data import ExperienceStore
    from softrl.runtime import runlog
    from softrl.runtime.local import train
    from softrl.runtime.faults import DiskFullError

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path)))  # 4 steps, a checkpoint every 2
    run, store = tmp_path / "run", tmp_path / "store"
    full = OSError(errno.ENOSPC, "No space left on device")
    rows = []  # online rows in the store when the disk filled
    if where == "checkpoint":
        save = torch.save

        def torch_save(state, f, *a, **k):
            if state["progress"]["step"] == 4:
                f.write(b"\x80" * 100)  # some of it got out
                raise full
            return save(state, f, *a, **k)

        monkeypatch.setattr(torch, "save", torch_save)
        said = f"disk full while writing checkpoint step 4 in {run / 'checkpoints'}: earlier checkpoints and"
    elif where == "metrics":
        write = os.write

        def os_write(fd, data):
            if os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl") and b'"step": 3,' in bytes(data):
                write(fd, bytes(data)[:20])  # a torn line, unless it is taken back
                raise full
            return write(fd, data)

        monkeypatch.setattr(runlog.os, "write", os_write)
        said = f"disk full while writing metrics step 3 to {run / 'metrics.jsonl'}: earlier checkpoints (in"
    else:
        from softrl.data import lance_table

        write_fragments = lance_table.lance.fragment.write_fragments  # how a run's online rows are written

        def lance_write(table, uri, *a, **k):
            if "policy_version" in table.column_names and table.num_rows and \
                    table.column("source")[0].as_py() == "online" and 2 in table.column("policy_version").to_pylist():
                rows.append(ExperienceStore(store).trajectories(source="online", unique=False).num_rows)
                raise OSError(errno.ENOSPC, "LanceError(IO): No space left on device (os error 28)")
            return write_fragments(table, uri, *a, **k)

        monkeypatch.setattr(lance_table.lance.fragment, "write_fragments", lance_write)
        said = f"disk full while writing online samples (store rows) in {store}: earlier checkpoints (in"
    with pytest.raises(DiskFullError) as caught:
        train(config, log=lambda m: None)
    message = str(caught.value)
    assert message.startswith(said) and message.endswith("store rows are intact; free space, then --resume")
    assert "\n" not in message and caught.value.errno == errno.ENOSPC
    assert newest_checkpoint(run).name == "step-000002" and assert_loads(newest_checkpoint(run)) == 2
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]
    assert not [p for p in store.rglob("*") if p.name.startswith(".")]
    assert all(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())  # none torn
    assert not (run / ".lock").exists()
    if where == "store":
        # the failed commit is tried once more when the run closes; both found the same committed rows
        assert set(rows) == {ExperienceStore(store).trajectories(source="online", unique=False).num_rows}
        assert len(rows) == 2 and rows[0] >= 8
    monkeypatch.undo()
    summary = train(config, resume=True, log=lambda m: None)
    assert summary["steps"] == 4 and [s for s, _ in losses(tmp_path)] == [1, 2, 3, 4]


def test_a_full_disk_ends_softrl_train_in_one_line(tmp_path, tiny, monkeypatch):
    import errno

    import torch
    from typer.testing import CliRunner

    from softrl.cli import app

    seed_store(tmp_path)
    save = torch.save

    def torch_save(state, f, *a, **k):
        if state["progress"]["step"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(state, f, *a, **k)

    monkeypatch.setattr(torch, "save", torch_save)
    out = CliRunner().invoke(app, ["train", *tiny_overrides(str(tiny[0]), str(tmp_path))])
    assert out.exit_code == 1 and "Traceback" not in out.output, out.output[-2000:]
    assert (f"error: disk full while writing checkpoint step 2 in {tmp_path / 'run' / 'checkpoints'}: earlier "
            "checkpoints and store rows are intact; free space, then --resume") in out.output.splitlines()
