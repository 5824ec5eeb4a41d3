"""The JAX backend: the graph becomes ``jax.jit`` functions; XLA fuses and plans memory.

``lower`` cuts the node list into maximal segments of device nodes, split by the host nodes
(collectives, run by the NumPy table ``IMPL`` on host arrays). Each segment is one jitted
function of the values it reads from outside it, returning the values used after it; a graph
without communication is one ``jax.jit``. A segment is traced and compiled once, on the first
call; later calls only dispatch (``JaxProgram.traces`` counts traces).

Host arrays in, host arrays out, as the backend contract says, without moving the state each
step: the outputs are NumPy views of the device results (on CPU; host copies on a GPU), and when
such a view comes back as an input of the next call (a parameter written back to its
``rp.Variable`` and read again) the device array behind it is passed instead. Views are
read-only, so the two cannot drift apart.

>>> import numpy as np, replicate as rp, replicate.numpy as rnp
>>> f = rp.function(lambda x: rnp.tanh(x * 2.0 + 1.0).sum(), backend="jax")
>>> float(f(np.zeros(3)))
2.2847...
>>> f.executable(np.zeros(3)).kernels
['jit[4 ops]']
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from .. import profile
from ..errors import add_note
from ..graph.index_check import HostIndices, nonnegative
from ..graph.interpret import describe_node, eval_nodes
from ..graph.primitives import REGISTRY
from ..graph.reference import IMPL
from .base import Executable, Staged, profile_label, profiled_bytes
from .cuda_ops import POW_MESSAGE
from .jax_host import HostCalls, Parts, available, check_result, opaque_values, unpacked_buckets
from .jax_impl import JAX, apply, nonnegative_checked, pow_checked

name = "jax"
# XLA fuses and plans memory itself: every other pass of the pipeline
passes = ("const_fold", "cse", "dce", "bucketing")

# Donate each input that a segment replaces (an output of the same shape and dtype, last read
# there) so XLA can write the new value into it. ``None``: only off CPU. On CPU our outputs are
# views of the device buffers, which makes XLA copy a donated one first: measured on the
# 784-1024-1024-10 MLP step, donation made the step ~15% slower there. Host inputs are copied to
# the device before a call and foreign device arrays are copied here, so a donation never
# touches the caller's arrays.
DONATE: bool | None = None
# Integer and bool constants up to this size are literals in the compiled code (XLA folds
# them); larger ones (a table or data set the step closes over) are moved to the device once and
# passed in — and so is every float constant: XLA's algebraic simplifier treats float arithmetic
# with a constant it can see as real arithmetic (it folded ``(x * 1e30) * 1e10`` into ``x *
# 1e40``, inf where NumPy's order gives a number; made ``x / 3`` ``x * (1 / 3)``, 1 ulp off;
# ``x + 0.0`` ``x``, keeping a -0.0), silent differences from NumPy
# (``tests/backends/test_jax_ieee.py``); an optimisation barrier did not stop all of it.
INLINE_CONST_BYTES = 1 << 16
FLOAT_CONSTANTS_PASSED = True  # (False: float constants as literals too, for comparison)
# Host nodes (communication) run inside the jit as ordered callbacks (``jax_host.py``): one
# program per step. False: the graph is cut at each host node into jitted segments.
HOST_IN_JIT = True
# XLA's options for the step's programs on CPU: LLVM at -O1 (``xla_backend_optimization_level``;
# XLA's default is 3). XLA vectorises its own loops and calls libraries for products and
# convolutions, so the code ran as fast, and the conv GAN's first step (its compile) took less:
# 3.39 / 3.51 / 3.31 s against 4.00 / 3.86 / 4.96 s, steady step 48.0 / 50.3 / 47.8 against
# 47.9 / 47.6 / 55.6 ms, the MLP step alike, the same losses to the bit (bench/RESULTS.md).
# ``{}``: XLA's defaults. (XLA's algebraic simplifier stays on: turned off, a rewrite of float
# arithmetic it does without constants, ``log(exp(x))`` to ``x``, went too, but the conv step
# came out with 2390 transposes of its kernels, 7-15 % slower; the float constants it rewrote
# with are arguments instead, see ``INLINE_CONST_BYTES``, and masks pass a barrier, ``_cast``.)
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
# A packed gradient bucket's parts go to its callbacks as separate buffers, not concatenated by
# XLA (``jax_host.Parts``). False: the packed bucket (for comparing the two).
UNPACK_BUCKETS = True


def compiler_options() -> dict:
    """``jax.jit``'s keyword for XLA's options of the step's programs (``CPU_COMPILER_OPTIONS``
    on CPU; XLA's defaults elsewhere)."""
    if CPU_COMPILER_OPTIONS and jax.default_backend() == "cpu":
        return {"compiler_options": dict(CPU_COMPILER_OPTIONS)}
    return {}


