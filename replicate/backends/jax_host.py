"""Host nodes inside the jit: communication as ordered host callbacks, one program per step.

The JAX backend's step is one ``jax.jit`` even when it talks to other processes: each host node
(``mpi_allreduce``, a bucket's ``comm_start``/``comm_wait``, ...) is a callback running the
node's NumPy row (``graph/reference.IMPL``) on the host, over XLA's own buffers
(``jax.experimental.buffer_callback``). Cutting the graph at every host node instead compiled
one XLA program per segment (a small conv GAN on 2 processes x 2 replicas: 19 segments, most of
its 8 s first step) and moved every value between segments through Python.

* **Order.** Each callback reads the previous one's ticket and makes the next: XLA runs them one
  at a time in the graph's order, which is the same on every rank, so the collectives match
  across processes as they did segment by segment. Device work that does not depend on a
  callback may run while a bucket is in flight on the communication thread (``comm_start``
  returns at once, ``comm_wait`` blocks). (``jax.experimental.io_callback`` orders its calls
  too, but hands them JAX arrays, and converting those inside the callback deadlocked XLA's CPU
  runtime: seen on 2 processes pinned to a core each.)
* **Handles.** A host node whose value only other host nodes read (a ``comm_start`` handle) keeps
  the value on the host: XLA carries a 32-bit ticket for it.
* **Buffers.** A packed bucket (``owned``: nothing else reads it) is reduced over XLA's own
  buffer: the callback's result aliases its operand (``input_output_aliases``), and with
  ``overlap`` the bucket travels from ``comm_start`` to ``comm_wait`` as an XLA buffer (live
  between the two, so XLA leaves it alone while the communication thread writes it) that the
  wait returns: no copy in or out. Where XLA must copy an aliased buffer (another reader) the
  callback sees the copy and the result is still right. Any other operand kept past the call
  (a one-tensor bucket in flight) gets a copy: XLA's buffers live for the call only.
* **Parts.** A packed bucket goes to its callbacks as the values its ``concatenate`` would
  have joined (:class:`Parts`, ``unpacked_buckets``), each its own XLA buffer aliased by a
  result, the same way; a part that something else reads too (a graph input, a constant, a
  gradient the step also uses) is copied by XLA before the callback writes over it.
* **Errors.** An exception in a callback (a peer's failure, a timeout) reaches XLA as a runtime
  error string; :class:`HostCalls` keeps the original, and the program raises *it*, with its
  type and notes, instead of XLA's wrapper. The failing callback first waits for the buckets
  still in flight (``HostCalls._failed``): XLA frees their buffers when the program stops.
"""

from __future__ import annotations

import itertools
import logging
import threading

import jax
import jax.numpy as jnp
import numpy as np

from ..graph.reference import IMPL

try:  # JAX >= 0.7: a callback handed XLA's own buffers (no copies, no JAX calls inside it)
    from jax.experimental.buffer_callback import buffer_callback
except ImportError:  # older JAX: the graph is cut at host nodes instead
    buffer_callback = None

_TICKET = jax.ShapeDtypeStruct((), np.int32)
DRAIN_S = 10.0  # after a failed callback, how long to wait for the buckets still in flight


def available() -> bool:
    """Whether host nodes can run inside the jit here: a JAX with ``buffer_callback`` on CPU
    (on a GPU its buffers are device memory, which the NumPy rows cannot read)."""
    return buffer_callback is not None and jax.default_backend() == "cpu"


def _not_ours(record) -> bool:
    """JAX may log a failed callback with its traceback; ours are raised again, whole."""
    tb = record.exc_info[2] if record.exc_info else None
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_replicate_host_call":
            return False
        tb = tb.tb_next
    return True


for _name in ("jax._src.callback", "jax._src.buffer_callback"):
    logging.getLogger(_name).addFilter(_not_ours)


