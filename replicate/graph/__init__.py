"""The IR: primitives and their rule tables, tracing, autodiff, passes, printing, validation."""

from . import collectives as _collectives  # noqa: F401  (registers the collective primitives)
from . import fused as _fused  # noqa: F401  (registers the fused-group primitive)
from .core import Array, AVal, Graph, Node
from .printer import format_graph
from .validate import validate

__all__ = ["AVal", "Array", "Graph", "Node", "format_graph", "validate"]
