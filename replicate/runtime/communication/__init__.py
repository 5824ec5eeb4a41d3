"""Communication between the processes: the communicator (``comm``), tagged agreement before
every exchange (``agree``) and on a compiled step's schedule (``schedule``), the collectives'
reference rows on the host (``host_rows``) and for point-to-point traffic (``p2p``), the
communication thread (``overlap``), the process-level API (``host``, ``rp.host``) and the device
transports (``device_collectives``, ``gpu_transport``). Above ``job``; below everything else."""