class HostCalls:
    """The host side of one program's callbacks: the tickets in flight and the first failure.

    Order: each callback takes the previous one's ticket as an operand and makes the next, so
    the data dependences alone make XLA run them one at a time, in the graph's order."""

    def __init__(self):
        self.values: dict = {}  # ticket -> a host value only host nodes read
        self._in_flight: set = set()  # tickets of buckets started and not yet waited for
        self._tickets = itertools.count(1)
        self.failure: BaseException | None = None
        self._order = None  # while tracing: the last callback's ticket

    def begin(self):
        """Start tracing a program: its first callback depends on nothing."""
        self._order = jnp.zeros((), np.int32)

    def node(self, node, args, *, opaque: bool, opaque_inputs: tuple):
        """A callback computing ``node`` on the host from ``args`` (traced values).

        Returns its traced value: an array; for a value only host nodes read, a ticket — or,
        for a bucket reduced in place on the communication thread, ``(ticket, bucket)``: the
        bucket travels as an XLA buffer to the ``comm_wait``, which returns that same buffer."""
        rule, attrs, aval = IMPL[node.prim], node.attrs, node.out.aval
        dtype, shape = np.dtype(aval.dtype), tuple(aval.shape)
        # A rule that reduces over its operand (``owned``: a packed bucket nobody else reads) is
        # handed XLA's buffer itself, the callback's result aliasing it: no copy in or out.
        inplace = bool(attrs.get("owned")) and not opaque_inputs[0]
        # the buffer the result is written over (an index into ``operands``), if any: the owned
        # operand, or a carried bucket of the result's shape and dtype
        alias = 0 if inplace else None
        operands, kinds = [], []  # kinds: "v" value, "h" ticket, "hb" ticket + carried bucket
        for a, o in zip(args, opaque_inputs):
            if isinstance(a, tuple):
                if alias is None and (tuple(a[1].shape), np.dtype(a[1].dtype)) == (shape, dtype):
                    alias = len(operands) + 1
                operands += list(a)
                kinds.append("hb")
            else:
                operands.append(a)
                kinds.append("h" if o else "v")
        # XLA's buffers live for the call only: a rule that keeps an operand past the call (a
        # bucket in flight) and does not own XLA's buffer for it gets its own copy
        copy = opaque and not inplace
        started = node.prim == "comm_start"

        def body(outs, *xs):
            it, xs_in = iter(xs), []
            for j, kind in enumerate(kinds):
                x = next(it)
                if kind == "v":
                    x = np.asarray(outs[0]) if j == 0 and inplace else (
                        np.asarray(x).copy() if copy else np.asarray(x))
                else:
                    x = self._take(x)
                    if kind == "hb":
                        next(it)  # the bucket: the handle reduces it in place
                xs_in.append(x)
            value = rule(*xs_in, **attrs)
            if opaque:
                np.asarray(outs[-1])[...] = self._keep(value, started)
            else:  # never let NumPy broadcast or cast a wrong result into XLA's buffer
                check_result(node, value, shape, dtype)
                out = np.asarray(outs[0])
                if not _same_buffer(value, out):
                    out[...] = value  # (XLA copied the aliased buffer, or none was aliased)
        array = jax.ShapeDtypeStruct(shape, dtype)
        if opaque:
            result = (array, _TICKET) if inplace else (_TICKET,)
        else:
            result = (array,)
        value = self._call(body, result, operands, None if alias is None else {alias: 0})
        if opaque:
            return (value[1], value[0]) if inplace else value[0]
        return value[0]

    def parts_start(self, node, parts: "Parts"):
        """A bucket's ``comm_start`` over its parts (an unpacked bucket): each part is XLA's
        buffer, aliased by a result, reduced in place on the communication thread; returns
        ``(ticket, Parts)``, the parts carried to the ``comm_wait`` as live XLA buffers."""
        rule, attrs = IMPL[node.prim], node.attrs

        def body(outs, *xs):
            *bufs, ticket = outs
            handle = rule([np.asarray(b) for b in bufs], **attrs)
            np.asarray(ticket)[...] = self._keep(handle, True)
        *bufs, ticket = self._call(body, parts.avals() + (_TICKET,), parts.arrays,
                                   {i: i for i in range(len(parts.arrays))})
        return ticket, Parts(bufs)

    def parts_wait(self, node, ticket, parts: "Parts") -> "Parts":
        """The ``comm_wait`` of :meth:`parts_start`: waits, and returns the same buffers."""
        rule = IMPL[node.prim]
        return self._over_parts(node, parts, lambda t, bufs: rule(self._take(t)), ticket)

    def parts_reduce(self, node, parts: "Parts") -> "Parts":
        """A blocking all-reduce of an unpacked bucket (``mpi_allreduce``, ``overlap=False``),
        over its parts."""
        rule, attrs = IMPL[node.prim], node.attrs
        return self._over_parts(node, parts, lambda bufs: rule(bufs, **attrs))

    def _over_parts(self, node, parts, compute, *extra) -> "Parts":
        """One callback whose results alias ``parts``: ``compute(*extra, buffers)`` gives their
        new values (the buffers themselves when reduced in place, as they are)."""
        k = len(extra)

        def body(outs, *xs):
            bufs = [np.asarray(b) for b in outs]
            for b, r in zip(bufs, compute(*xs[:k], bufs), strict=True):
                if not _same_buffer(r, b):
                    check_result(node, r, b.shape, b.dtype)
                    b[...] = r  # (a rule that made a new array, not one reduced in place)
        return Parts(self._call(body, parts.avals(), [*extra, *parts.arrays],
                                {k + i: i for i in range(len(parts.arrays))}))

    def _call(self, body, result: tuple, operands, aliases=None) -> list:
        """One ordered callback: ``body(outs, *xs)`` fills XLA's result buffers ``outs``
        (shapes ``result``) from the operands ``xs``; ``aliases``: {operand index: result
        index} for results written over their operand's buffer. Returns the traced results. It
        reads the previous callback's order ticket and makes the next (``self._order``); a
        failure is kept (``_failed``) and raised again by the program, not as XLA's text."""
        def _replicate_host_call(ctx, outs, order, *xs):
            try:
                *outs, done = outs
                body(outs, *xs)
                np.asarray(done)[...] = np.asarray(order) + 1
            except BaseException as e:
                self._failed(e)
                raise
        call = buffer_callback(_replicate_host_call, tuple(result) + (_TICKET,),
                               has_side_effect=True, input_output_aliases=None if not aliases
                               else {i + 1: o for i, o in aliases.items()})  # 0: the order
        *values, self._order = call(self._order, *operands)
        return values

    def _keep(self, value, started: bool) -> int:
        """Keep a host value for the host nodes that read it; its ticket. ``started``: a bucket
        on the communication thread (a ``comm_start`` handle), in flight until its wait."""
        ticket = next(self._tickets) & 0x7FFFFFFF
        self.values[ticket] = value
        if started:
            self._in_flight.add(ticket)
        return ticket

    def _take(self, ticket):
        """The host value of ``ticket`` (an XLA scalar), for the one host node that reads it."""
        ticket = int(np.asarray(ticket))
        self._in_flight.discard(ticket)
        return self.values.pop(ticket)

    def _failed(self, e: BaseException):
        """A callback failed: the program stops, and XLA frees its buffers, among them those of
        every bucket still in flight, which the communication thread reduces in place. So wait
        here, inside the callback while the buffers are still XLA's, for those buckets (at most
        ``DRAIN_S`` seconds: one that is stuck, say a peer gone, must not hold up the report),
        then let the failure through."""
        if self.failure is None:
            self.failure = e
        handles = [self.values[t] for t in self._in_flight if t in self.values]
        self._in_flight.clear()
        if handles:
            waiter = threading.Thread(target=_wait_all, args=(handles,), daemon=True,
                                      name="replicate-drain")
            waiter.start()
            waiter.join(DRAIN_S)

    def reraise(self, error: BaseException):
        """Raise the callback's own exception if ``error`` is XLA reporting it; else nothing."""
        failure, self.failure = self.failure, None
        self.values.clear()
        self._in_flight.clear()
        if failure is not None:
            raise failure from None


