"""Bitwise ops of integers and bools, as NumPy's; re-exported by rnp (``__all__``), and the
operators ``&``, ``|``, ``^``, ``<<``, ``>>`` of ``Array``.

>>> import replicate.numpy as rnp
>>> x = rnp.asarray([12, -8], "int8")
>>> (x & 10).tolist(), (x | 3).tolist(), (x ^ -1).tolist(), (x >> 2).tolist()
([8, 8], [15, -5], [-13, 7], [3, -2])
>>> (rnp.asarray([True, False]) & True).tolist()
[True, False]

Shifts are NumPy's at any count, where C's are undefined: a count of the operand's width or more,
or a negative count, shifts every bit out (0; a right shift of a negative number gives -1).

>>> rnp.left_shift(rnp.asarray([1, 1, 1], "int8"), rnp.asarray([7, 8, -1], "int8")).tolist()
[-128, 0, 0]
>>> rnp.right_shift(rnp.asarray([-128, 64], "int8"), 9).tolist()
[-1, 0]
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
from ..graph.core import bind
from ._base import cast, promote


def _op(prim, shift):
    def op(x1, x2):
        a, b = promote(x1, x2)
        if a.dtype.kind not in "biu":
            raise DTypeError(f"{prim} needs integers or bools, got {a.dtype} (NumPy's "
                             "TypeError: floats have no bitwise ops)")
        if shift and a.dtype == np.bool_:  # NumPy shifts bools as int8
            a, b = cast(a, "int8"), cast(b, "int8")
        return bind(prim, a, b)

    op.__name__ = op.__qualname__ = prim
    op.__doc__ = (f"NumPy's ``{prim}`` of integers{'' if shift else ' or bools'}, elementwise "
                  "(NumPy's promotion); no gradient.")
    return op


bitwise_and = _op("bitwise_and", False)
bitwise_or = _op("bitwise_or", False)
bitwise_xor = _op("bitwise_xor", False)
left_shift = _op("left_shift", True)
right_shift = _op("right_shift", True)
bitwise_left_shift, bitwise_right_shift = left_shift, right_shift  # the Array API's names

__all__ = ["bitwise_and", "bitwise_left_shift", "bitwise_or", "bitwise_right_shift",
           "bitwise_xor", "left_shift", "right_shift"]
