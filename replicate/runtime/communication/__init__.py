"""Communication between the processes: the communicator (``comm``), tagged agreement before
every exchange (``agree``) and on a compiled step's schedule (``schedule``), the collectives'
reference rows on the host (``host_rows``) and for point-to-point traffic (``p2p``), the
communication thread (``overlap``), the process-level API (``host``, ``rp.host``) and the
transports — the host's (``transport``), NCCL's and a CUDA-aware MPI's (``device_collectives``,
chosen in ``gpu_transport``). Above ``job``; below everything else.

A collective's meaning is written once, as a row of the collective rewrite; graph mode emits it
into the step, eager mode runs it at once after the processes agree on the call (``host_rows``),
and every exchange it makes (``mpi_*``, a bucket's ``comm_start``/``comm_wait``) runs through
one transport interface (``backends.base.Transport``: ``allreduce``, ``allgather``,
``broadcast``, ``start``, ``wait``) by one table (``graph.collectives.EXCHANGES``).

**A new collective** touches four files, none of them here:

1. ``graph/collectives.py``: its declaration (``declare(..., placeholder=True, effect=True)``
   with its shape rule) and its name in ``PLACEHOLDERS``;
2. ``graph/vjp_rules.py``: its gradient rule (a collective again);
3. ``graph/passes/replicate_collectives.py``: its lowering row in ``LOWER`` (local combine,
   exchange through the ``mpi_*`` nodes, fan-out to the replicas) — graph and eager mode alike;
4. ``collectives.py``: the public wrapper, named in its ``__all__`` (``rp.*``).

Only a collective that needs a new kind of exchange adds more: its ``mpi_*`` primitive and its
``EXCHANGES`` call (``graph/collectives.py`` again), and the method on the transports (here:
``transport.py``, ``device_collectives.py``; and ``backends/base.py``'s ``Transport``).
"""
