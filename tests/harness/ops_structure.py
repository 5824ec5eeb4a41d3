"""The op harness's cases: reductions, contractions (``matmul``, ``dot``, ``einsum``), shapes and
indexing."""

from __future__ import annotations

import numpy as np

import replicate.numpy as rnp

from .cases import BOOL, F32, F64, I32, I64, In, case

# -- reductions --------------------------------------------------------------------------------
REDUCTIONS = {
    "sum": (rnp.sum, np.sum, "real"),
    "mean": (rnp.mean, np.mean, "real"),
    "max": (rnp.max, np.max, "real"),
    "min": (rnp.min, np.min, "real"),
    "prod": (rnp.prod, np.prod, "away0"),
    "var": (rnp.var, np.var, "real"),
    "std": (rnp.std, np.std, "real"),
}


def logsumexp_ref(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


REDUCTIONS["logsumexp"] = (rnp.logsumexp, logsumexp_ref, "real")
REDUCTION_AXES = {(): [None], (4,): [None, 0, -1], (2, 3): [None, 0, 1, (0, 1)],
                  (2, 3, 4): [None, 1, -1, (0, 2)], (3, 1, 2): [None, 1, (0, 1)]}


def axis_op(op, **kw):
    return lambda x: op(x, **kw)


for name, (op, ref, domain) in REDUCTIONS.items():
    for shape, axes in REDUCTION_AXES.items():
        for axis in axes:
            for keepdims in (False, True):
                # over size-1 axes the variance is 0: std's gradient there is 0 (its choice)
                kw = dict(axis=axis, keepdims=keepdims)
                case(name, axis_op(op, **kw), axis_op(ref, **kw), In(shape, F64, domain),
                     label=f"axis={axis},keepdims={keepdims}")
    for dtype in (F32, I32, I64, BOOL):
        if dtype == BOOL and name in ("var", "std", "logsumexp", "prod"):
            continue
        if name == "logsumexp" and dtype != F32:
            continue  # NumPy has no logsumexp; the reference promotes ints differently
        case(name, axis_op(op, axis=1), axis_op(ref, axis=1), In((2, 3), dtype, domain))
for ddof in (1, 2, 4, 5, 6):  # 5 and 6: ddof >= the count, inf (NaN for 5 values of 1.0)
    case("var", lambda x, d=ddof: rnp.var(x, axis=0, ddof=d),
         lambda x, d=ddof: np.var(x, axis=0, ddof=d), In((4, 3)), label=f"ddof={ddof}",
         grad=ddof < 4)
    case("std", lambda x, d=ddof: rnp.std(x, ddof=d), lambda x, d=ddof: np.std(x, ddof=d),
         In((5,)), label=f"ddof={ddof}", grad=ddof < 5)
    case("var+std", lambda x, d=ddof: (rnp.var(x, ddof=d), rnp.std(x, axis=0, ddof=d)),
         lambda x, d=ddof: (np.var(x, ddof=d), np.std(x, axis=0, ddof=d)),
         In((5, 2), F64, "class1"), label=f"zero spread,ddof={ddof}", grad=ddof < 5)
case("sum", lambda x: rnp.sum(x, axis=0, dtype=np.float32),
     lambda x: np.sum(x, axis=0, dtype=np.float32), In((3, 2), I32), label="dtype")
case("sum+mean+max+min+prod+var+std+argmax+argmin",
     lambda x: [x.sum(0), x.mean(axis=1), x.max(), x.min(1), x.prod(axis=0), x.var(),
                x.std(1), x.argmax(1), x.argmin()],
     lambda x: [x.sum(0), x.mean(axis=1), x.max(), x.min(1), x.prod(axis=0), x.var(),
                x.std(1), x.argmax(1), x.argmin()], In((3, 4), F64, "away0"), label="methods")
case("logsumexp", lambda x: rnp.logsumexp(x * 300.0, axis=1),
     lambda x: logsumexp_ref(x * 300.0, axis=1), In((2, 3)), label="large")

for name, op, ref in [("argmax", rnp.argmax, np.argmax), ("argmin", rnp.argmin, np.argmin)]:
    for shape, axes in REDUCTION_AXES.items():
        for axis in axes:
            if isinstance(axis, tuple):
                continue
            for keepdims in (False, True):
                kw = dict(axis=axis, keepdims=keepdims)
                case(name, axis_op(op, **kw), axis_op(ref, **kw), In(shape),
                     label=f"axis={axis},keepdims={keepdims}")
    case(name, axis_op(op, axis=0), axis_op(ref, axis=0), In((4, 3), I32))
    case(name, axis_op(op, axis=-1), axis_op(ref, axis=-1), In((4, 3), F64, "int"), label="ties")

# -- contractions ------------------------------------------------------------------------------
MATMUL_SHAPES = [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)),
                 ((5, 2, 3), (3, 4)), ((2, 3), (5, 3, 4)), ((2, 1, 2, 3), (4, 3, 2)),
                 ((3,), (2, 3, 4)), ((2, 2, 3), (3,)), ((1, 3), (3, 1))]
