"""Eager mode's optimiser update without a loop over the parameters: the small parameters of one
dtype (and master-weight status) laid end to end in one flat array, with their gradients and
slots, and the built-in (elementwise) ``update`` run once on it; a parameter as large as a group
is a group of its own. The Variables take the new flat arrays in pieces (views, no copy), so the
next update finds each group's values already laid end to end in one buffer and takes it as it
is; only the gradients are joined. Many small tensors cost one NumPy call an op, not one each.

The same ops on the same elements as the per-parameter update (``tests/api/test_optim_flat.py``:
to the bit). Graph mode keeps one update per parameter: the compiled step fuses them, and
sharded optimiser state (``sharding.py``) cuts each parameter's slots.
"""

from __future__ import annotations

import numpy as np

GROUP = 65536  # elements: small parameters are packed into groups up to this size


def groups(params, masters) -> list:
    """The groups of ``params`` (Variables) in order: by dtype and master-weight status, small
    ones packed up to ``GROUP`` elements, each large one alone."""
    open_, out = {}, []
    for i, p in enumerate(params):
        size = int(np.prod(p.shape))
        key = (p.dtype, masters[i] is None)
        if size >= GROUP // 4:
            out.append([i])
            continue
        group = open_.get(key)
        if group is None or group[1] + size > GROUP:
            group = open_[key] = [[], 0]
            out.append(group[0])
        group[0].append(i)
        group[1] += size
    return [Group(ix, [tuple(params[i].shape) for i in ix]) for ix in out]


class Group:
    """The indices of the parameters updated together, and where each lies in the flat array."""

    def __init__(self, index, shapes):
        self.index, self.shapes = index, shapes
        self.bounds = np.cumsum([0] + [int(np.prod(s)) for s in shapes]).tolist()
        self.size = self.bounds[-1]
        self._split = {}  # key -> (flat, its pieces): the last ``split`` under each key

    def flat(self, values, dtype, key=None) -> np.ndarray:
        """``values`` (one per parameter, in order) as one 1-D ``dtype`` array: the buffer
        they are pieces of when they tile it in order (what the last update left), else a copy.
        ``key``: the one ``split`` gave under that key, while ``values`` are its pieces."""
        if len(values) == 1:
            return np.asarray(values[0], dtype).reshape(-1)
        last = self._split.get(key) if key is not None else None
        if last is not None and last[0].dtype == dtype \
                and all(v is piece for v, piece in zip(values, last[1])):
            return last[0]  # (the pieces a ``split`` made, each still where it was put)
        base = values[0].base
        if base is not None and base.ndim == 1 and base.dtype == dtype \
                and base.size == self.size and base.flags.c_contiguous:
            start, step = base.__array_interface__["data"][0], base.itemsize
            if all(v.base is base and v.dtype == dtype and v.flags.c_contiguous
                   and v.__array_interface__["data"][0] == start + lo * step
                   for v, lo in zip(values, self.bounds)):
                return base
        return np.concatenate([np.asarray(v, dtype).reshape(-1) for v in values])

    def split(self, flat, key=None) -> list:
        """``flat``'s pieces, one per parameter (views); ``key``: kept for ``flat``."""
        pieces = [flat[lo:hi].reshape(shape)
                  for lo, hi, shape in zip(self.bounds, self.bounds[1:], self.shapes)]
        if key is not None and len(pieces) > 1:
            self._split[key] = (flat, pieces)
        return pieces


class FlatSlot:
    """A group's slot Variables as one flat array: what ``Slots[group]`` gives ``update``."""

    def __init__(self, variables, group):
        self.variables, self.group = variables, group

    def values(self) -> np.ndarray:
        return self.group.flat([v.read().value for v in self.variables],
                               self.variables[0].dtype, key=id(self.variables[0]))

    def assign(self, flat) -> None:
        for var, piece in zip(self.variables, self.group.split(flat, key=id(self.variables[0]))):
            var.assign(piece)


class Slots(list):
    """One slot Variable per parameter (an optimiser's ``m``, ``v``, ...); indexed by a
    ``Group`` (eager mode's flat update), the group's slots as one flat array."""

    def __getitem__(self, key):
        if isinstance(key, Group):
            return FlatSlot([list.__getitem__(self, i) for i in key.index], key)
        return list.__getitem__(self, key)


__all__ = ["GROUP", "FlatSlot", "Group", "Slots", "groups"]
