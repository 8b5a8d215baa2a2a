"""The local runtime: one process. `sync` generates a batch, then learns on it; `async` generates
in a background thread with its own copy of the weights, refreshed every `model_update_interval`
learner steps, so generation and learning overlap (and online rows can be a few versions stale).
`max_staleness` S bounds that: async generation waits until it holds the weights sync would sample
with, or ones at most S updates older (S 0: sync's samples exactly). `policy_lag` L makes every online
row exactly L updates stale instead: generation runs the weights of L steps ago, kept as L snapshots on
the host."""

from __future__ import annotations

import collections
import copy
import queue
import signal
import threading
import time
from collections.abc import Callable

from softrl.assemble import resolve_model
from softrl.config import RunConfig
from softrl.runtime.group import LearnerGroup, follow, torchrun_rank
from softrl.runtime.faults import disk_full_reported
from softrl.runtime.runlog import newest_checkpoint_step
from softrl.runtime.session import Session, generation_seed
from softrl.runtime.stop import RunStopped, StopRequests


class Generation:
    """Where online rows come from: the policy itself (sync, interval 1), or a copy of its weights
    refreshed every `interval` steps (or always `lag` steps old), used inline (sync) or by a background
    thread (async)."""

    def __init__(self, session: Session, mode: str, interval: int, lag: int = 0, max_staleness: int | None = None):
        self.session, self.mode, self.interval, self.lag = session, mode, interval, lag
        self.max_staleness = max_staleness
        self.snapshots: collections.deque[tuple[int, dict]] = collections.deque()  # (version, weights), lag > 0
        placement = session.run.placement
        # one model for both only when nothing is stale and generation computes in the trained dtype;
        # else a copy in the compute dtype (bf16 on a GPU: half the bytes read per decoded token)
        shared = mode == "sync" and interval == 1 and not lag and placement.frozen == placement.weights
        self.model = (session.policy.model if shared
                      else placement.place(copy.deepcopy(session.policy.model), frozen=True).eval())
        self.version = session.learner.version
        self.worker = session.run.worker(self.model)
        self.pending: dict | None = None
        self.start, self.updates = session.progress.step, 0  # weight updates offered since the start
        self.lock = threading.Condition()
        self.queue: queue.Queue = queue.Queue(maxsize=1)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.produced = session.progress.step
        self.thread = None
        if mode == "async" and session.config.generates:
            self.thread = threading.Thread(target=self._produce, name="softrl-generation", daemon=True)
            self.thread.start()

    def _generate(self) -> tuple[list[dict], float]:
        """(online rows, seconds it took to sample, grade and store them)."""
        started = time.perf_counter()
        self._apply_pending()
        s = self.session
        if self.model is s.policy.model:
            self.version = s.learner.version
        self.model.eval()
        rows = self.worker.collect(s.feed.next_prompts(), s.config.sampling.samples_per_prompt, self.version,
                                   generation_seed(s.config.seed, self.produced))
        self.produced += 1
        return [{**r.to_row(), "mix_source": "online"} for r in rows], time.perf_counter() - started

    def _produce(self) -> None:
        try:
            while not self.stop.is_set() and self.produced < self.session.config.optim.steps:  # none past the end
                if not self._weights_due():  # closed while waiting: no batch after the run
                    break
                made = self._generate()
                while not self.stop.is_set():
                    try:
                        self.queue.put(made, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # noqa: BLE001 - handed to the learner's thread
            self.error = e

    def next(self) -> tuple[list[dict], dict[str, float]]:
        """(online rows, timings): `time/generation` to make them (in the background when async) and, when
        async, `time/wait`, how long the learner waited for them."""
        if not self.session.config.generates:
            return [], {}
        if self.mode == "sync":
            rows, seconds = self._generate()
            return rows, {"time/generation": seconds}
        started = time.perf_counter()
        while True:
            if self.error is not None:
                raise self.error
            try:
                rows, seconds = self.queue.get(timeout=0.1)
                return rows, {"time/generation": seconds, "time/wait": time.perf_counter() - started}
            except queue.Empty:
                continue

    def learner_stepped(self, step: int) -> None:
        """Every `interval` steps the generation weights become the learner's; with a lag L, those of
        L steps ago (until L steps have passed, the weights generation started with)."""
        if self.model is self.session.policy.model or step % self.interval:
            return
        version = self.session.learner.version
        if self.lag:
            if self.snapshots and self.snapshots[-1][0] == version:  # a skipped (non-finite) step changed nothing
                return
            dtype = next(self.model.parameters()).dtype  # generation's: bf16 on a GPU halves the copies
            self.snapshots.append((version, {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype,
                                                               copy=True)
                                             for k, v in self.session.policy.model.state_dict().items()}))
            due = None
            while self.snapshots[0][0] <= version - self.lag:
                due = self.snapshots.popleft()
            if due is None:
                return
            version, state = due
        else:
            state = {k: v.detach().clone() for k, v in self.session.policy.model.state_dict().items()}
        with self.lock:
            self.pending, self.pending_version = state, version
            self.updates += 1
            self.lock.notify_all()

    def _weights_due(self) -> bool:
        """Async with `max_staleness` S: wait until at most S of the updates sync would have applied
        before sampling this batch (one at each multiple of `interval` among the steps since the start)
        are missing; False where generation was closed meanwhile."""
        if self.max_staleness is not None:
            due = self.produced // self.interval - self.start // self.interval - self.max_staleness
            with self.lock:
                while self.updates < due and not self.stop.is_set():
                    self.lock.wait(timeout=0.1)
        return not self.stop.is_set()

    def _apply_pending(self) -> None:
        with self.lock:
            if self.pending is not None:
                self.model.load_state_dict(self.pending)
                self.version, self.pending = self.pending_version, None

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=60)


