"""The job and its processes: each rank's status record (``status``), MPICH's shared-memory
files (``mpi_shm``), the stall watchdog (``watchdog``) and the hooks that end the whole job when
one rank fails or leaves (``hooks``). The lowest room of the runtime: it imports no other."""
