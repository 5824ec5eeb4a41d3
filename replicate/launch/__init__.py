"""Starting a job: the launcher (``python -m replicate.launch``, ``replicate-launch``:
``launcher``) runs ``mpiexec`` over the bootstrap (``python -m replicate``: ``bootstrap``) on
every rank. Above the runtime's ``job`` and ``communication`` rooms, which it starts."""

from .launcher import (
    NO_VALUE,
    XLA_MEMORY_VARIABLES,
    command,
    find_mpiexec,
    gpu_environment,
    main,
    parse,
    share_threads,
    verdict,
)

__all__ = ["NO_VALUE", "XLA_MEMORY_VARIABLES", "command", "find_mpiexec", "gpu_environment",
           "main", "parse", "share_threads", "verdict"]