for sa, sb in MATMUL_SHAPES:
    case("matmul", rnp.matmul, np.matmul, In(sa), In(sb))
case("matmul", lambda a, b: a @ b, lambda a, b: a @ b, In((2, 3)), In((3, 2)), label="operator@")
case("matmul", lambda a, b: b.T @ a.T, lambda a, b: b.T @ a.T, In((2, 3)), In((3, 2)),
     label="rmatmul-T")
case("matmul", rnp.matmul, np.matmul, In((2, 3), I32), In((3, 2), I32))
case("matmul", rnp.matmul, np.matmul, In((2, 3), F32), In((3, 2), F64), label="promote")
case("dot", rnp.dot, np.dot, In((2, 3)), In((3,)))
case("dot", rnp.dot, np.dot, In((3,)), In((3,)))
case("dot", rnp.dot, np.dot, In((2, 3)), In((3, 4)))
for sa, sb in [((2, 3), (2, 3, 2)), ((2, 1, 3), (2, 3, 2)), ((3,), (2, 3, 2)), ((), (2, 3)),
               ((2, 2, 3), (3,))]:
    case("dot", rnp.dot, np.dot, In(sa), In(sb), label="np.dot-not-matmul")
EINSUM = [("ij,jk->ik", [(2, 3), (3, 4)]), ("ij->ji", [(2, 3)]), ("ij->", [(2, 3)]),
          ("ij->j", [(2, 3)]), ("i,i->", [(4,)] * 2), ("i,j->ij", [(2,), (3,)]),
          ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]), ("ijk,k->ij", [(2, 3, 4), (4,)]),
          ("ij,ij->ij", [(2, 3)] * 2), ("ij,jk", [(2, 3), (3, 2)]), ("ij,jk,kl->il",
          [(2, 3), (3, 2), (2, 2)]), ("ij,k->ik", [(2, 3), (4,)]), ("bhqd,bhkd->bhqk",
          [(1, 2, 3, 2), (1, 2, 4, 2)]), ("i->", [(5,)]), ("ij,j", [(2, 3), (3,)])]
for subscripts, shapes in EINSUM:
    case("einsum", lambda *xs, s=subscripts: rnp.einsum(s, *xs),
         lambda *xs, s=subscripts: np.einsum(s, *xs), *[In(s) for s in shapes], label=subscripts)
case("einsum", lambda a, b: rnp.einsum("ij,jk->ik", a, b),
     lambda a, b: np.einsum("ij,jk->ik", a, b), In((2, 3), F32), In((3, 2), F64),
     label="promote")