def bucket_exchange() -> str:
    """How this process sends a gradient bucket: ``"parts"`` (the step is one ``jax.jit`` with
    host callbacks, ``jax_host.Parts``) or ``"packed"``. Every rank must do alike (the ranks
    compare it when they construct a ``Replicator``: ``runtime/checks/config.py``)."""
    return "parts" if UNPACK_BUCKETS and HOST_IN_JIT and available() else "packed"


def is_host(node) -> bool:
    return REGISTRY[node.prim].host


class _Segment:
    """A maximal run of device nodes, lowered to one jitted function."""

    def __init__(self, nodes, reads, writes, donate, program, apply=apply):
        self.nodes, self.reads, self.writes, self.donate = nodes, reads, writes, donate
        self.program, self.apply = program, apply
        # XLA clamps an out-of-range gather index (a silently wrong value): a segment that
        # indexes with arrays made on the device is checked (checkify) and the host raises
        # IndexError instead (index arrays from the host: checked there before the call,
        # ``JaxProgram.host_indices``); likewise ValueError for an integer to a negative power
        # (XLA gives a number)
        self.gathers = [n for n in nodes if REGISTRY[n.prim].indexes and len(n.inputs) > 1
                        and id(n) not in program.host_indices.nodes]
        # (a gather of class labels or embedding ids made on the device: a negative one too)
        unsigned = {id(n) for n in self.gathers if nonnegative(n.attrs["index"])}
        if unsigned:
            self.apply = nonnegative_checked(unsigned, apply)
        errors = (checkify.index_checks if self.gathers else frozenset()) | (
            checkify.user_checks if unsigned or any(pow_checked(n) for n in nodes)
            else frozenset())
        self.checked = bool(errors)
        body = self._body
        if errors:
            body = checkify.checkify(self._body, errors=errors)
        self.fn = jax.jit(body, donate_argnums=donate, **compiler_options())
        self.compiled = False

    def results(self, out):
        """The segment's outputs; raises ``IndexError`` (naming the op and the user's line) if
        a checked index was out of range, NumPy's ``ValueError`` for an integer power's
        negative exponent."""
        if not self.checked:
            return out
        error, out = out
        message = error.get()
        if message is not None and message.startswith(POW_MESSAGE):
            failure = ValueError(POW_MESSAGE)
            add_note(failure, message[len(POW_MESSAGE) + 1:].removesuffix(" (`check` failed)"))
            raise failure
        if message is not None:
            failure = IndexError(message.splitlines()[0].removesuffix(" (`check` failed)"))
            for node in self.gathers:
                add_note(failure, f"  raised by {describe_node(node)} (in the compiled step)")
            raise failure
        return out

    def _body(self, *args):
        self.program.traces += 1
        self.program.calls.begin()
        env = eval_nodes(self.nodes, dict(zip(self.reads, args)), self.apply)
        return tuple(env[i].whole() if isinstance(env[i], Parts) else env[i]
                     for i in self.writes)

    def first_call(self, args):
        with warnings.catch_warnings():  # an output XLA forwards cannot take a donated buffer
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            results = self.fn(*args)
        self.compiled = True
        return results


def _donations(reads, writes, avals, graph_inputs, last_use, end) -> tuple:
    """Positions in ``reads`` to donate: graph inputs read last here, one per output aval."""
    donate = DONATE if DONATE is not None else jax.default_backend() != "cpu"
    if not donate:
        return ()
    free: dict = {}
    for w in writes:
        key = (avals[w].shape, np.dtype(avals[w].dtype))
        free[key] = free.get(key, 0) + 1
    picked = []
    for i, r in enumerate(reads):
        if r not in graph_inputs or last_use[r] >= end:
            continue
        key = (avals[r].shape, np.dtype(avals[r].dtype))
        if free.get(key, 0) > 0:
            free[key] -= 1
            picked.append(i)
    return tuple(picked)


