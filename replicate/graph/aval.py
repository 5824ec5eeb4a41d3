"""Abstract values: what the IR knows about an array before it exists (shape and dtype)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class AVal(NamedTuple):
    """Abstract value: what the IR knows about an array before it exists."""

    shape: tuple
    dtype: np.dtype

    def __str__(self) -> str:
        return f"{dtype_short(self.dtype)}[{','.join(map(str, self.shape))}]"


_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "int8": "i8",
          "int32": "i32", "int64": "i64", "uint8": "u8", "uint32": "u32", "bool": "bool"}


def dtype_short(dtype) -> str:
    return _SHORT.get(np.dtype(dtype).name, np.dtype(dtype).name)
