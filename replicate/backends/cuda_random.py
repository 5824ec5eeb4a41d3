"""The counter-based random bits as a CUDA kernel: the reference's hash (``graph/reference.py``,
``random_bits``), written in C, so a device backend draws on the device the same bits as NumPy.

Each output element ``i`` is the murmur3-style mix of ``(key, i)`` and the stream's salt: three
``fmix`` rounds over ``uint32`` values, whose wrapping ``*``, ``+``, ``^`` and ``>>`` C computes as
NumPy does. The kernel is a ``cupy.ElementwiseKernel`` over the output (its index ``i`` is the
counter), reading the two key words from a ``raw`` parameter. Its source uses nothing but
``unsigned int`` arithmetic, so the CuPy stand-in of the tests runs this very text (and NVRTC
compiles it): the bits are compared with the reference's bit for bit.

>>> print(random_bits_spec(0).operation.splitlines()[0])
const unsigned int k0 = (unsigned int)key[0];
"""

from __future__ import annotations

from .cuda_codegen import KernelSpec

_FMIX = ("h ^= h >> 16;", "h *= 0x85EBCA6Bu;", "h ^= h >> 13;", "h *= 0xC2B2AE35u;",
         "h ^= h >> 16;")


def salt(stream: int) -> int:
    """The per-stream constant the reference adds to the first round."""
    return (stream * 0x632BE5AB) & 0xFFFFFFFF


def random_bits_spec(stream: int) -> KernelSpec:
    """The kernel writing ``out[i] = hash(key, i)`` (``uint32``) for random stream ``stream``."""
    lines = ["const unsigned int k0 = (unsigned int)key[0];",
             "const unsigned int k1 = (unsigned int)key[1];",
             f"unsigned int h = (unsigned int)i * 0x9E3779B9u + k0 + 0x{salt(stream):08X}u;",
             *_FMIX,
             "h ^= k1;",
             *_FMIX,
             "h += (k0 ^ 0x5BD1E995u);",
             *_FMIX,
             "out = h;"]
    return KernelSpec("elementwise", f"replicate_random_bits_{stream}", "raw uint32 key",
                      "uint32 out", operation="\n".join(lines))


__all__ = ["random_bits_spec", "salt"]