class JaxProgram:
    """``program(inputs) -> outputs``: the jitted segments and host nodes of one graph, run in
    order over a list of slots (the graph inputs, the constants, then each value a step makes).

    Constants are not steps: a small one is a literal inside each segment that reads it, a large
    one is moved to the device once and passed in like an input."""

    def __init__(self, graph):
        self.graph, self.traces = graph, 0
        self.host_indices = HostIndices(graph)  # index arrays checked on the host, not in XLA
        self._views: dict = {}  # id(output view) -> (view, device array): last call's outputs
        self.n_inputs = len(graph.inputs)
        slot = {x.id: i for i, x in enumerate(graph.inputs)}
        self._template = [None] * self.n_inputs  # what a call's slots start as
        device = set(slot.values())  # slots that may hold device arrays (inputs: our views')
        literals = {}
        for n in graph.nodes:
            if n.prim != "const":
                continue
            value = np.asarray(n.attrs["value"])
            slot[n.out.id] = len(self._template)
            if value.nbytes > INLINE_CONST_BYTES or (FLOAT_CONSTANTS_PASSED and jnp.issubdtype(
                    value.dtype, jnp.floating)):
                self._template.append(jax.device_put(value))
                device.add(slot[n.out.id])
            else:
                self._template.append(value)
                literals[n.out.id] = n
        nodes = [n for n in graph.nodes if n.prim != "const"]
        last_use: dict = {}  # value id -> index of the last node reading it; outputs: past all
        for k, node in enumerate(nodes):
            for x in node.inputs:
                last_use[x.id] = k
        for o in graph.outputs:
            last_use[o.id] = len(nodes)
        avals = {x.id: x.aval for x in graph.inputs}
        avals.update((n.out.id, n.out.aval) for n in nodes)
        graph_inputs = {x.id for x in graph.inputs}
        self.steps, self.kernels, self.donated = [], [], set()
        self.calls = HostCalls()
        cuts, seg_apply = is_host, apply
        if HOST_IN_JIT and available():
            cuts = _never
            outputs = {o.id for o in graph.outputs}
            opaque = opaque_values(nodes, is_host, outputs)
            packs, unflattened = unpacked_buckets(nodes, opaque, outputs) if UNPACK_BUCKETS \
                else (set(), set())
            seg_apply = self._host_apply(opaque, packs, unflattened)
        k = 0
        while k < len(nodes):
            node = nodes[k]
            if cuts(node):
                args = tuple(slot[x.id] for x in node.inputs)
                to_host = tuple(a in device for a in args)
                slot[node.out.id] = len(slot)
                self.steps.append((False, IMPL[node.prim],
                                   (args, to_host, node.attrs, node),
                                   slot[node.out.id]))
                self.kernels.append(f"host[{node.prim}]")
                k += 1
                continue
            end = k
            while end < len(nodes) and not cuts(nodes[end]):
                end += 1
            seg = nodes[k:end]
            for n in seg:
                if not is_host(n):
                    JAX[n.prim]  # a missing rule fails here, not at the first call
            defined = {n.out.id for n in seg}
            reads = list(dict.fromkeys(x.id for n in seg for x in n.inputs if x.id not in defined))
            writes = [n.out.id for n in seg if last_use.get(n.out.id, -1) >= end]
            seg = [literals[r] for r in reads if r in literals] + seg
            reads = [r for r in reads if r not in literals]
            donate = _donations(reads, writes, avals, graph_inputs, last_use, end)
            self.donated.update(slot[reads[i]] for i in donate)
            segment = _Segment(seg, reads, writes, donate, self, seg_apply)
            for w in writes:
                slot[w] = len(slot)
                device.add(slot[w])
            self.steps.append((True, segment, tuple(slot[r] for r in reads),
                               tuple(slot[w] for w in writes)))
            self.kernels.append(f"jit[{end - k} ops]")
            k = end
        self._template += [None] * (len(slot) - len(self._template))
        self.outputs = [(slot[o.id], slot[o.id] in device) for o in graph.outputs]

    def device_array(self, x):
        """The device array behind ``x``, an output of the last call (its NumPy view), or None:
        a caller given JAX arrays gets JAX arrays back without a copy. (Not where the program
        donates its inputs: a result that is also a variable's new value would be donated by the
        next call under the caller's hands.)"""
        if self.donated:
            return None
        hit = self._views.get(id(x))
        return hit[1] if hit is not None and hit[0] is x else None

    def _host_apply(self, opaque, packs, unflattened):
        calls = self.calls

        def host_apply(node, args):
            if node.out.id in unflattened:  # a part's flattening for its bucket: kept whole
                return args[0]
            if node.out.id in packs:  # a bucket's packing: its parts go to the callbacks
                return Parts(args)
            if node.prim == "comm_start" and isinstance(args[0], Parts):
                return calls.parts_start(node, args[0])
            if node.prim == "mpi_allreduce" and isinstance(args[0], Parts):
                return calls.parts_reduce(node, args[0])
            if node.prim == "comm_wait" and isinstance(args[0], tuple) \
                    and isinstance(args[0][1], Parts):
                return calls.parts_wait(node, *args[0])
            if any(isinstance(a, Parts) for a in args):
                part = args[0].part(node.attrs["index"]) if node.prim == "getitem" \
                    and len(args) == 1 else None
                if part is not None:
                    return part
                args = [a.whole() if isinstance(a, Parts) else a for a in args]
            if not is_host(node):
                return apply(node, args)
            return calls.node(node, args, opaque=node.out.id in opaque,
                              opaque_inputs=tuple(x.id in opaque for x in node.inputs))
        return host_apply

    def __call__(self, inputs):
        try:
            return self._call(inputs)
        except Exception as e:  # a callback's own exception, not XLA's report of it
            self.calls.reraise(e)
            raise

    def _call(self, inputs):
        if len(inputs) != self.n_inputs:
            raise ValueError(f"expected {self.n_inputs} inputs, got {len(inputs)}")
        views, self._views = self._views, {}  # a failed call leaves no (donated) array behind
        env = self._template.copy()
        for i, x in enumerate(inputs):
            hit = views.pop(id(x), None)  # pop: an array passed twice is donated at most once
            if hit is not None and hit[0] is x:
                x = hit[1]  # our own output view: the device array behind it
            elif i in self.donated and isinstance(x, jax.Array):
                x = jnp.array(x, copy=True)  # never donate an array the caller holds
            env[i] = x
        self.host_indices.check(env, to_host=np.asarray)  # before anything runs
        profiler = profile.active()
        for n, (is_jit, a, b, c) in enumerate(self.steps):
            start = profiler.now() if profiler is not None else 0
            if is_jit:  # a: the segment, b: slots it reads, c: slots it writes
                args = [env[r] for r in b]
                results = a.results(a.fn(*args) if a.compiled else a.first_call(args))
                for w, value in zip(c, results):
                    env[w] = value
                if profiler is not None:  # (XLA runs it as one program: timed to its end)
                    jax.block_until_ready(results)
                    profiler.add(f"jax program {n}", "compute", start, profiler.now())
                continue
            # a: the NumPy rule, b: (argument slots, which to bring over, ...), c: out
            args, to_host, attrs, node = b
            operands = [np.asarray(env[s]) if h else env[s] for s, h in zip(args, to_host)]
            value = a(*operands, **attrs)  # a value made by a host node may be a handle
            label = profile_label(node) if profiler is not None else None
            if label is not None:
                profiler.add(label[0], label[1], start, profiler.now(), line=label[2],
                             **profiled_bytes(label[1], operands))
            if isinstance(value, np.ndarray):
                dtype = np.dtype(node.out.aval.dtype)
                check_result(node, value, tuple(node.out.aval.shape), dtype)
                value = value.astype(dtype, copy=False)
            env[c] = value
        results, new_views = [], {}
        for s, device in self.outputs:
            value = env[s]
            if device and isinstance(value, jax.Array):
                view = np.asarray(value)
                new_views[id(view)] = (view, value)
                value = view
            results.append(value)
        self._views = new_views
        return results


def _never(node) -> bool:
    return False


def lower(graph):
    """Return an ``Executable`` running ``graph`` as jitted segments (see the module doc)."""
    program = JaxProgram(graph)
    return Executable(graph, program, program.kernels, stage=stage)


def stage(leaves: list) -> Staged:
    """Batch leaves put on JAX's default device ahead of their step (on the prefetch thread);
    JAX orders the step after the copies itself."""
    return Staged(jax.device_put(leaves))
