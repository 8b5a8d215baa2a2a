"""The Ray runtime: N rollout-worker actors and a learner actor (rank 0 of a learner group of
`runtime.learners` actors), on a local Ray or a cluster.

The driver picks prompts, has the workers sample them (each stages its trajectories, written but
uncommitted, and the learner commits them, every few steps, in one commit), hands the rows to the learner, and
every `model_update_interval` learner steps sends the learner's weights to the workers: over
torch.distributed channels (runtime/weights.py), or through the object store
(`runtime.weight_sync: object_store`). Generation of the next batch is issued before the learner
steps on this one, so the two overlap (online rows are one version stale, or more with a larger
interval). A worker actor that dies is restarted by Ray; the driver sends it the current weights
and asks again. Same pieces as the local runtime (Session, RolloutWorker, Learner), elsewhere.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from softrl.config import ConfigError, RunConfig
from softrl.data.storage import Staged
from softrl.network import ray_module, start_or_join_ray
from softrl.runtime.ray_weights import Channels, ObjectStore


MAX_RECOVERY_TRIES = 60  # seconds, about, for Ray to restart a dead worker


class WeightSource:
    """The learner's end of weight sync, for `trained()` (a model) sent as `frozen()` (the workers'
    stored dtype): pickled through the object store, or over channels (runtime/weights.py)."""

    def weights(self):
        # on the host: workers need not share the learner's device (the object store pickles them)
        return {k: v.detach().to("cpu", copy=True) for k, v in self.trained().state_dict().items()}

    def open_weights(self, local: bool) -> tuple[str, int]:
        """Host the weight channels' store: on loopback for a local Ray, else on this node's address."""
        import ray

        from softrl.runtime.weights import WeightSender

        self.sender = WeightSender("127.0.0.1" if local else ray.util.get_node_ip_address())
        return self.sender.address

    def on_cuda(self) -> bool:
        return next(self.trained().parameters()).device.type == "cuda"

    def open_channel(self, worker: int, epoch: int, nccl: bool, dtype: str) -> None:
        import torch

        self.sender.open(worker, epoch, getattr(torch, dtype), nccl)

    def send_weights(self, workers: list[int]) -> dict[int, bool]:
        return self.sender.send(self.trained(), workers)


class _Learner(WeightSource):
    """Holds the Session (models, store, Q0, offline sources, learner) inside its own process."""

    def __init__(self, config: dict, resume: bool):
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
        self.config, self.resume = RunConfig.model_validate(config), resume
        self.session = None  # built by setup()
        self.group = None  # with runtime.learners > 1: rank 0 of the learner group
        self.evaluations: list[dict] = []  # made since the driver last asked: for its on_eval
        self.q0_done, self.said = (0, 0), []  # setup's Q0 progress and lines, for the driver to show

    def rendezvous(self, local: bool) -> str:
        """Where the learner group meets: a port of this actor's node."""
        import ray

        from softrl.runtime.group import rendezvous

        return rendezvous("127.0.0.1" if local else ray.util.get_node_ip_address())

    def setup(self, init_method: str | None = None) -> dict:
        """Builds the Session here rather than in the constructor: an error in a method call reaches
        the driver as itself (a ConfigError is reported in one line), one in a constructor as
        ActorDiedError. With a learner group, this actor is its rank 0 (the others: `_GroupMember`)."""
        from softrl.runtime.group import LearnerGroup
        from softrl.runtime.session import Session

        if self.config.runtime.learners > 1:
            self.group = LearnerGroup(self.config, init_method)
        self.session = s = Session(self.config, self.resume, log=self.said.append, group=self.group,
                                   on_eval=self.evaluations.append,
                                   progress=lambda done, total: setattr(self, "q0_done", (done, total)))
        return {"model_path": s.run.model_path, "step": s.progress.step, "version": s.learner.version,
                "seconds": s.progress.seconds}

    def setup_progress(self) -> tuple[tuple[int, int], list[str]]:
        """(Q0 prompts done, of), and the lines said since the last call: asked while `setup` runs."""
        said, self.said[:] = list(self.said), []
        return self.q0_done, said

    def new_evaluations(self) -> list[dict]:
        made, self.evaluations[:] = list(self.evaluations), []
        return made

    def trained(self):
        return self.session.policy.model

    def frozen(self):
        return self.session.run.placement.frozen

    def next_prompt_ids(self) -> list[str]:
        return [p.id for p in self.session.feed.next_prompts()]

    def step(self, online: list[dict], staged: list[Staged], elapsed: float, timings: dict[str, float]) -> dict:
        self.session.run.online_rows.add_staged(staged)  # committed every few steps, with the checkpoints
        return self.session.learn(online, elapsed, timings)

    def keep(self, staged: list[Staged]) -> None:
        """Commit the rows sampled for a step the run stops before (every sample is kept)."""
        self.session.run.online_rows.add_staged(staged)
        self.session.commit_online()

    def checkpoint(self) -> None:
        self.session.checkpoint()

    def finish(self) -> dict:
        if self.group is not None:
            self.group.close()
        return self.session.finish()