def train(config: RunConfig, resume: bool = False, on_step: Callable[[dict], None] | None = None,
          on_phase: Callable[[str, int, int], None] | None = None, log: Callable[[str], None] = print,
          on_eval: Callable[[dict], None] | None = None, tasks=None,
          start_eval: Callable[[Callable[[], dict]], dict] | None = None) -> dict:
    """Run (or resume) training; returns the summary also written to RUN_DIR/summary.json. With
    `runtime.learners` > 1 the learner is a data-parallel group (runtime/group.py) and this process
    its rank 0; a process torchrun started as another rank follows rank 0 instead. `on_step` gets
    every step's record, `on_eval` every evaluation's; `tasks`: (training, evaluation) Tasks made in
    Python instead of config.task's; `start_eval`: see `Session`. SIGINT (Ctrl-C) or SIGTERM stop the
    run after the step in progress, with a checkpoint of it (a second signal, or one outside the
    steps, at once), raising `runtime.stop.RunStopped`; a full disk raises
    `runtime.faults.DiskFullError`. Another process training in the run directory is a
    `RunInUseError`."""
    rank = torchrun_rank()
    if rank not in (None, 0):
        return follow(config, rank, config.runtime.learners)
    phase = on_phase or (lambda name, done, total: None)
    stop = StopRequests()
    session = None
    with stop.installed(), disk_full_reported(config):
        try:
            generation, group, ok = None, None, False
            try:
                group = LearnerGroup(config) if config.runtime.learners > 1 or rank is not None else None
                resolve_model(config, phase)  # a first run builds the task's reference model here
                session = Session(config, resume, log, progress=lambda done, total: phase("q0", done, total),
                                  group=group, tasks=tasks, on_eval=on_eval, start_eval=start_eval)
                rc = config.runtime
                generation = Generation(session, rc.mode, rc.model_update_interval, rc.policy_lag, rc.max_staleness)
                if resume and rc.policy_lag:
                    log(f"runtime.policy_lag: the snapshots of the last {rc.policy_lag} steps are not checkpointed: "
                        "generation starts from the restored weights, and the lag grows back to its setting")
                started = time.time()
                with stop.steps():
                    while session.progress.step < config.optim.steps:
                        with disk_full_reported(config, f"online samples (store rows) in {config.data.store}"):
                            online, timings = generation.next()
                        record = session.learn(online, session.runlog.elapsed(started), timings)
                        generation.learner_stepped(record["step"])
                        if on_step is not None:
                            on_step(record)
                        if stop.requested:  # asked to stop during this step: keep it, then stop
                            with stop.held():
                                session.checkpoint()
                            stop.interrupt()
                ok = True
            finally:
                if generation is not None:
                    generation.close()
                if group is not None:
                    group.close(ok)
            phase("evaluate (after)", 0, 1)
            return session.finish()
        except KeyboardInterrupt:
            stop.raised = True  # a signal now changes nothing: the clean-up below runs
            raise RunStopped(config.run_dir, newest_checkpoint_step(config.run_dir),
                             stop.signum or signal.SIGINT) from None
        finally:
            if session is not None:
                session.close()
