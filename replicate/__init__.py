"""replicate: write one training step for one replica, run it on many.

>>> import replicate as rp, replicate.numpy as rnp
>>> x = rnp.asarray(2.0)
>>> float(rp.grad(x ** 3, x))
12.0
"""

from . import (
    collectives,
    distributions,
    dtypes,
    nn,
    numpy,  # noqa: F401  (installs the array operators)
    optim,
    profile,
    runtime,
)
from .collectives import *  # noqa: F403  (every collective: collectives.__all__)
from .compiler import CompileOptions
from .context import ReplicaContext, num_replicas, replica_id
from .control import cond, switch
from .custom import custom_vjp
from .dtypes import autocast, bfloat16, float16
from .errors import (
    ActorError,
    CheckpointError,
    CollectiveMismatchError,
    ConfigMismatchError,
    DivergenceError,
    DTypeError,
    HabitError,
    IndexOutOfRangeError,
    InputError,
    NonFiniteError,
    NumpyConversionError,
    PlacementError,
    ReplicaContextError,
    ReplicateError,
    ShapeError,
    TracerConversionError,
)
from .function import Function, function
from .graph.autodiff import grad, value_and_grad
from .graph.core import Array, Graph
from .graph.devices import logical_device
from .memory import memory_report
from .optim import wrap_optimizer
from .remat import remat
from .runtime import ActorContext, ActorLearner, Replicator
from .runtime.communication import host
from .runtime.communication.host import barrier, is_main_process, process_count, process_index
from .runtime.inputs import data
from .runtime.inputs.data import shard_batches
from .runtime.loop import callbacks
from .runtime.variables import checkpoint
from .state import Variable

stop_gradient = numpy.stop_gradient  # (also rnp.stop_gradient)

__version__ = "0.1.0"

profile.start_from_environment()  # REPLICATE_PROFILE=trace.json: the whole program, at exit

# under mpiexec: MPI, and the hooks that end the job when a rank fails or leaves, come up now
# (replicate/runtime/job/hooks.py)
if runtime.communication.comm.launched_by_mpi():
    runtime.communication.comm.world()

__all__ = [
    "Array", "CollectiveMismatchError", "CompileOptions", "Function", "Graph", "ReplicaContext",
    "ReplicateError", "InputError", "NonFiniteError", "NumpyConversionError", "CheckpointError",
    "DivergenceError",
    "ShapeError", "TracerConversionError", "Variable", "cond", "switch", "function", "grad",
    "num_replicas", "replica_id", "value_and_grad", "__version__", "Replicator",
    *collectives.__all__, "nn", "optim", "wrap_optimizer",
    "data", "callbacks", "checkpoint", "shard_batches", "DTypeError", "IndexOutOfRangeError",
    "ReplicaContextError", "ConfigMismatchError", "custom_vjp", "stop_gradient", "autocast",
    "bfloat16", "float16", "dtypes", "host", "barrier", "is_main_process", "process_count",
    "process_index", "logical_device", "PlacementError",
    "process_index", "ActorLearner", "ActorContext", "ActorError", "profile", "remat",
    "memory_report", "HabitError", "distributions",
]
