"""``replicate.nn``: modules with named parameters, layers, activations and losses."""

from . import init
from .functional import (
                         gelu,
                         huber,
                         leaky_relu,
                         log_softmax,
                         mse,
                         relu,
                         sigmoid,
                         sigmoid_binary_cross_entropy,
                         softmax,
                         softmax_cross_entropy,
                         tanh,
                         upsample,
)
from .layers import (
    BatchNorm,
    Conv2d,
    ConvTranspose2d,
    Dropout,
    Embedding,
    Flatten,
    LayerNorm,
    Linear,
    Upsample,
)
from .module import Module, Sequential

__all__ = [
    "BatchNorm", "Conv2d", "ConvTranspose2d", "Dropout", "Embedding", "Flatten", "LayerNorm",
    "Linear", "Module", "Sequential", "Upsample", "gelu", "huber", "init", "leaky_relu",
    "log_softmax", "mse", "relu", "sigmoid", "sigmoid_binary_cross_entropy", "softmax",
    "softmax_cross_entropy", "tanh", "upsample",
]
