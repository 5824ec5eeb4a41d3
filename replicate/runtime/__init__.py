"""The runtime: Replicator, communicator, input sharding."""

from . import host_rows  # noqa: F401  (fills the reference table's communication rows)
from .actor_learner import ActorLearner
from .actors import ActorContext
from .data import shard_batches, steps_per_epoch
from .replicator import Replicator

__all__ = ["ActorContext", "ActorLearner", "Replicator", "shard_batches", "steps_per_epoch"]
