"""Special functions NumPy lacks, for the reference table: ``erf``, vectorised, float64-accurate.

The algorithm and its coefficients are those of fdlibm's ``s_erf.c`` (also FreeBSD's and musl's
libm): on ``|x| < 0.84375`` an odd rational function of x; on ``[0.84375, 1.25)`` a constant plus
a rational function of ``|x| - 1``; on ``[1.25, 6)`` ``1 - exp(-x*x - 0.5625 + R/S) / |x|`` with
R/S rational in ``1/x**2`` (two fits, split at ``1/0.35``), ``exp(-x*x)`` computed in two parts
to keep its rounding small; ``±1`` beyond. Its error is under one unit in the last place, and
``tests/api/test_ops.py`` checks it against ``math.erf``.

    Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
    Developed at SunSoft, a Sun Microsystems, Inc. business.
    Permission to use, copy, modify, and distribute this software is freely granted, provided
    that this notice is preserved.

>>> import numpy as np
>>> erf(np.array([0.0, 0.5, -2.0, np.inf])).tolist()
[0.0, 0.5204998778130465, -0.9953222650189527, 1.0]
"""

from __future__ import annotations

import numpy as np

ERX = 8.45062911510467529297e-01
EFX = 1.28379167095512586316e-01
PP = (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
      -5.77027029648944159157e-03, -2.37630166566501626084e-05)
QQ = (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
      1.32494738004321644526e-04, -3.96022827877536812320e-06)
PA = (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
      3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
      -2.16637559486879084300e-03)
QA = (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
      1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02)
RA = (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e+01,
      -6.23753324503260060396e+01, -1.62396669462573470355e+02, -1.84605092906711035994e+02,
      -8.12874355063065934246e+01, -9.81432934416914548592e+00)
SA = (1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02, 4.34565877475229228821e+02,
      6.45387271733267880336e+02, 4.29008140027567833386e+02, 1.08635005541779435134e+02,
      6.57024977031928170135e+00, -6.04244152148580987438e-02)
RB = (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e+01,
      -1.60636384855821916062e+02, -6.37566443368389627722e+02, -1.02509513161107724954e+03,
      -4.83519191608651397019e+02)
SB = (1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02, 1.53672958608443695994e+03,
      3.19985821950859553908e+03, 2.55305040643316442583e+03, 4.74528541206955367215e+02,
      -2.24409524465858183362e+01)
# where fdlibm switches from the first erfc fit to the second: the double whose high word is
# 0x4006DB6E (about 1/0.35)
SPLIT = float(np.array(0x4006DB6E << 32, np.uint64).view(np.float64))


def _poly(coefficients, z):
    """``c0 + c1 z + c2 z**2 + ...`` by Horner's rule."""
    out = np.full_like(z, coefficients[-1])
    for c in coefficients[-2::-1]:
        out = out * z + c
    return out


def erf(x, out=None):
    """The error function of ``x``, elementwise, computed in float64 (a float16/float32 input
    is widened first; the caller rounds to its dtype)."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    result = np.empty_like(x)
    with np.errstate(all="ignore"):  # each branch is computed on its own elements only
        small = a < 0.84375
        xs = x[small]
        z = xs * xs
        result[small] = np.where(np.abs(xs) < 2.0 ** -28, xs + EFX * xs,
                                 xs + xs * (_poly(PP, z) / _poly(QQ, z)))
        mid = (a >= 0.84375) & (a < 1.25)
        s = a[mid] - 1.0
        result[mid] = np.copysign(ERX + _poly(PA, s) / _poly(QA, s), x[mid])
        tail = (a >= 1.25) & (a < 6.0)
        t = a[tail]
        s = 1.0 / (t * t)
        near = t < SPLIT
        ratio = np.where(near, _poly(RA, s) / _poly(SA, s), _poly(RB, s) / _poly(SB, s))
        hi = (t.view(np.uint64) & np.uint64(0xFFFFFFFF00000000)).view(np.float64)
        r = np.exp(-hi * hi - 0.5625) * np.exp((hi - t) * (hi + t) + ratio)
        result[tail] = np.copysign(1.0 - r / t, x[tail])
        big = a >= 6.0  # (and ±inf); NaN fails every comparison above and here
        result[big] = np.copysign(1.0, x[big])
        result[np.isnan(x)] = np.nan
    if out is not None:
        np.copyto(out, result, casting="unsafe")
        return out
    return result
