"""``replicate.nn``: modules with named parameters, layers, activations and losses."""

from . import init
from .attention import MultiheadAttention, scaled_dot_product_attention
from .containers import ModuleDict, ModuleList
from .functional import (
                         flatten,
                         gelu,
                         huber,
                         leaky_relu,
                         log_softmax,
                         mse,
                         nll_loss,
                         one_hot,
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
    "Linear", "Module", "ModuleDict", "ModuleList", "MultiheadAttention", "Sequential",
    "Upsample", "flatten", "gelu", "huber", "init", "leaky_relu", "log_softmax", "mse",
    "nll_loss", "one_hot", "relu", "scaled_dot_product_attention", "sigmoid",
    "sigmoid_binary_cross_entropy", "softmax", "softmax_cross_entropy", "tanh", "upsample",
]