# -- shapes ------------------------------------------------------------------------------------
SHAPE_CASES = [
    ("reshape", lambda x: rnp.reshape(x, (3, 2)), lambda x: np.reshape(x, (3, 2)), [(2, 3)]),
    ("reshape", lambda x: rnp.reshape(x, (2, -1)), lambda x: np.reshape(x, (2, -1)), [(6,)]),
    ("reshape", lambda x: rnp.reshape(x, (1, 1)), lambda x: np.reshape(x, (1, 1)), [()]),
    ("reshape", lambda x: rnp.reshape(x, ()), lambda x: np.reshape(x, ()), [(1, 1)]),
    ("reshape", lambda x: x.reshape(4, 3), lambda x: x.reshape(4, 3), [(2, 3, 2)]),
    ("reshape", lambda x: rnp.reshape(x, 6), lambda x: np.reshape(x, 6), [(3, 2)]),
    ("ravel", rnp.ravel, np.ravel, [(2, 3, 1)]),
    ("ravel", lambda x: x.ravel(), lambda x: x.ravel(), [()]),
    ("transpose", rnp.transpose, np.transpose, [(2, 3, 4)]),
    ("transpose", lambda x: rnp.transpose(x, (1, 0, 2)), lambda x: np.transpose(x, (1, 0, 2)),
     [(2, 3, 4)]),
    ("transpose", lambda x: rnp.transpose(x, (-1, 0, 1)), lambda x: np.transpose(x, (-1, 0, 1)),
     [(2, 3, 4)]),
    ("transpose", lambda x: x.T, lambda x: x.T, [(2, 3)]),
    ("transpose", lambda x: x.transpose(1, 0), lambda x: x.transpose(1, 0), [(2, 3)]),
    ("transpose", rnp.transpose, np.transpose, [()]),
    ("swapaxes", lambda x: rnp.swapaxes(x, 0, 2), lambda x: np.swapaxes(x, 0, 2), [(2, 3, 4)]),
    ("swapaxes", lambda x: rnp.swapaxes(x, -1, 0), lambda x: np.swapaxes(x, -1, 0), [(2, 3)]),
    ("moveaxis", lambda x: rnp.moveaxis(x, 0, -1), lambda x: np.moveaxis(x, 0, -1), [(2, 3, 4)]),
    ("moveaxis", lambda x: rnp.moveaxis(x, 2, 0), lambda x: np.moveaxis(x, 2, 0), [(2, 3, 4)]),
    ("broadcast_to", lambda x: rnp.broadcast_to(x, (2, 3)), lambda x: np.broadcast_to(x, (2, 3)),
     [(3,)]),
    ("broadcast_to", lambda x: rnp.broadcast_to(x, (2, 2)), lambda x: np.broadcast_to(x, (2, 2)),
     [()]),
    ("broadcast_to", lambda x: rnp.broadcast_to(x, (4, 2, 3)),
     lambda x: np.broadcast_to(x, (4, 2, 3)), [(2, 1)]),
    ("expand_dims", lambda x: rnp.expand_dims(x, 0), lambda x: np.expand_dims(x, 0), [(2, 3)]),
    ("expand_dims", lambda x: rnp.expand_dims(x, -1), lambda x: np.expand_dims(x, -1), [(2, 3)]),
    ("expand_dims", lambda x: rnp.expand_dims(x, (0, 2)), lambda x: np.expand_dims(x, (0, 2)),
     [(2, 3)]),
    ("expand_dims", lambda x: rnp.expand_dims(x, 0), lambda x: np.expand_dims(x, 0), [()]),
    ("squeeze", rnp.squeeze, np.squeeze, [(1, 3, 1)]),
    ("squeeze", lambda x: rnp.squeeze(x, 1), lambda x: np.squeeze(x, 1), [(2, 1, 3)]),
    ("squeeze", lambda x: rnp.squeeze(x, (0, -1)), lambda x: np.squeeze(x, (0, -1)),
     [(1, 3, 1)]),
    ("squeeze", lambda x: x.squeeze(), lambda x: x.squeeze(), [(1, 1)]),
    ("squeeze", rnp.squeeze, np.squeeze, [()]),
    ("concatenate", lambda a, b: rnp.concatenate([a, b]), lambda a, b: np.concatenate([a, b]),
     [(2, 3), (1, 3)]),
    ("concatenate", lambda a, b, c: rnp.concatenate((a, b, c), axis=-1),
     lambda a, b, c: np.concatenate((a, b, c), axis=-1), [(2, 1), (2, 3), (2, 2)]),
    ("concatenate", lambda a: rnp.concatenate([a]), lambda a: np.concatenate([a]), [(3,)]),
    ("stack", lambda a, b: rnp.stack([a, b]), lambda a, b: np.stack([a, b]), [(2, 3), (2, 3)]),
    ("stack", lambda a, b, c: rnp.stack([a, b, c], axis=1),
     lambda a, b, c: np.stack([a, b, c], axis=1), [(2, 3)] * 3),
    ("stack", lambda a, b: rnp.stack([a, b], axis=-1), lambda a, b: np.stack([a, b], axis=-1),
     [(2, 3), (2, 3)]),
    ("stack", lambda a, b: rnp.stack([a, b]), lambda a, b: np.stack([a, b]), [(), ()]),
    ("split", lambda x: rnp.split(x, 3), lambda x: np.split(x, 3), [(6, 2)]),
    ("split", lambda x: rnp.split(x, [1, 3], axis=1), lambda x: np.split(x, [1, 3], axis=1),
     [(2, 5)]),
    ("split", lambda x: rnp.split(x, 1, axis=-1), lambda x: np.split(x, 1, axis=-1), [(2, 3)]),
    ("split", lambda x: rnp.split(x, [2, 2], axis=0), lambda x: np.split(x, [2, 2], axis=0),
     [(4,)]),
    ("pad", lambda x: rnp.pad(x, 1), lambda x: np.pad(x, 1), [(2, 3)]),
    ("pad", lambda x: rnp.pad(x, ((1, 0), (0, 2))), lambda x: np.pad(x, ((1, 0), (0, 2))),
     [(2, 3)]),
    ("pad", lambda x: rnp.pad(x, (2, 1), constant_values=1.5),
     lambda x: np.pad(x, (2, 1), constant_values=1.5), [(3,)]),
    ("pad", lambda x: rnp.pad(x, ((0, 0), (0, 0), (1, 1))),
     lambda x: np.pad(x, ((0, 0), (0, 0), (1, 1))), [(1, 2, 2)]),
]
for name, fn, ref, shapes in SHAPE_CASES:
    case(name, fn, ref, *[In(s) for s in shapes])
