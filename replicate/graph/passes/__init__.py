"""Graph-to-graph passes. Each takes a Graph and returns a new (or the same) Graph."""

from .cse import cse
from .dce import dce

__all__ = ["cse", "dce"]
