"""The runtime: Replicator, communicator, input sharding."""

from . import gpu_transport, host_rows, p2p  # noqa: F401  (device transports; the communication rows)
from .actor_learner import ActorLearner
from .actors import ActorContext
from .data import shard_batches, steps_per_epoch
from .replicator import Replicator

__all__ = ["ActorContext", "ActorLearner", "Replicator", "shard_batches", "steps_per_epoch"]