case("concatenate", lambda a, b: rnp.concatenate([a, b], axis=1),
     lambda a, b: np.concatenate([a, b], axis=1), In((2, 1), F32), In((2, 2), F64),
     label="promote")
case("stack", lambda a, b: rnp.stack([a, b]), lambda a, b: np.stack([a, b]), In((3,), I32),
     In((3,), F32), label="promote")
case("pad", lambda x: rnp.pad(x, 1, constant_values=7), lambda x: np.pad(x, 1, constant_values=7),
     In((2, 2), I32), label="int")
case("reshape+transpose", lambda x: rnp.transpose(rnp.reshape(x, (3, 2)), (1, 0)),
     lambda x: np.transpose(np.reshape(x, (3, 2)), (1, 0)), In((6,), BOOL), label="bool")

# -- indexing ----------------------------------------------------------------------------------
BASIC_KEYS = [1, -1, slice(1, 3), slice(None, None, 2), (slice(None), 1), None, (Ellipsis, 0),
              (1, slice(None, None, -1)), (slice(3, 0, -2), slice(1, None)),
              (None, slice(None), None, 2), (0, 0), np.int64(2), (slice(None), slice(0, 0))]
for key in BASIC_KEYS:
    case("getitem", lambda x, k=key: x[k], lambda x, k=key: x[k], In((4, 5)), label=repr(key))
