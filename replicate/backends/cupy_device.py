"""The CuPy backend's device memory: which arrays are its own, the copies to and from the host
(each counted, in bytes: ``DEVICE.transfers``), and which GPU this process uses.

The step keeps the variables here between calls (``replicate/step.py``), each in one buffer that
a step's commit writes in place (``write_into``), so a steady-state step
copies up only its batch and copies down only its results — those in one transfer
(``to_host_many`` packs them into one buffer first: one synchronisation, not one per result).

Placement: on import, under MPI, the process takes GPU ``local rank % device count`` (the local
rank from the MPI shared-memory split, ``replicate/runtime/communication/gpu_transport.py``), so
ranks on one machine spread over its GPUs; a single process keeps its current device;
``CUDA_VISIBLE_DEVICES`` narrows what a process sees as usual. CuPy's current device is per host
thread (a new thread starts on device 0), so the chosen one is kept (``DEVICE.index``) and the
prefetch thread selects it before it makes its stream and buffers (``stage``).
"""

from __future__ import annotations

import contextlib
import threading

import cupy
import numpy as np

from ..errors import ReplicateError
from .base import PLACEMENT, Device, Staged

try:
    _DEVICES = cupy.cuda.runtime.getDeviceCount()
except Exception:  # no driver, or no device
    _DEVICES = 0
if not _DEVICES:  # (before anything of the backend is kept in sys.modules)
    raise ReplicateError("the 'cupy' backend needs an NVIDIA GPU; CuPy sees none here (CuPy "
                         "for CUDA 12: pip install 'replicate[cuda12]', for CUDA 13: "
                         "'replicate[cuda13]')")
_KDL_CUDA = 2  # DLPack's device type of CUDA memory


def upload(x):
    """``x`` (a host array or scalar) copied to the device, bit for bit. CuPy makes a 0-d array
    by ``fill``, which writes a zero with ``memset``: ``cupy.asarray(np.asarray(-0.0))`` is
    +0.0 (seen on CuPy 14.2), so ``arctan2(-0.0, x)`` would take the wrong quadrant. A 0-d
    value goes up as one element and is viewed as 0-d on the device."""
    x = np.asarray(x)
    if x.ndim == 0:
        return cupy.asarray(x.reshape(1)).reshape(())
    return cupy.asarray(x)


class CupyDevice(Device):
    name = "cupy"

    def __init__(self):
        super().__init__()
        self._local = threading.local()  # a thread's copy stream (``stage``)
        self._fence = None  # the step's stream at the last ``release``
        self.staging = None  # a list while ``recording_staging`` is open
        self.index = cupy.cuda.runtime.getDevice()  # the process's GPU (``place``)

    def is_array(self, x) -> bool:
        return isinstance(x, cupy.ndarray)

    def _upload(self, x):
        log = self.staging
        if log is not None:
            log.append(("upload", threading.current_thread().name, None))
        return upload(x)

    @contextlib.contextmanager
    def recording_staging(self):
        """Record, in order, what the copies up do while the block is open (the tests read this
        record, so they mean the same on a GPU as on the stand-in), as ``(what, thread, obj)``:
        ``("stage", thread, (buffers, event, device))`` for a batch staged by ``stage`` (its
        device buffers, the event recorded after their copies, the GPU they were made on),
        ``("wait", thread, event)`` when a step's stream is made to wait for one, and
        ``("upload", thread, None)`` for a copy up made by the step itself."""
        self.staging = log = []
        try:
            yield log
        finally:
            self.staging = None

    def _download(self, x):
        return cupy.asnumpy(x)

    def _from_foreign(self, x):
        """A JAX or PyTorch array on a GPU comes over DLPack without a copy; anything else
        through the host."""
        where = getattr(x, "__dlpack_device__", None)
        if where is not None and not isinstance(x, np.ndarray):
            try:
                if where()[0] == _KDL_CUDA:
                    return cupy.from_dlpack(x)
            except Exception:  # noqa: BLE001 - another device, or not exportable: the host copy
                pass
        return super()._from_foreign(x)

    def to_host_many(self, xs: list) -> list:
        """The device arrays among ``xs`` copied down in one transfer (packed as bytes)."""
        on = [i for i, x in enumerate(xs) if self.is_array(x)]
        if len(on) < 2:
            return [self.to_host(x) for x in xs]
        parts = [cupy.ascontiguousarray(xs[i]).reshape(-1).view(cupy.uint8) for i in on]
        flat = self.to_host(cupy.concatenate(parts))
        out, offset = list(xs), 0
        for i, part in zip(on, parts):
            x = xs[i]
            out[i] = flat[offset:offset + part.size].view(x.dtype).reshape(x.shape).copy()
            offset += part.size
        return out

    def write_into(self, dst, src) -> None:
        """``src``'s values into device array ``dst`` (same shape and dtype): a device copy, no
        allocation — a variable keeps one buffer, at one address, from step to step."""
        cupy.copyto(dst, src)

    def stage(self, leaves: list) -> Staged:
        """Batch leaves copied up on the calling thread's own stream (the prefetch thread's),
        so the copy overlaps the step running on the main stream; the step's stream waits for
        the event recorded after the copies (``Staged.take``). The buffers come from CuPy's
        pool on the copy stream: a block the step freed is reused only after the step's
        stream passed ``_fence`` (recorded at each ``release``, read after allocating).
        Stream, buffers and event are made on the process's GPU (``index``): CuPy's current
        device is per host thread, and this thread's would be device 0."""
        local = self._local
        host = [x if self.is_array(x) else np.asarray(x, order="C") for x in leaves]  # (0-d stays)
        with cupy.cuda.Device(self.index):
            if getattr(local, "stream", None) is None or local.stream.device_id != self.index:
                local.stream = cupy.cuda.Stream(non_blocking=True)
            stream = local.stream
            with stream:
                out = [x if self.is_array(x) else cupy.empty(x.shape, x.dtype) for x in host]
                fence = self._fence
                if fence is not None:
                    stream.wait_event(fence)
                for buf, x in zip(out, host):
                    if buf is not x:
                        with self._count:
                            self.transfers["to_device"] += x.nbytes
                        buf.set(x, stream=stream)
                event = stream.record()
        log = self.staging
        if log is not None:
            log.append(("stage", threading.current_thread().name,
                        ([b for b, x in zip(out, host) if b is not x], event, stream.device_id)))
        return Staged(out, lambda: self._wait(event), self._release)

    def _wait(self, event) -> None:
        """The calling thread's current stream (the step's) waits for ``event``."""
        log = self.staging
        if log is not None:
            log.append(("wait", threading.current_thread().name, event))
        cupy.cuda.get_current_stream().wait_event(event)

    def _release(self) -> None:
        self._fence = cupy.cuda.get_current_stream().record()

    def finite(self, x) -> bool:
        """Whether every value is finite: one reduction here, one byte copied down."""
        if x.dtype.kind != "f" or x.size == 0:
            return True
        return bool(self.to_host(cupy.isfinite(x).all()))


DEVICE = CupyDevice()


def place() -> int:
    """Use GPU ``local rank % device count`` under MPI (``PLACEMENT``, set by the runtime); a
    single process keeps its current device. Returns the device's index, kept as
    ``DEVICE.index`` for threads other than this one (``CupyDevice.stage``)."""
    choose = PLACEMENT.get("cupy")
    index = choose(cupy.cuda.runtime.getDeviceCount()) if choose is not None else None
    if index is not None:
        cupy.cuda.Device(index).use()
    DEVICE.index = cupy.cuda.runtime.getDevice()
    return DEVICE.index


__all__ = ["DEVICE", "CupyDevice", "place"]
