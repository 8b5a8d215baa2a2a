"""A training session: the run's pieces (`assemble.RunParts`), its data feed and its run log, put
together the same way for every runtime, and the three phases every runtime drives: the
constructor (Q0, then resume or the evaluation before training), `learn` per step, `finish`.
A runtime (local.py, ray_runtime.py) only decides where generation and learning run and how they
talk."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial

import torch

from softrl.assemble import RunParts, environment_warnings
from softrl.config import RunConfig
from softrl.data import StoreError
from softrl.data.versions import hold_name, release
from softrl.eval.protocol import policy_tokens
from softrl.rollout import positions_of
from softrl.runtime.feed import DataFeed, draws_from_store, pinned_snapshot
from softrl.runtime.model_card import write_model_card
from softrl.runtime.faults import RunLock, disk_full_reported
from softrl.runtime.runlog import (Progress, RunLog, check_run_dir, checkpoints, optional_sinks, recorded_snapshot,
                                   start_over)


def generation_seed(seed: int, step: int, worker: int = 0) -> int:
    """The sampling seed of a step's online rows (of one rollout worker's share): the same in every
    runtime, so one worker on Ray samples what local generation samples."""
    return seed * 1_000_003 + step + worker * 100_003


class Session:
    """Built in the order that fails fast: the run directory is locked (one process trains in it) and
    checked with the optional packages, models and tasks load, Q0 and the data sources are read (the
    store gets Q0's samples), and only then is the run directory written, so bad input leaves none
    behind. The lock is held until `finish` or `close`."""

    def __init__(self, config: RunConfig, resume: bool = False, log: Callable[[str], None] = print,
                 progress: Callable[[int, int], None] | None = None, group=None, tasks=None,
                 on_eval: Callable[[dict], None] | None = None,
                 start_eval: Callable[[Callable[[], dict]], dict] | None = None):
        """`group`: with `runtime.learners` > 1, rank 0's LearnerGroup (runtime/group.py), which then
        stands in for the run's learner; `tasks`: (training, evaluation) Tasks made in Python instead
        of config.task's; `on_eval`: called with every evaluation's record (step and `eval/...`);
        `start_eval(evaluate)`: the evaluation before training, given the function that makes it (a
        benchmark shares one among runs that start alike: softrl_bench/start_eval.py)."""
        self.log = log
        self.lock = RunLock(config.run_dir).acquire()  # before anything in it is read or removed
        try:
            self._start(config, resume, log, progress, group, tasks, on_eval, start_eval)
        except BaseException:
            self.close()
            raise

    def _start(self, config, resume, log, progress, group, tasks, on_eval, start_eval) -> None:
        if resume and not checkpoints(config.run_dir):  # killed before its first checkpoint was complete
            if config.run_dir.exists():
                log(f"no complete checkpoint in {config.run_dir}: starting the run over from step 0")
                start_over(config.run_dir)
            else:
                log(f"nothing to resume: {config.run_dir} does not exist; starting a new run")
            resume = False
        check_run_dir(config, resume)
        optional_sinks(config)
        self.config = config
        self.on_eval = on_eval or (lambda record: None)
        self.run = RunParts(config, tasks=tasks)
        for line in environment_warnings(config, self.run.env):  # refused early
            log(line)
        if group is not None:
            group.lead(self.run.learner)
            self.run.learner = group
        # a pinned run, and a resumed one whose snapshot is held, read Q0 where they read their rows;
        # other runs the newest (after Q0's own writes)
        snapshot = recorded_snapshot(config.run_dir) if resume else pinned_snapshot(config, self.run.store)
        reads_at = snapshot if config.data.store_version is not None or draws_from_store(config) else None
        with disk_full_reported(config, f"Q0's reference samples (store rows) in {config.data.store}"):
            q0 = self.run.q0(progress, log, reads_at)
        self.feed = DataFeed(config, self.run.store, self.run.train_task, q0, self.run.tokenizer, log,
                             self.run.policy.model.get_input_embeddings().num_embeddings, snapshot,
                             hold_as=hold_name(config.run_dir), positions=positions_of(self.run.policy.model))
        self.runlog = RunLog(config, resume)
        if not resume:
            self.runlog.record_store(self.feed.snapshot)
        self.progress = Progress()
        self.checkpointed = 0  # the step of the newest checkpoint
        if resume:
            name, state = self.runlog.restore(self.run.policy.model, log)
            self.run.learner.load_state_dict(state["learner"])
            self.progress = Progress(**state["progress"])
            self.checkpointed = self.progress.step
            self.feed.load_state_dict(state["rng"])
            torch.set_rng_state(state["rng"]["torch"])
            log(f"resumed from {name}")
        else:
            self.runlog.write(self.evaluated({"step": 0, "samples": 0, "time": 0.0}, start_eval))
        self.runlog.eval_seconds = 0.0  # the run's clock starts after this
        if self.progress.step < self.config.optim.steps:  # the first step's stored rows start coming now
            self.feed.prefetch()

    @property
    def policy(self):
        return self.run.policy

    @property
    def learner(self):
        return self.run.learner

    def evaluated(self, record: dict, shared: Callable[[Callable[[], dict]], dict] | None = None) -> dict:
        """`record` (its step, samples, time) with the policy's evaluation on the held-out prompts as
        `eval/...` numbers, also handed to `on_eval`; evaluation time is not training time. `shared`:
        where the evaluation may come from instead (`start_eval`)."""
        started = time.time()
        evaluate = partial(self.run.evaluate, self.run.policy.model)
        result = shared(evaluate) if shared is not None else evaluate()
        self.runlog.eval_seconds += time.time() - started
        record = {**record, **{f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float)) and v is not None}}
        self.on_eval(record)
        return record

    def learn(self, online: list[dict], elapsed: float, timings: dict[str, float] | None = None) -> dict:
        """One learner step on the online rows plus the other sources' share; logs the step,
        evaluates and checkpoints when due. Returns the step's record. `elapsed`: the runtime's wall
        time when the online rows were ready (`runlog.elapsed`); the record's time is at the end of the
        learner step, evaluations not counted. `timings`: the runtime's `time/...` seconds of this step
        (generation), logged with the learner's (forward, backward, optimizer)."""
        cfg, p = self.config, self.progress
        started = time.time()
        batch = self.feed.batch(online)
        metrics = self.run.learner.step(batch)
        elapsed = self.runlog.training_seconds(elapsed + time.time() - started)
        p.step += 1
        p.samples += len(online)
        p.tokens += policy_tokens(online)
        p.seconds = elapsed
        record = {"step": p.step, "samples": p.samples, "tokens": p.tokens, "time": round(elapsed, 2),
                  "samples_per_s": p.samples / max(elapsed, 1e-9), "batch_rows": len(batch),
                  "online_pass_rate": sum(r["passed"] for r in online) / max(len(online), 1), **metrics,
                  **(timings or {}), **self.feed.draw_seconds}
        if cfg.eval.every and p.step % cfg.eval.every == 0 and p.step < cfg.optim.steps:
            record = self.evaluated(record)
        self.runlog.write(record)
        if p.step % cfg.log.checkpoint_every == 0 or p.step == cfg.optim.steps:
            self.checkpoint()
        return record

    def checkpoint(self) -> None:
        """A checkpoint of the run as it is now, between steps (unless there is one of this step)."""
        p = self.progress
        if self.checkpointed == p.step or not p.step:
            return
        self.commit_online()  # the store has every row the checkpoint's steps sampled
        self.runlog.checkpoint(p.step, self.run.policy.model, {
            "learner": self.run.learner.state_dict(), "progress": vars(p),
            "rng": {**self.feed.state_dict(), "torch": torch.get_rng_state()}})
        self.checkpointed = p.step

    def finish(self) -> dict:
        """The evaluation after training, the final weights, plots and summary.json."""
        p = self.progress
        self.commit_online()  # here a failing store is the run's error, whatever called it
        after = self.evaluated({"step": p.step, "samples": p.samples, "time": round(p.seconds, 2)})
        self.runlog.write(after)
        final = self.runlog.run_dir / "final"
        self.run.policy.save_final(final)
        summary = self.runlog.finish(p, after)
        write_model_card(final, self.config, self.run.model_path, self.run.train_task.name, summary,
                         held_out=self.run.eval_task is not self.run.train_task)
        self.feed.close()  # no draw reads the store after its hold goes
        if self.feed.reads_store:  # last: a stopped or failed run keeps its hold, as --resume reads it again
            name = hold_name(self.config.run_dir)
            try:
                release(self.run.store, name)
            except StoreError as e:  # the run is done: its results stand, the hold only keeps old versions
                self.log(f"warning: the run's hold on its store version stays ({e}): softrl data tag {name} "
                         f"--delete --store {self.config.data.store}")
        self.close()
        return summary

    def commit_online(self) -> None:
        """The online rows kept since the last commit, to the store (a full disk: one line naming them)."""
        with disk_full_reported(self.config, f"online samples (store rows) in {self.config.data.store}"):
            self.run.online_rows.flush()

    def close(self) -> None:
        """Wait for a draw of stored rows in flight, commit the online rows kept so far and release the run
        directory (also when the run failed or was stopped; a store that fails again then is left to the
        error already raised)."""
        in_flight = sys.exc_info()[1]  # close() from a `finally` or `except` of a failure
        try:
            if getattr(self, "feed", None) is not None:
                self.feed.close()
            if getattr(self, "run", None) is not None and self.run.online_rows is not None:
                self.commit_online()
        except Exception:
            if in_flight is None:
                raise
        finally:
            self.lock.release()