case("getitem", lambda x: x[1, :, -2], lambda x: x[1, :, -2], In((2, 3, 4)), label="3d")
case("getitem", lambda x: rnp.getitem(x, (0, slice(1, None))), lambda x: x[0, 1:], In((3, 3)),
     label="function")
ADVANCED = [  # (label, key builder taking the index arrays, index shapes and axis sizes)
    ("x[i]", lambda x, i: x[i], [((5,), 4)], (4, 3)),
    ("x[i2d]", lambda x, i: x[i], [((2, 3), 4)], (4, 3)),
    ("x[:,i]", lambda x, i: x[:, i], [((5,), 3)], (4, 3)),
    ("x[i,j]", lambda x, i, j: x[i, j], [((2, 3), 4), ((3,), 3)], (4, 3)),
    ("x[i,:,j]", lambda x, i, j: x[i, :, j], [((3,), 2), ((3,), 4)], (2, 3, 4)),
    ("x[1,:,j]", lambda x, j: x[1, :, j], [((2,), 4)], (2, 3, 4)),
    ("x[:,i,j]", lambda x, i, j: x[:, i, j], [((2, 1), 3), ((4,), 4)], (2, 3, 4)),
    ("x[i]0d", lambda x, i: x[i], [((), 4)], (4, 3)),
    ("x[...,i]", lambda x, i: x[..., i], [((3,), 4)], (2, 3, 4)),
]
for label, fn, index_specs, shape in ADVANCED:
    # index arrays passed as arguments: graph inputs in graph mode
    case("getitem", fn, fn, In(shape), *[In(s, I64, f"index{n}") for s, n in index_specs],
         label=label)
for label, key in [("repeated", np.array([0, 2, 2, -1])), ("list", [3, 0, 3]),
                   ("mask", np.array([True, False, True, True]))]:
    # index arrays closed over as constants
    case("getitem", lambda x, k=key: x[k], lambda x, k=key: x[k], In((4, 2)), label=label)
case("getitem", lambda x, i: x[i], lambda x, i: x[i], In((4, 2), I32), In((3,), I32, "index4"),
     label="int32-index")
TAKE = [(None, (3,), (2, 3)), (None, (), (2, 3)), (0, (2, 2), (3, 2)), (1, (4,), (2, 3)),
        (-1, (2,), (2, 3, 2))]
for axis, ishape, xshape in TAKE:
    n = int(np.prod(xshape)) if axis is None else xshape[axis]
    case("take", lambda x, i, a=axis: rnp.take(x, i, axis=a),
         lambda x, i, a=axis: np.take(x, i, axis=a), In(xshape), In(ishape, I64, f"index{n}"),
         label=f"axis={axis}")
for axis, shape in [(0, (3, 4)), (1, (3, 4)), (-1, (2, 3, 4))]:
    idx_shape = list(shape)
    idx_shape[axis] = 2
    case("take_along_axis", lambda x, i, a=axis: rnp.take_along_axis(x, i, a),
         lambda x, i, a=axis: np.take_along_axis(x, i, a), In(shape),
         In(tuple(idx_shape), I64, f"index{shape[axis]}"), label=f"axis={axis}")
for dtype, n in [(I64, 4), (I32, 3)]:
    case("one_hot", lambda i, n=n: rnp.one_hot(i, n), lambda i, n=n: np.eye(n, dtype=np.float32)[i],
         In((2, 3), dtype, f"class{n}"), label=f"n={n}")
case("one_hot", lambda i: rnp.one_hot(i, 5, dtype=np.float64),
     lambda i: np.eye(5, dtype=np.float64)[i], In((4,), I64, "class5"), label="float64")
case("one_hot", lambda i: rnp.one_hot(i, 3), lambda i: np.eye(3, dtype=np.float32)[i],
     In((), I64, "class3"), label="0d")
