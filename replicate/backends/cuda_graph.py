"""Opt-in CUDA-graph replay of a CuPy step (issue 31): a step captured once as a CUDA graph and
replayed, so a call costs the copies of its inputs, one graph launch and the copies of its
outputs instead of a Python call and a launch per kernel. Off by default (a replayed step keeps
its graph's intermediate values alive): ``rp.CompileOptions(cuda_graph=True)`` or
``REPLICATE_CUDA_GRAPH=1`` turn it on; ``REPLICATE_DEBUG=cuda_graph`` says when and why a step is
not replayed. On an H200 the MLP, conv and GPT steps replay bit for bit as their normal runs, at
0.6-0.95x PyTorch eager (``docs/guides/gpu.md``).

A step is eligible when none of its nodes communicates, runs on the host or has an effect (a
host-staged exchange synchronises the host, NCCL's handles are per call). Its products are
captured because the backend calls cuBLAS directly (``cuda_blas.py``; CuPy's own wrappers refuse
a capturing stream); ``before_capture(stream)`` binds that handle to the capturing stream first.
A step with an ``einsum`` of three or more operands or a ``linalg`` row (``cupy.einsum``,
cuSOLVER) fails its capture and runs normally. Then, per executable:

1. the first call runs as always (the warm-up: every kernel compiled, cuBLAS's handle made);
2. the second copies its inputs into buffers of the graph's own (made once, outside the
   capture: a graph reads fixed addresses), captures the steps on a stream of its own
   (``begin_capture``, CuPy's default relaxed mode) with every allocation made from a private
   memory pool (``using_allocator``), kept alive with the graph and never used again, so no
   address the graph writes is ever handed to anything else; the arrays made are kept too. On a
   GPU capture runs nothing: the values of the capture are never read. The graph is launched,
   and its outputs compared bitwise with a normal run of the same inputs, whose outputs the
   call returns: a difference turns the replay off for good, with a warning;
3. later calls copy the inputs in, launch the graph on the current stream, read the device
   index flags its kernels wrote (``cupy_index.py``) and return copies of the outputs (the next
   replay writes the same buffers; a caller may keep a result across steps).

Anything that fails during the capture (CUDA refuses an operation while a stream captures: a
synchronisation, a copy to the host, a kernel of a library that synchronises) ends the capture
and turns the replay off for this executable; the call runs normally. A call whose inputs have
another shape, dtype, or another split between host- and device-checked index arrays than the
captured one, or that runs under the profiler, runs normally too.
"""

from __future__ import annotations

import os
import warnings

from .. import profile
from ..debug import debug_enabled
from ..graph.primitives import REGISTRY

ENV = "REPLICATE_CUDA_GRAPH"


def requested(option: bool) -> bool:
    """Whether replay is asked for: the compile option, or ``REPLICATE_CUDA_GRAPH=1``."""
    return bool(option) or os.environ.get(ENV, "") == "1"


def note(message: str) -> None:
    if debug_enabled("cuda_graph"):
        print(f"# cuda graph: {message}", flush=True)


def ineligible(graph) -> str | None:
    """Why ``graph`` cannot be replayed as a CUDA graph, or None."""
    for node in graph.nodes:
        spec = REGISTRY[node.prim]
        if spec.host or spec.effect or spec.exchange:
            return f"its {node.prim} node communicates or runs on the host"
    return None


def _bitwise_equal(cp, device, got, want) -> bool:
    """Whether each pair of device arrays holds the same bits (one flag read for all)."""
    if any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(got, want)):
        return False
    flags = [(cp.ascontiguousarray(a).reshape(-1).view(cp.uint8)
              == cp.ascontiguousarray(b).reshape(-1).view(cp.uint8)).all().reshape(1)
             for a, b in zip(got, want)]
    return not flags or bool(device.to_host(cp.concatenate(flags)).all())


