"""The runtime: the job, its processes' communication, and the training loop over them.

Its rooms, each importing only the rooms listed before it:

* ``job``: the job and its processes — status records, the hooks that end the job when a rank
  fails or leaves, MPICH's shared-memory files, the stall watchdog;
* ``communication``: the communicator, tagged agreement, schedule agreement, the host and device
  collectives, point-to-point rows, the communication thread;
* ``checks``: what user code hands in, non-finite values, divergence, construction alike;
* ``inputs``: sharding a dataset, input prefetch, staging batches on the device;
* ``variables``: checkpoints, the Variables that live on one logical device;
* ``loop``: ``Replicator`` and what runs around it (layout, outputs, callbacks);
* ``actors``: the asynchronous actor-learner regime, built on the loop.

The launcher and the bootstrap (``python -m replicate.launch``, ``python -m replicate``) are a
package of their own, ``replicate/launch``.
"""

from .actors.learner import ActorLearner
from .actors.pool import ActorContext
from .communication import gpu_transport, host_rows, p2p  # noqa: F401  (transports; rows)
from .inputs.data import shard_batches, steps_per_epoch
from .loop.replicator import Replicator

__all__ = ["ActorContext", "ActorLearner", "Replicator", "shard_batches", "steps_per_epoch"]
