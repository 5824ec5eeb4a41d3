"""Reading a checkpoint ``.npz`` without trusting it.

A checkpoint may come from someone else (a download, a shared folder), so nothing in it is
believed before it is checked against the file itself: every member must be stored, not
compressed (``save`` never compresses), and its ``.npy`` header must declare exactly the bytes the
member holds, which the file must hold too — so reading never allocates more than the file's size
and never decompresses anything. Only the members asked for are read; no pickle, no object
arrays, a bounded JSON ``info``. Whatever is wrong with a file is a ``CheckpointError`` (so
``restore(pattern)`` falls back to an older file), never another exception.
"""

from __future__ import annotations

import json
import math
import os
import zipfile

import numpy as np

from ...dtypes import as_dtype
from ...errors import CheckpointError

MAX_INFO = 1 << 24  # bytes of the JSON index; a real one is a few hundred bytes per array


class Archive:
    """An open checkpoint: ``members`` ({key: ZipInfo}, ``"info"`` and ``"var/..."``) listed from
    its directory and checked against the file's size; ``array(key)`` reads one member."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        except FileNotFoundError:
            raise CheckpointError(f"cannot read checkpoint {path!r}: no such file") from None
        except OSError as e:
            raise CheckpointError(f"cannot read checkpoint {path!r}: {e}") from None
        try:
            size = os.fstat(self._file.fileno()).st_size
            self._zip = zipfile.ZipFile(self._file)
            self.members = {}
            for m in self._zip.infolist():
                key = m.filename[:-4]
                if not m.filename.endswith(".npy") or key in self.members:
                    raise self.error(f"unexpected member {m.filename!r}")
                if m.compress_type != zipfile.ZIP_STORED:
                    raise self.error(f"member {m.filename!r} is compressed ({m.compress_type}); "
                                     "checkpoints store their arrays uncompressed")
                if m.compress_size != m.file_size or m.header_offset + m.file_size > size:
                    raise self.error(f"member {m.filename!r} declares {m.file_size} bytes the "
                                     "file does not hold")
                self.members[key] = m
        except CheckpointError:
            self.close()
            raise
        except Exception as e:  # noqa: BLE001 - zipfile's errors: all "truncated or corrupt"
            self.close()
            raise self.error(f"{type(e).__name__}: {e}") from None

    def error(self, why: str) -> CheckpointError:
        return CheckpointError(f"cannot read checkpoint {self.path!r} (truncated or corrupt): "
                               f"{why}")

    def array(self, key: str, limit: int | None = None) -> np.ndarray:
        """Member ``key`` as an array, once its header's shape and dtype account for exactly the
        bytes it holds (and at most ``limit``)."""
        m = self.members.get(key)
        if m is None:
            raise self.error(f"no member {key!r}")
        if limit is not None and m.file_size > limit:
            raise self.error(f"{key!r} is {m.file_size} bytes, more than {limit}")
        try:
            with self._zip.open(m) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                if dtype.hasobject:
                    raise self.error(f"{key!r} holds Python objects")
                count = math.prod(shape)
                nbytes = count * dtype.itemsize
                if f.tell() + nbytes != m.file_size:
                    raise self.error(f"{key!r} declares {dtype}{tuple(shape)}, which is not "
                                     f"the {m.file_size - f.tell()} bytes it holds")
                data = bytearray(nbytes)
                view, got = memoryview(data), 0
                while got < nbytes:
                    n = f.readinto(view[got:])
                    if not n:
                        raise self.error(f"{key!r} is truncated")
                    got += n
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - bad header, CRC, EOF: all "corrupt"
            raise self.error(f"{key!r}: {type(e).__name__}: {e}") from None
        return np.frombuffer(data, dtype, count).reshape(shape, order="F" if fortran else "C")

    def info(self) -> dict:
        """The ``info`` entry, checked to be the JSON object ``save`` writes."""
        raw = self.array("info", MAX_INFO)
        try:
            info = json.loads(raw.tobytes().decode())
            _check_info(info)
        except Exception as e:  # noqa: BLE001 - not JSON, wrong types, unknown dtype name
            raise CheckpointError(f"cannot read checkpoint {self.path!r}: no valid info entry "
                                  f"({type(e).__name__}: {e})") from None
        return info

    def close(self) -> None:
        zf = getattr(self, "_zip", None)
        if zf is not None:
            zf.close()
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _check_info(info) -> None:
    """Raise ``ValueError``/``TypeError`` unless ``info`` has the fields and types ``save``
    writes (an older file lacks some; each present one must be right)."""
    if not isinstance(info, dict) or type(info.get("step")) is not int:
        raise ValueError("not an object with an integer 'step'")
    shapes = {"meta": (dict, None), "dtypes": (dict, str), "per_replica": (dict, int),
              "sha256": (dict, str), "run": (str, None), "format": (int, None)}
    for field, (kind, value) in shapes.items():
        if field not in info:
            continue
        if not isinstance(info[field], kind):
            raise TypeError(f"{field!r} is {type(info[field]).__name__}")
        if value is not None and not all(isinstance(k, str) and type(v) is value
                                         for k, v in info[field].items()):
            raise TypeError(f"{field!r} holds a non-{value.__name__} value")
    for name in info.get("dtypes", {}).values():
        as_dtype(name)  # (an unknown name raises here, not in restore)
    if any(n < 0 for n in info.get("per_replica", {}).values()):
        raise ValueError("a negative replica count")


def read_info(path: str) -> dict:
    """The checked ``info`` of a checkpoint (only that member is read)."""
    with Archive(path) as archive:
        return archive.info()


__all__ = ["Archive", "read_info", "MAX_INFO"]
