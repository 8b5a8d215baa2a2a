"""The run log: a run's directory and what is written to it. The resolved config, metrics.jsonl
(and TensorBoard / Weights & Biases), atomic checkpoints, the training clock, plots and summary.json.
What a full disk or a second process in the directory meet: runtime/faults.py."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from softrl.config import ConfigError, RunConfig
from softrl.data.store import Snapshot
from softrl.files import whole_file
from softrl.runtime.faults import LOCK_NAME, check_not_in_use, disk_full, is_disk_full, save_state
from softrl.runtime.stop import deferred


class NonFiniteWeightsError(RuntimeError):
    """A step left the trained weights with a NaN or inf."""


@dataclass
class Progress:
    step: int = 0
    samples: int = 0  # online samples generated
    tokens: int = 0  # the policy's tokens in them (an episode's environment turns are not its)
    seconds: float = 0.0  # training wall time so far (kept across resumes; evaluations left out)


def optional_sinks(config: RunConfig) -> list:
    """Openers of the optional metric sinks (TensorBoard, Weights & Biases); each returns a
    `write(step, numbers)`. Checked up front so that a missing package creates nothing."""
    sinks = []
    if config.log.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ConfigError("log.tensorboard needs TensorBoard: pip install 'softrl[tensorboard]'") from e

        def tensorboard(run_dir: Path, cfg: RunConfig):
            writer = SummaryWriter(str(run_dir / "tensorboard"))

            def write(step: int, numbers: dict) -> None:
                for key, value in numbers.items():
                    writer.add_scalar(key, value, step)
                writer.flush()

            return write

        sinks.append(tensorboard)
    if config.log.wandb:
        try:
            import wandb
        except ImportError as e:
            raise ConfigError("log.wandb needs Weights & Biases: pip install 'softrl[wandb]'") from e

        def weights_and_biases(run_dir: Path, cfg: RunConfig):
            run = wandb.init(project=cfg.log.wandb_project, name=cfg.name, dir=str(run_dir),
                             config=cfg.model_dump(mode="json"), resume="allow")
            return lambda step, numbers: run.log(numbers, step=step)

        sinks.append(weights_and_biases)
    return sinks


def check_run_dir(config: RunConfig, resume: bool) -> None:
    """A new run needs an empty directory (or one a `--resume` starts over in), and no other process
    training in it."""
    run_dir = config.run_dir
    check_not_in_use(run_dir)
    if run_dir.exists() and not resume and any(p.name != LOCK_NAME for p in run_dir.iterdir()):
        raise ConfigError(f"run directory {run_dir} exists: pass --resume, or another name=...")


# what a run writes into its directory: all of it goes when a run with no intact checkpoint starts over
RUN_FILES = ("config.yaml", "store.json", "metrics.jsonl", "checkpoints", "final", "summary.json", "tensorboard", "wandb")


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, newest first (one a crash left half-written is a hidden
    temporary folder, never a `step-` one)."""
    root = run_dir / "checkpoints"
    found = [p for p in root.iterdir() if p.name.startswith("step-") and (p / "state.pt").is_file()] if root.is_dir() else []
    return sorted(found, reverse=True)


def newest_checkpoint_step(run_dir: Path) -> int:
    """The step of the run's newest complete checkpoint (0: none)."""
    found = checkpoints(Path(run_dir))
    return int(found[0].name.removeprefix("step-")) if found else 0


def replace_text(path: Path, text: str) -> None:
    """`path` holds `text`, or (a full disk, a signal) what it held before: written beside it, then renamed."""
    with whole_file(path) as work:
        work.write_text(text)


def start_over(run_dir: Path) -> None:
    """Remove what a run wrote to `run_dir` (nothing else there), so that it starts from step 0."""
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for leftover in [*run_dir.glob("*.png"), *run_dir.glob(".*.tmp")]:  # plots; a killed replace_text's file
        leftover.unlink()


def recorded_snapshot(run_dir: Path) -> Snapshot | None:
    """The store versions an earlier session of the run read (store.json), so that a resumed run reads
    the same rows; None for a run directory without one."""
    path = run_dir / "store.json"
    return Snapshot(json.loads(path.read_text())["versions"]) if path.exists() else None