class _GroupMember:
    """A learner of the group other than rank 0, as a Ray actor (runtime/group.py, `follow`)."""

    def run(self, config: dict, rank: int, world: int, init_method: str) -> dict:
        from softrl.runtime.group import follow

        return follow(RunConfig.model_validate(config), rank, world, init_method)


class Worker:
    """A rollout worker: its own copy of the policy, the training task, the store."""

    def __init__(self, config: dict, model_path: str):
        import torch

        from softrl.assemble import load_environment, load_tasks, placement, rollout_worker
        from softrl.data import ExperienceStore
        from softrl.data.batched import StagedWriter
        from softrl.models.loading import load_causal_lm

        torch.set_num_threads(1)
        cfg = RunConfig.model_validate(config)
        self.model, tokenizer = load_causal_lm(model_path, cfg.model.dtype)
        self.placement = placement(cfg)
        self.placement.place(self.model, frozen=True)
        self.version = -1  # no weights from the learner yet
        self.receiver = None
        task, _ = load_tasks(cfg)
        self.prompts = {p.id: p for p in task.prompts()}
        # its rows are staged here and committed by the run's one committer (the learner)
        self.staged = StagedWriter(ExperienceStore(cfg.data.store))
        self.worker = rollout_worker(cfg, task, self.model, tokenizer, self.staged, env=load_environment(cfg, task))

    def pid(self) -> int:
        return os.getpid()

    def set_weights(self, weights: dict, version: int) -> int:
        self.model.load_state_dict(weights)
        self.version = version
        return version

    def on_cuda(self) -> bool:
        return self.placement.device.type == "cuda"

    def dtype(self) -> str:
        """The dtype its weights are stored in (what the learner sends it)."""
        return str(self.placement.frozen).removeprefix("torch.")

    def open_channel(self, address: tuple[str, int], index: int, epoch: int, nccl: bool) -> None:
        from softrl.runtime.weights import WeightReceiver

        self.receiver = WeightReceiver(tuple(address), index, epoch, nccl)

    def receive_weights(self, version: int) -> int:
        """The weights of `version` from the learner; -1 for a restarted worker with no channel yet
        (its next answer shows it, and the driver reopens its channel)."""
        if self.receiver is None:
            return -1
        self.receiver.receive(self.model, self.placement.frozen)
        self.version = version
        return version

    def collect(self, prompt_ids: list[str], n: int, seed: int) -> tuple[int, list[dict], list[Staged]]:
        """(the weights' version, the rows, their staged writes): a restarted worker answers with version -1."""
        self.model.eval()
        rows = self.worker.collect([self.prompts[i] for i in prompt_ids], n, self.version, seed)
        return self.version, [{**r.to_row(), "mix_source": "online"} for r in rows], self.staged.take()


PYTHON_TASKS_REFUSED = ("runtime.kind: ray builds its tasks in its actors from task.name: put the reward function "
                        "in a module and use task.name=module:function (or the local runtime)")


def train(config: RunConfig, resume: bool = False, on_step: Callable[[dict], None] | None = None,
          on_phase: Callable[[str, int, int], None] | None = None, log: Callable[[str], None] = print,
          on_eval: Callable[[dict], None] | None = None, tasks=None) -> dict:
    """The Ray runtime's run; the same contract as `softrl.runtime.local.train` (SIGINT and SIGTERM
    included), except that its tasks come from `config.task` (the actors build them), so Python-made
    `tasks` are refused."""
    import signal

    from softrl.runtime.faults import disk_full_reported
    from softrl.runtime.runlog import newest_checkpoint_step
    from softrl.runtime.stop import RunStopped, StopRequests

    if tasks is not None:
        raise ConfigError(PYTHON_TASKS_REFUSED)
    stop = StopRequests()
    with stop.installed(), disk_full_reported(config):
        try:
            return _run(config, resume, on_step, on_phase, on_eval, stop, log)
        except KeyboardInterrupt:
            stop.raised = True
            raise RunStopped(config.run_dir, newest_checkpoint_step(config.run_dir),
                             stop.signum or signal.SIGINT) from None


