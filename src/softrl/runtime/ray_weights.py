"""How the Ray driver has the learner's weights reach the rollout workers: over torch.distributed
channels (runtime/weights.py), one per worker and reopened when Ray restarts it (`Channels`), or
through Ray's object store (`ObjectStore`). Both: `reopen(i)`, `deliver(indices, version)`."""

from __future__ import annotations


class Channels:
    """The driver's view of the weight channels (runtime/weights.py): one per worker, reopened under a
    new epoch when Ray restarts the worker; NCCL where the learner and the worker are both on CUDA."""

    def __init__(self, ray, learner, workers: list, local: bool):
        self.ray, self.learner, self.workers = ray, learner, workers
        self.address = ray.get(learner.open_weights.remote(local))
        self.learner_cuda = ray.get(learner.on_cuda.remote())
        self.epochs = [0] * len(workers)
        for i in range(len(workers)):
            self.reopen(i)

    def reopen(self, i: int) -> None:
        """Worker i's channel: both ends meet (the learner waits for the worker), under a new epoch."""
        worker_cuda = self.ray.get(self.workers[i].on_cuda.remote())  # raises while Ray is still restarting it,
        self.epochs[i] += 1  # before the learner would wait for it in vain
        nccl = self.learner_cuda and worker_cuda
        dtype = self.ray.get(self.workers[i].dtype.remote())
        joined = self.workers[i].open_channel.remote(self.address, i, self.epochs[i], nccl)
        self.ray.get([self.learner.open_channel.remote(i, self.epochs[i], nccl, dtype), joined])

    def deliver(self, indices, version: int) -> None:
        """The learner's current weights to workers `indices`; one that is down gets them when it is
        back (`reopen`, then `deliver` again)."""
        from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

        indices = list(indices)
        received = [self.workers[i].receive_weights.remote(version) for i in indices]
        self.ray.get(self.learner.send_weights.remote(indices))
        for ref in received:
            try:
                self.ray.get(ref)
            except (RayActorError, ActorUnavailableError, RayTaskError):
                pass  # it answers its next request with an older version, and `reopen` follows


class ObjectStore:
    """Weight sync through Ray's object store: the learner's state dict, pickled once per version,
    loaded by each worker. The same interface as `Channels`; a restarted worker needs nothing reopened."""

    def __init__(self, ray, learner, workers: list):
        self.ray, self.learner, self.workers = ray, learner, workers
        self.version, self.weights = None, None

    def reopen(self, i: int) -> None:
        pass

    def deliver(self, indices, version: int) -> None:
        """The learner's weights of `version` to workers `indices`; one that is down gets them when it is back."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        if version != self.version:
            self.version, self.weights = version, self.learner.weights.remote()
        for i in indices:
            try:
                self.ray.get(self.workers[i].set_weights.remote(self.weights, version))
            except (RayActorError, ActorUnavailableError):
                pass
