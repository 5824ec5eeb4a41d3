"""``ModuleList`` and ``ModuleDict``: sub-modules held in a list or a dict, named as PyTorch
names them (``"0.weight"``, ``"blocks.1.attn.in_proj_weight"``, ``"heads.cls.bias"``)."""

from __future__ import annotations

from ..dependency import TraceKeyed
from ..errors import ReplicateError
from .module import Module


def _checked(module, what):
    if not isinstance(module, Module):
        raise ReplicateError(f"{what} holds rp.nn.Module objects, got {type(module).__name__}")
    return module


class _Container(Module):
    """Children kept in ``_children`` only. A change replaces that dict (a new object), so a
    step compiled before the change traces again (``replicate.dependency``)."""

    def _replace(self, children: dict) -> None:
        TraceKeyed.__setattr__(self, "_children", children)

    def __len__(self):
        return len(self._children)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} is a container: call its modules")


class ModuleList(_Container):
    """A list of modules, as ``torch.nn.ModuleList``: indexing (a slice gives a ModuleList),
    iteration, ``len``, ``append``, ``extend``, ``insert``; parameters named ``"<i>.<name>"``.

    >>> import replicate as rp
    >>> class Net(rp.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.blocks = rp.nn.ModuleList([rp.nn.Linear(2, 2) for _ in range(2)])
    >>> sorted(Net().parameters())
    ['blocks.0.bias', 'blocks.0.weight', 'blocks.1.bias', 'blocks.1.weight']
    """

    def __init__(self, modules=()):
        super().__init__()
        self.extend(modules)

    def _index(self, i):
        n = len(self)
        j = i.__index__() if not isinstance(i, int) else i
        if not -n <= j < n:
            raise IndexError(f"index {i} is out of range for a ModuleList of {n}")
        return j % n

    def __getitem__(self, i):
        self.traced_by()
        items = list(self._children.values())
        if isinstance(i, slice):
            return ModuleList(items[i])
        return items[self._index(i)]

    def __setitem__(self, i, module):
        items = list(self._children.values())
        items[self._index(i)] = _checked(module, "ModuleList")
        self._replace({str(k): m for k, m in enumerate(items)})

    def __delitem__(self, i):
        items = list(self._children.values())
        del items[i if isinstance(i, slice) else self._index(i)]
        self._replace({str(k): m for k, m in enumerate(items)})

    def __iter__(self):
        self.traced_by()
        return iter(list(self._children.values()))

    def append(self, module):
        return self.extend([module])

    def extend(self, modules):
        children = dict(self._children)
        for module in modules:
            children[str(len(children))] = _checked(module, "ModuleList")
        self._replace(children)
        return self

    def insert(self, index, module):
        items = list(self._children.values())
        items.insert(index, _checked(module, "ModuleList"))
        self._replace({str(k): m for k, m in enumerate(items)})

    def __repr__(self):
        return f"ModuleList({list(self._children.values())!r})"


class ModuleDict(_Container):
    """An ordered dict of modules by string key, as ``torch.nn.ModuleDict``: ``d[key]``,
    ``d.key``, ``in``, ``len``, iteration over the keys, ``keys``/``items``/``values``,
    ``update``, ``pop``; parameters named ``"<key>.<name>"``. A key may not contain ``"."`` nor
    shadow an attribute of the class (``"keys"``, ``"train"``).

    >>> import replicate as rp
    >>> heads = rp.nn.ModuleDict({"cls": rp.nn.Linear(4, 3), "box": rp.nn.Linear(4, 4)})
    >>> list(heads), sorted(heads.parameters())[:2]
    (['cls', 'box'], ['box.bias', 'box.weight'])
    """

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def _key(self, key):
        if not isinstance(key, str) or not key or "." in key:
            raise ReplicateError(f"ModuleDict keys are non-empty strings without '.', got "
                                 f"{key!r}")
        if hasattr(type(self), key) or (key.startswith("_") and key in self.__dict__):
            raise ReplicateError(f"ModuleDict key {key!r} would shadow an attribute")
        return key

    def __getitem__(self, key):
        self.traced_by()
        return self._children[key]

    def __getattr__(self, name):  # only for names not found the ordinary way
        children = self.__dict__.get("_children", {})
        if name in children:
            self.traced_by()
            return children[name]
        raise AttributeError(f"ModuleDict has no attribute or key {name!r}")

    def __setitem__(self, key, module):
        self.update({key: module})

    def __delitem__(self, key):
        self.pop(key)

    def __contains__(self, key):
        self.traced_by()
        return key in self._children

    def __iter__(self):
        return iter(self.keys())

    def keys(self):
        self.traced_by()
        return list(self._children)

    def values(self):
        self.traced_by()
        return list(self._children.values())

    def items(self):
        self.traced_by()
        return list(self._children.items())

    def update(self, modules):
        pairs = modules.items() if hasattr(modules, "items") else modules
        children = dict(self._children)
        for key, module in pairs:
            children[self._key(key)] = _checked(module, "ModuleDict")
        self._replace(children)

    def pop(self, key):
        children = dict(self._children)
        module = children.pop(key)
        self._replace(children)
        return module

    def __repr__(self):
        return f"ModuleDict({dict(self._children)!r})"
