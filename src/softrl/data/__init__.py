"""The data layer: the Trajectory schema, the ExperienceStore and the batch samplers."""

from softrl.data.pool import Reads, StoredPool, TrajectoryPool
from softrl.data.samplers import GroupSampler, MixtureSampler, ReplayBuffer, replay
from softrl.data.schema import Trajectory
from softrl.data.store import ExperienceStore, Snapshot, StoreError

__all__ = ["ExperienceStore", "GroupSampler", "MixtureSampler", "Reads", "ReplayBuffer", "Snapshot", "StoreError", "StoredPool", "Trajectory",
           "TrajectoryPool", "replay"]