def _same_buffer(value, out: np.ndarray) -> bool:
    """Whether the rule's result ``value`` is ``out`` itself (reduced over it in place)."""
    return (isinstance(value, np.ndarray) and value.ctypes.data == out.ctypes.data
            and value.dtype == out.dtype and value.strides == out.strides)


def _wait_all(handles):
    """Wait for each bucket (``comm_wait``'s rule), whatever becomes of it."""
    for handle in handles:
        try:
            IMPL["comm_wait"](handle)
        except BaseException:  # (its own failure: the program raises the first one)
            pass


class Parts:
    """A bucket left unpacked: the arrays its ``concatenate`` would have joined (flattened), each
    in its own shape, handed to the bucket's callbacks as separate XLA buffers and taken back one
    by one by the slices that read the reduced bucket. XLA's CPU concatenate is a loop over
    every element: for the 7.4 MB gradient bucket of the 784-1024-1024-10 MLP it cost about
    2 ms a step, as much as the all-reduce itself; and a flattened operand (a reshape) gets a
    copy where the callback writes over it. The parts cost no copy, but for one that something
    else reads too (XLA copies it first). Anything else that reads the bucket gets the whole
    array (``whole``)."""

    def __init__(self, arrays):
        self.arrays = list(arrays)
        self.bounds = np.cumsum([0] + [int(np.prod(a.shape)) for a in self.arrays]).tolist()

    def avals(self) -> tuple:
        return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.arrays)

    def whole(self):
        return jnp.concatenate([a.reshape(-1) for a in self.arrays])

    def part(self, index):
        """The part a ``getitem`` ``index`` reads exactly (flat), or None."""
        if len(index) != 1 or index[0][0] != "slice" or index[0][3] not in (None, 1):
            return None
        lo, hi = index[0][1], index[0][2]
        for k, array in enumerate(self.arrays):
            if (self.bounds[k], self.bounds[k + 1]) == (lo, hi):
                return array.reshape(-1)
        return None


