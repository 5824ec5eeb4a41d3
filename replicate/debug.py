"""Debug output switched on by ``REPLICATE_DEBUG`` (comma-separated flags).

``ir``: the step's graph after tracing and after the step pipeline; ``passes``: the graph after
every pass; ``cuda``: the generated CUDA source of each kernel; ``transport``: which transport
carries a device backend's collectives, and why (``runtime/communication/gpu_transport.py``);
``cuda_graph``: when the cupy backend captures a step as a CUDA graph, replays it or does not,
and why (``backends/cuda_graph.py``).
"""

from __future__ import annotations

import os


def debug_enabled(flag: str) -> bool:
    return flag in os.environ.get("REPLICATE_DEBUG", "").split(",")
