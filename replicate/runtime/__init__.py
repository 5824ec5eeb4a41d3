"""The runtime: Replicator, communicator, input sharding."""

from .data import shard_batches, steps_per_epoch
from .replicator import Replicator

__all__ = ["Replicator", "shard_batches", "steps_per_epoch"]