def unpacked_buckets(nodes, opaque: set, outputs: set) -> tuple[set, set]:
    """The values to hand over as :class:`Parts`: ids of the ``concatenate`` values of buckets
    (1-D values joined on axis 0) that only their all-reduce reads, which reduces it in place
    (``owned``): a blocking ``mpi_allreduce``, or a ``comm_start`` whose handle only host nodes
    read (its ``comm_wait``); and ids of the flattening ``reshape`` values only such a packing
    reads (the parts keep their shapes). A graph output (``outputs``, ids) counts as a reader:
    a flattening that the step also returns keeps its own (flat) value."""
    readers: dict = {}
    made: dict = {}
    for n in nodes:
        made[n.out.id] = n
        for x in n.inputs:
            readers.setdefault(x.id, []).append(n)
    packs, unflattened = set(), set()
    for n in nodes:
        r = readers.get(n.out.id, [])
        if (n.prim == "concatenate" and n.attrs.get("axis") == 0
                and all(len(x.aval.shape) == 1 and x.aval.dtype == n.out.aval.dtype
                        for x in n.inputs)
                and len({x.id for x in n.inputs}) == len(n.inputs)  # (each part its own buffer)
                and len(r) == 1 and n.out.id not in outputs and r[0].attrs.get("owned")
                and n.out.id not in opaque
                and (r[0].prim == "mpi_allreduce" and r[0].out.id not in opaque
                     or r[0].prim == "comm_start" and r[0].out.id in opaque)):
            packs.add(n.out.id)
            unflattened.update(x.id for x in n.inputs if x.id in made
                               and made[x.id].prim == "reshape" and len(readers[x.id]) == 1
                               and x.id not in outputs)
    return packs, unflattened


def check_result(node, value, shape: tuple, dtype: np.dtype):
    """Raise when a host rule's result is not the node's shape (or not castable to its dtype)."""
    got = np.asarray(value)
    if got.shape != shape or not np.can_cast(got.dtype, dtype, "same_kind"):
        raise RuntimeError(
            f"internal error: host node {node.prim} (%{node.out.id}) produced "
            f"{got.dtype}{list(got.shape)}, its graph value is {dtype}{list(shape)}; "
            "please report this with the program")


def opaque_values(nodes, is_host, outputs) -> set:
    """Ids of host nodes' values that only host nodes read (and that are no graph output)."""
    readers: dict = {}
    for n in nodes:
        for x in n.inputs:
            readers.setdefault(x.id, []).append(n)
    return {n.out.id for n in nodes if is_host(n) and n.out.id not in outputs
            and readers.get(n.out.id) and all(is_host(r) for r in readers[n.out.id])}