class RunLog:
    def __init__(self, config: RunConfig, resume: bool):
        check_run_dir(config, resume)
        openers = optional_sinks(config)  # a missing package fails before anything is created
        self.config, self.run_dir = config, config.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        replace_text(self.run_dir / "config.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.writers = [open_sink(self.run_dir, config) for open_sink in openers]
        self.earlier_seconds = 0.0  # training time of the sessions before a resume
        self.eval_seconds = 0.0  # evaluation is not training: left out of the clock

    # --- the clock ----------------------------------------------------------------------------
    def record_store(self, snapshot: Snapshot) -> None:
        """store.json: the store and the versions of its tables the run reads (`data.store_version`)."""
        data = self.config.data
        replace_text(self.run_dir / "store.json", json.dumps({"store": data.store, "store_version": data.store_version,
                                                              "versions": snapshot.versions}, indent=2))

    def elapsed(self, started: float) -> float:
        """Wall time of the run so far: the earlier sessions' and this one's since `started`."""
        return self.earlier_seconds + time.time() - started

    def training_seconds(self, elapsed: float) -> float:
        return elapsed - self.eval_seconds

    # --- metrics ------------------------------------------------------------------------------
    def write(self, record: dict) -> None:
        line = memoryview((json.dumps(record) + "\n").encode())
        fd = os.open(self.metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
            try:
                while line:
                    line = line[os.write(fd, line):]
            except OSError as e:
                try:  # no torn line left behind
                    os.ftruncate(fd, size)
                except OSError:
                    pass
                if is_disk_full(e):
                    raise disk_full(f"metrics step {record.get('step')} to {self.metrics_path}", self.run_dir) from e
                raise
        finally:
            os.close(fd)
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        for write in self.writers:
            write(record["step"], numbers)

    def records(self) -> list[dict]:
        from softrl.plots import read_metrics

        return read_metrics(self.run_dir)

    # --- checkpoints --------------------------------------------------------------------------
    def checkpoint(self, step: int, model, state: dict) -> Path:
        """`model`'s weights and `state` (torch.save-able), written atomically; older ones pruned.
        Weights that are not all finite are refused (the intact checkpoints before them stay)."""
        bad = next((name for name, p in model.named_parameters() if not torch.isfinite(p).all()), None)
        if bad is not None:
            raise NonFiniteWeightsError(f"the weights after step {step} are not finite ({bad}): not saved; "
                                        f"lower optim.lr, then --resume from {self.run_dir / 'checkpoints'}")
        root = self.run_dir / "checkpoints"
        for stale in root.glob(".step-*.tmp"):  # left by a run killed while writing one
            shutil.rmtree(stale, ignore_errors=True)
        final = root / f"step-{step:06d}"
        work = root / f".{final.name}.tmp"
        with deferred():  # Ctrl-C or SIGTERM: once this checkpoint is complete
            shutil.rmtree(work, ignore_errors=True)
            try:
                work.mkdir(parents=True)
                model.save_pretrained(work / "policy")
                save_state(state, work / "state.pt")
                shutil.rmtree(final, ignore_errors=True)
                work.rename(final)
            except BaseException as e:
                shutil.rmtree(work, ignore_errors=True)  # the complete ones before it are untouched
                if is_disk_full(e):
                    raise disk_full(f"checkpoint step {step} in {root}", self.run_dir) from e
                raise
            for old in sorted(p for p in root.iterdir() if p.name.startswith("step-"))[: -self.config.log.keep_checkpoints]:
                shutil.rmtree(old)
        return final

    def restore(self, model, log=print) -> tuple[str, dict]:
        """The newest intact checkpoint's weights into `model`; returns (its name, its state). One that
        does not load (a damaged file) is reported in a line and the one before it tried. Metrics
        logged after it are dropped."""
        from transformers import AutoModelForCausalLM

        for checkpoint in checkpoints(self.run_dir):
            try:
                state = torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=False)
                weights = AutoModelForCausalLM.from_pretrained(checkpoint / "policy", dtype=model.dtype).state_dict()
                step, seconds = state["progress"]["step"], state["progress"]["seconds"]
            except Exception as e:  # noqa: BLE001 - any damage: the previous checkpoint is intact
                log(f"checkpoint {checkpoint} does not load ({type(e).__name__}): trying the one before it")
                continue
            model.load_state_dict(weights)
            kept = [r for r in self.records() if r.get("step", 0) <= step] if self.metrics_path.exists() else []
            replace_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
            self.earlier_seconds = seconds
            return checkpoint.name, state
        raise ConfigError(f"no checkpoint in {self.run_dir / 'checkpoints'} loads: remove {self.run_dir} to start over")

    # --- the end ------------------------------------------------------------------------------
    def finish(self, progress: Progress, after: dict) -> dict:
        """Plots and summary.json (pass@k before and after); returns the summary."""
        from softrl.plots import plot_run

        plots = plot_run(self.run_dir)
        before = next((r for r in self.records() if r["step"] == 0 and "eval/pass@1" in r), {})
        summary = {
            "run_dir": str(self.run_dir), "steps": progress.step, "samples": progress.samples,
            "seconds": round(progress.seconds, 1),
            "pass@1_before": before.get("eval/pass@1"), "pass@10_before": before.get("eval/pass@10"),
            "pass@1_after": after.get("eval/pass@1"), "pass@10_after": after.get("eval/pass@10"),
            "plots": [str(p) for p in plots], "threads": torch.get_num_threads(),
        }
        replace_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        return summary
