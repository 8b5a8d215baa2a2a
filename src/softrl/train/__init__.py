"""Training: batches of trajectories as tensors, the per-source objectives, and the Learner."""

from softrl.train.batch import Batch, make_batch
from softrl.train.learner import Learner, NonFiniteLossError

__all__ = ["Batch", "Learner", "NonFiniteLossError", "make_batch"]
