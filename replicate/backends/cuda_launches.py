"""The CuPy backend's own record of the kernels it launches (``LAUNCHES``), off unless asked for.

Every generated kernel the backend launches — a fused group's, the random bits', the
scatter-add's segment sum — goes through ``LAUNCHES.elementwise`` or ``LAUNCHES.reduction``.
While a ``with LAUNCHES.recording():`` block is open, each launch is recorded:

* ``fused``: how many launches were of fused groups' kernels (one per fused node run: a group
  that fell back to op-by-op would show as fewer);
* ``signatures``: launch signature -> ``KernelSpec``, one entry per distinct kernel CuPy
  compiles — its argument dtypes and dimensions, and for a reduction the axes and the path CuPy
  takes (its CUB block reduction, in one pass or two, or its own reduction kernel), predicted by
  CuPy's rule (``cub_path``).

The tests read this record, not the CuPy stand-in's, so a test means the same on a GPU as on the
stand-in (``tests/backends/test_cupy_kernels.py``; ``tests/cupy_nvrtc.py`` compiles each recorded
signature with NVRTC on a machine without a GPU). Outside a ``recording()`` block a launch
costs one attribute test.

>>> from replicate.backends.cuda_launches import LaunchLog
>>> log = LaunchLog()
>>> with log.recording() as seen:
...     pass
>>> seen.fused, seen.signatures
(0, {})
"""

from __future__ import annotations

import contextlib
import math
import threading

CUB_MIN = 128  # CuPy's CUB block reduction: at least this many elements reduced per output


def raw_flags(params: str) -> list:
    """For each parameter of a CuPy parameter list, whether it is ``raw`` (passed whole)."""
    return [p.split()[0] == "raw" for p in (q.strip() for q in params.split(",") if q.strip())]


def cub_path(args, shape, axes) -> str:
    """Which kernel CuPy launches for a ``ReductionKernel`` with ``args`` over ``axes`` of
    ``shape``: its CUB block reduction where the one argument (a ``raw`` one counts: an error
    flag makes two) is C-contiguous, of that shape, reduced over trailing axes, with at least
    ``CUB_MIN`` elements per output (``"cub"``; ``"cub-two-pass"`` when it reduces everything),
    else its own kernel (``"simple"``)."""
    if len(args) != 1 or not args[0].flags.c_contiguous or tuple(args[0].shape) != shape \
            or axes != tuple(range(len(shape) - len(axes), len(shape))):
        return "simple"
    if math.prod(shape[a] for a in axes) < CUB_MIN:
        return "simple"
    return "cub-two-pass" if len(axes) == len(shape) else "cub"


class Record:
    """What one ``recording()`` block saw."""

    def __init__(self):
        self.fused = 0
        self.signatures: dict = {}

    def named(self, prefix: str) -> dict:
        """The signatures of kernels whose name starts with ``prefix``."""
        return {k: s for k, s in self.signatures.items() if s.name.startswith(prefix)}


class LaunchLog:
    """The record of generated-kernel launches (module-wide: ``LAUNCHES``). Recording is
    per-process; blocks nest (each sees every launch made while it is open)."""

    def __init__(self):
        self._open: list[Record] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def recording(self):
        record = Record()
        with self._lock:
            self._open.append(record)
        try:
            yield record
        finally:
            with self._lock:
                self._open.remove(record)

    def _add(self, signature, spec):
        with self._lock:
            for record in self._open:
                record.signatures[signature] = spec
                record.fused += spec.body is not None

    def elementwise(self, spec, args):
        """A launch of ``spec`` (an elementwise kernel) with ``args``: inputs, then the output."""
        if not self._open:
            return
        n_in = len(raw_flags(spec.in_params))
        raws = raw_flags(spec.in_params) + raw_flags(spec.out_params)
        out_ndim = args[-1].ndim
        dtypes = (tuple(a.dtype for a in args[:n_in]), tuple(a.dtype for a in args[n_in:]))
        ndims = tuple(a.ndim if raw else out_ndim for a, raw in zip(args, raws))
        self._add(("elementwise", spec.key, dtypes, ndims), spec)

    def raw(self, spec, source):
        """A launch of ``spec`` as the raw kernel ``source`` (``cuda_raw.py``)."""
        if self._open:
            self._add(("raw", spec.key, source), spec)

    def reduction(self, spec, args, axes):
        """A launch of ``spec`` (a reduction kernel) with ``args`` over ``axes`` (None: all)."""
        if not self._open:
            return
        arrays = [a for a, raw in zip(args, raw_flags(spec.in_params)) if not raw]
        shape = tuple(arrays[0].shape)
        axes = tuple(range(len(shape))) if axes is None else tuple(sorted(
            a % len(shape) for a in (axes if isinstance(axes, tuple) else (axes,))))
        self._add(("reduction", spec.key, tuple(a.dtype for a in args), len(shape), axes,
                   cub_path(args, shape, axes)), spec)


LAUNCHES = LaunchLog()

__all__ = ["CUB_MIN", "LAUNCHES", "LaunchLog", "Record", "cub_path", "raw_flags"]