class GraphReplay:
    """``run(inputs)`` of a lowered step with CUDA-graph replay (see the module docstring).

    ``normal(inputs)``: the step run op by op (returns its outputs); ``compute(buffers)``: the
    steps on device inputs ``buffers``, returning every value they made (the outputs at
    ``out_slots``); ``checks``: the executable's ``IndexChecks``."""

    def __init__(self, cp, n_in, checks, device, compute, out_slots, normal,
                 before_capture=None):
        self.cp, self.n_in, self.checks, self.device = cp, n_in, checks, device
        self.compute, self.out_slots, self.normal = compute, out_slots, normal
        self.before_capture = before_capture or (lambda stream: None)
        self.state = "warm-up"  # then "capture", "verify", "replay"; "off" for good
        self.graph = self.pool = self.stream = self.env = None
        self.buffers, self.outs, self.flags, self.on_host = [], [], [], None

    def __call__(self, inputs):
        if self.state == "off" or profile.active() is not None:
            return self.normal(inputs)
        if self.state == "warm-up":
            out = self.normal(inputs)
            self.state = "capture"
            return out
        if len(inputs) != self.n_in:
            return self.normal(inputs)  # (raises the normal path's error)
        self.checks.before(inputs)  # host index checks first, as the normal path
        if self.state != "capture" and self.checks.on_host != self.on_host:
            note("index arrays checked elsewhere than in the captured call: run normally")
            return self.normal(inputs)
        xs = [self.device.to_device(x) for x in inputs]
        if self.state != "capture" and any(
                x.shape != b.shape or x.dtype != b.dtype for x, b in zip(xs, self.buffers)):
            note("inputs of another shape or dtype than the captured ones: run normally")
            return self.normal(xs)
        if self.state == "capture":
            if not self._capture(xs):
                return self.normal(xs)
        else:
            self._load(xs)
        if self.state == "verify":  # (again, if a normal run raised at the last)
            return self._verify(xs)
        self.graph.launch(stream=self.cp.cuda.get_current_stream())
        self.checks.flags[:] = self.flags  # written by the replay's kernels
        self.checks.after()
        return [x.copy() for x in self.outs]

    def _load(self, xs) -> None:
        for buf, x in zip(self.buffers, xs):
            self.cp.copyto(buf, x)

    def _capture(self, xs) -> bool:
        """Capture the steps into ``self.graph``; False (replay off for good) if CUDA refused
        anything on the way."""
        self.on_host = set(self.checks.on_host)
        self.buffers = [self.cp.empty(x.shape, x.dtype) for x in xs]  # outside the private pool
        self._load(xs)
        cp = self.cp
        pool, stream = cp.cuda.MemoryPool(), cp.cuda.Stream(non_blocking=True)
        failure, graph, env = None, None, None
        try:
            stream.wait_event(cp.cuda.get_current_stream().record())  # after the copies in
            self.before_capture(stream)  # (cuBLAS's handle bound to the stream: cuda_blas.py)
            with cp.cuda.using_allocator(pool.malloc), stream:
                stream.begin_capture()
                try:
                    env = self.compute(self.buffers)
                except Exception as e:  # noqa: BLE001 - refused while capturing: replay off
                    failure = e
                try:
                    graph = stream.end_capture()
                except Exception as e:  # noqa: BLE001 - an invalidated capture
                    failure = failure or e
        except Exception as e:  # noqa: BLE001 - begin_capture, the stream, the pool
            failure = failure or e
        if failure is not None:
            note(f"capture failed ({type(failure).__name__}: {failure}): run normally for good")
            self._off()
            return False
        self.graph, self.pool, self.stream, self.env = graph, pool, stream, env
        self.outs = [env[o] for o in self.out_slots]
        self.flags = list(self.checks.flags)
        self.state = "verify"
        note(f"captured a step of {len(env) - self.n_in} values")
        return True

    def _verify(self, xs):
        """The first replay against a normal run of the same inputs, bitwise; returns the
        normal run's outputs."""
        self.graph.launch(stream=self.cp.cuda.get_current_stream())
        got = [x.copy() for x in self.outs]
        want = self.normal(xs)
        if _bitwise_equal(self.cp, self.device, got, want):
            self.state = "replay"
            note("the first replay matches a normal run bitwise: replaying")
        else:
            warnings.warn("replicate: the CUDA graph of a cupy step gave other bits than its "
                          "normal run; CUDA-graph replay is off for this step", RuntimeWarning,
                          stacklevel=3)
            self._off()
        return want

    def _off(self) -> None:
        self.state = "off"
        self.graph = self.pool = self.stream = self.env = None
        self.buffers, self.outs, self.flags = [], [], []


def replayed(cp, graph, n_in, checks, device, compute, out_slots, normal, option,
             before_capture=None):
    """``normal``, or a ``GraphReplay`` of it where replay is asked for and ``graph`` is
    eligible; ``before_capture(stream)`` runs before each capture, outside it."""
    if not requested(option):
        return normal
    why = ineligible(graph)
    if why is not None:
        note(f"not captured: {why}")
        return normal
    return GraphReplay(cp, n_in, checks, device, compute, out_slots, normal, before_capture)


__all__ = ["ENV", "GraphReplay", "ineligible", "replayed", "requested"]