def _run(config: RunConfig, resume: bool, on_step, on_phase, on_eval, stop, log: Callable[[str], None]) -> dict:
    rc = config.runtime
    try:
        ray = ray_module(rc.ray_address)
    except ImportError:
        raise ConfigError("runtime.kind=ray needs Ray: pip install 'softrl[ray]'") from None
    from softrl.assemble import resolve_model

    phase = on_phase or (lambda name, done, total: None)
    resolve_model(config, phase)  # fail fast (and build the bootstrap once, saying so) before starting Ray
    started_ray = not ray.is_initialized()
    if started_ray:
        start_or_join_ray(ray, rc.ray_address, "runtime.ray_address", log, include_dashboard=False,
                          log_to_driver=False, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    members: list = []  # the learner group's ranks other than 0
    try:
        data = config.model_dump(mode="json")
        # `setup_progress` answers from a thread of its own while `setup` runs; every other call, one at a time
        learner = ray.remote(num_cpus=0, concurrency_groups={"progress": 1})(_Learner).remote(data, resume)
        phase("setup (Q0, evaluation)", 0, 1)
        init_method = ray.get(learner.rendezvous.remote(rc.ray_address is None)) if rc.learners > 1 else None
        members = [ray.remote(num_cpus=0)(_GroupMember).remote() for _ in range(1, rc.learners)]
        member_runs = [m.run.remote(data, rank, rc.learners, init_method) for rank, m in enumerate(members, 1)]
        info = _set_up(ray, learner, init_method, phase, log)
        driver = Driver(ray, config, learner, Rollouts(ray, config, learner, info), info, stop, on_step, on_eval)
        summary = driver.run(phase)
        ray.get(member_runs)
        members = []
        return summary
    finally:
        for m in members:  # a run that failed: they may wait in a collective that will not come
            ray.kill(m)
        if started_ray:
            ray.shutdown()


def _set_up(ray, learner, init_method: str | None, phase, log: Callable[[str], None]) -> dict:
    """The learner's Session built, with Q0's progress and the session's lines shown as the local
    runtime shows them; returns where the run starts (`_Learner.setup`)."""
    setting_up, finished = learner.setup.remote(init_method), False
    while not finished:
        finished = bool(ray.wait([setting_up], timeout=1.0)[0])
        (done, total), said = ray.get(learner.setup_progress.options(concurrency_group="progress").remote())
        for line in said:
            log(line)
        if total:
            phase("q0", done, total)
    return ray.get(setting_up)


class Request(NamedTuple):
    """One worker's share of a step's prompts, in flight, and the weights' version it was asked with."""

    worker: int
    share: list[str]
    answer: Any  # a Ray object ref: (version, rows, staged writes)
    version: int


class Rollouts:
    """The rollout-worker actors as the driver drives them: each step's prompts shared among them, their
    answers gathered, and a worker that died (Ray restarts it) or answered with other weights than it
    was asked with (a restart lost them) given the current weights and asked again."""

    def __init__(self, ray, config: RunConfig, learner, info: dict):
        from ray.exceptions import ActorUnavailableError, RayActorError

        self.ray, self.config, self.learner = ray, config, learner
        self.down = (RayActorError, ActorUnavailableError)  # a worker Ray is restarting
        actor = ray.remote(num_cpus=0, max_restarts=-1)(Worker)
        data = config.model_dump(mode="json")
        self.workers = [actor.remote(data, info["model_path"]) for _ in range(config.runtime.workers)]
        self.sync = (Channels(ray, learner, self.workers, local=config.runtime.ray_address is None)
                     if config.runtime.weight_sync == "broadcast" else ObjectStore(ray, learner, self.workers))
        self.version = info["version"]
        self.sync.deliver(range(len(self.workers)), self.version)
        self.pids = ray.get([w.pid.remote() for w in self.workers])
        self.restarts = 0

    def update(self, version: int) -> None:
        """Every worker gets the learner's weights, now of `version`."""
        self.version = version
        self.sync.deliver(range(len(self.workers)), version)

    def issue(self, at_step: int) -> list[Request]:
        """The learner's next prompts, shared among the workers and asked of them (nothing where the
        run does not generate)."""
        if not self.config.generates:
            return []
        ids = self.ray.get(self.learner.next_prompt_ids.remote())
        shares = [ids[i :: len(self.workers)] for i in range(len(self.workers))]
        return [self._ask(i, share, at_step) for i, share in enumerate(shares) if share]

    def _ask(self, i: int, share: list[str], at_step: int) -> Request:
        from softrl.runtime.session import generation_seed

        seed = generation_seed(self.config.seed, at_step, i)
        return Request(i, share, self.workers[i].collect.remote(share, self.config.sampling.samples_per_prompt, seed),
                       self.version)

    def gather(self, pending: list[Request], at_step: int) -> tuple[list[dict], list[Staged]]:
        """Every share's rows, and the writes every answer staged (stored, trained on or not)."""
        rows, staged = [], []
        for request in pending:
            for attempt in range(MAX_RECOVERY_TRIES):
                try:
                    got_version, got, written = self.ray.get(request.answer)
                    staged += written
                    if got_version == request.version:
                        rows += got
                        break
                except self.down:
                    time.sleep(1.0)
                self.restarts += attempt == 0
                self._revive(request.worker)
                request = self._ask(request.worker, request.share, at_step)
            else:
                raise RuntimeError(f"rollout worker {request.worker} did not come back after {MAX_RECOVERY_TRIES} tries")
        return rows, staged

    def _revive(self, i: int) -> None:
        """A restarted worker's new channel, then the current weights (still restarting: the next
        request fails the same way and waits)."""
        try:
            self.sync.reopen(i)
            self.sync.deliver([i], self.version)
            self.pids[i] = self.ray.get(self.workers[i].pid.remote())
        except self.down:
            pass

    def staged(self, pending: list[Request]) -> list[Staged]:
        """The writes the requests in flight staged (a worker that failed staged none that count)."""
        from ray.exceptions import RayError

        out = []
        for request in pending:
            try:
                out += self.ray.get(request.answer)[2]
            except RayError:
                pass
        return out


class Driver:
    """The training loop on the driver: the workers sample the next step's batch while the learner steps
    on this one, weights reach the workers every `model_update_interval` steps, and a stop request
    keeps the step in progress and the samples already asked for."""

    def __init__(self, ray, config: RunConfig, learner, rollouts: Rollouts, info: dict, stop, on_step, on_eval):
        self.ray, self.config, self.learner, self.rollouts, self.stop = ray, config, learner, rollouts, stop
        self.on_step, self.on_eval = on_step, on_eval
        self.step, self.earlier = info["step"], info["seconds"]
        self.evaluations()

    def evaluations(self) -> None:
        """The learner's evaluations made since the last call, to `on_eval`."""
        for record in self.ray.get(self.learner.new_evaluations.remote()) if self.on_eval is not None else []:
            self.on_eval(record)

    def run(self, phase) -> dict:
        ray, rollouts, steps = self.ray, self.rollouts, self.config.optim.steps
        started = time.time()
        pending = rollouts.issue(self.step)
        self.stop.stepping = True  # a first signal now waits for the step in progress
        while self.step < steps:
            waiting = time.time()
            online, staged = rollouts.gather(pending, self.step)
            timings = {"time/wait": time.time() - waiting}  # for the workers' rows: generation not overlapped
            # generation of the next batch overlaps this learner step, unless that would miss an update
            # runtime.max_staleness does not allow to miss
            early = self.step + 1 < steps and self.may_overlap(self.step + 1)
            pending = rollouts.issue(self.step + 1) if early else []
            record = ray.get(self.learner.step.remote(online, staged, self.earlier + time.time() - started, timings))
            self.step = record["step"]
            if self.step % self.config.runtime.model_update_interval == 0:
                rollouts.update(self.step)
            if not early and self.step < steps:
                pending = rollouts.issue(self.step)
            record = {**record, "worker_restarts": rollouts.restarts, "worker_pids": list(rollouts.pids)}
            if self.on_step is not None:
                self.on_step(record)
            if any(k.startswith("eval/") for k in record):
                self.evaluations()
            if self.stop.requested:
                self.stop_now(pending)
        self.stop.stepping = False
        phase("evaluate (after)", 0, 1)
        summary = {**ray.get(self.learner.finish.remote()), "worker_restarts": rollouts.restarts}
        self.evaluations()
        return summary

    def may_overlap(self, step: int) -> bool:
        """Whether the rows of `step` may be asked for before the learner step that ends at `step`: they
        then miss the update it brings, if it brings one."""
        rc = self.config.runtime
        return rc.max_staleness is None or rc.max_staleness >= 1 or step % rc.model_update_interval != 0

    def stop_now(self, pending: list[Request]) -> None:
        """Asked to stop during a step: keep it (a checkpoint), then the next batch's samples, then stop."""
        with self.stop.held():
            self.ray.get(self.learner.checkpoint.remote())
        issued = self.rollouts.staged(pending)  # a second signal while the workers finish it stops at once
        with self.stop.held():
            self.ray.get(self.learner.keep.remote(issued))
        self.stop.interrupt()
