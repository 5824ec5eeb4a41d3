"""Layers: Linear, Conv2d, ConvTranspose2d, Upsample, Embedding, LayerNorm, BatchNorm (optionally
cross-replica), Dropout, Flatten."""

from __future__ import annotations

import math

import numpy as np

from .. import numpy as rnp
from ..collectives import all_reduce
from ..context import num_replicas
from ..errors import ReplicateError
from ..state import Variable
from . import init
from .eager_kernels import conv2d as eager_conv2d
from .eager_kernels import linear
from .functional import flatten, upsample
from .module import Module
from .written_grads import layer_norm


def _bias(bias, bias_fn, n, fan_in, rng, dtype):
    """The bias Variable (drawn after the weight): ``bias_fn((n,), rng=, dtype=)``, or by
    default PyTorch's U(±1/sqrt(fan_in)) with the weight's fan-in; None without a bias."""
    if not bias:
        return None
    if bias_fn is None:
        return Variable(init.fan_in_uniform((n,), rng=rng, dtype=dtype, fan_in=fan_in))
    return Variable(bias_fn((n,), rng=rng, dtype=dtype))


class Linear(Module):
    """``y = x @ weight + bias`` with ``weight`` of shape (in, out).

    Initialised as ``torch.nn.Linear``: weight and bias uniform in ±1/sqrt(in_features)
    (``init_fn=rp.nn.init.fan_in_uniform``; ``bias_fn=None``: the bias with the weight's fan-in).
    ``init_fn=rp.nn.init.glorot_uniform, bias_fn=rp.nn.init.zeros`` gives Glorot's (Keras').

    >>> import numpy as np, replicate as rp
    >>> rp.nn.Linear(3, 2)(np.ones((4, 3), np.float32)).shape
    (4, 2)
    """

    def __init__(self, in_features, out_features, bias=True, *, init_fn=init.fan_in_uniform,
                 bias_fn=None, rng=None, dtype=np.float32):
        super().__init__()
        self.weight = Variable(init_fn((in_features, out_features), rng=rng, dtype=dtype))
        self.bias = _bias(bias, bias_fn, out_features, in_features, rng, dtype)

    def forward(self, x):
        if self.bias is None:
            return rnp.matmul(x, self.weight)
        return linear(rnp.as_array(x), self.weight, self.bias)  # (eager: one kernel)


class Conv2d(Module):
    """2-D convolution on NCHW inputs with OIHW weights.

    Initialised as ``torch.nn.Conv2d``: weight and bias uniform in ±1/sqrt(in_channels * kh * kw)
    (``init_fn``, ``bias_fn`` as ``Linear``'s; ``init_fn=rp.nn.init.he_normal,
    bias_fn=rp.nn.init.zeros`` gives He's)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 bias=True, *, init_fn=init.fan_in_uniform, bias_fn=None, rng=None,
                 dtype=np.float32):
        super().__init__()
        kh, kw = (kernel_size, kernel_size) if np.isscalar(kernel_size) else kernel_size
        self.weight = Variable(init_fn((out_channels, in_channels, kh, kw), rng=rng, dtype=dtype))
        self.bias = _bias(bias, bias_fn, out_channels, in_channels * kh * kw, rng, dtype)
        self.stride, self.padding, self.dilation = stride, padding, dilation

    def forward(self, x):
        if self.bias is not None:  # eager mode: one kernel where it may (eager_kernels.py)
            y = eager_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)
            if y is not None:
                return y
        y = rnp.conv2d(x, self.weight, self.stride, self.padding, self.dilation)
        if self.bias is not None:
            y = y + rnp.reshape(self.bias.read(), (1, -1, 1, 1))
        return y


class ConvTranspose2d(Module):
    """Transposed 2-D convolution on NCHW inputs, as ``torch.nn.ConvTranspose2d`` (one group):
    weights of shape (in, out, kH, kW), ``rnp.conv_transpose2d`` and a bias per output channel;
    initialised as PyTorch's: weight and bias uniform in ±1/sqrt(out_channels * kh * kw).

    >>> import numpy as np, replicate as rp
    >>> rp.nn.ConvTranspose2d(3, 2, 4, stride=2, padding=1)(np.ones((1, 3, 5, 5), np.float32)).shape
    (1, 2, 10, 10)
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, bias=True, dilation=1, *, init_fn=init.fan_in_uniform,
                 bias_fn=None, rng=None, dtype=np.float32):
        super().__init__()
        kh, kw = (kernel_size, kernel_size) if np.isscalar(kernel_size) else kernel_size
        # (in, out, kh, kw): the fan-in the initialiser reads is out * kh * kw, as PyTorch's
        self.weight = Variable(init_fn((in_channels, out_channels, kh, kw), rng=rng, dtype=dtype))
        self.bias = _bias(bias, bias_fn, out_channels, out_channels * kh * kw, rng, dtype)
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.dilation = dilation

    def forward(self, x):
        y = rnp.conv_transpose2d(x, self.weight, self.stride, self.padding, self.output_padding,
                                 self.dilation)
        if self.bias is not None:
            y = y + rnp.reshape(self.bias.read(), (1, -1, 1, 1))
        return y


class Upsample(Module):
    """Upsample NCHW inputs by ``scale_factor`` (a number or an (h, w) pair), ``mode``
    ``"nearest"`` or ``"bilinear"`` (``align_corners=False``), as ``torch.nn.Upsample``; no
    parameters (``rp.nn.functional.upsample``).

    >>> import numpy as np, replicate as rp
    >>> rp.nn.Upsample(2, mode="bilinear")(np.ones((1, 3, 4, 5), np.float32)).shape
    (1, 3, 8, 10)
    """

    def __init__(self, scale_factor, mode="nearest"):
        super().__init__()
        self.scale_factor, self.mode = scale_factor, mode

    def forward(self, x):
        return upsample(x, self.scale_factor, self.mode)


class Embedding(Module):
    """Look up rows of a (num_embeddings, dim) table by integer ids; the table is drawn from
    N(0, 1), as ``torch.nn.Embedding``'s. An id outside ``[0, num_embeddings)`` is an
    ``IndexError``, a negative one too (PyTorch's rule, not NumPy's index from the end)."""

    def __init__(self, num_embeddings, dim, *, rng=None, dtype=np.float32):
        super().__init__()
        self.weight = Variable(init.normal((num_embeddings, dim), std=1.0, rng=rng, dtype=dtype))

    def forward(self, ids):
        return rnp.take(self.weight.read(), ids, axis=0, nonnegative=True)  # (PyTorch's raises)


class LayerNorm(Module):
    """Normalise over the last axis, then scale and shift. ``dim``: that axis's size (an int,
    or PyTorch's ``normalized_shape`` of one entry); several trailing axes are an error, not
    the last one alone: reshape them into one first."""

    def __init__(self, dim, eps=1e-5, dtype=np.float32):
        super().__init__()
        shape = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
        if len(shape) != 1 or not isinstance(shape[0], (int, np.integer)) or shape[0] < 1:
            raise ReplicateError(
                f"LayerNorm({dim!r}): normalises over the last axis, whose size is one positive "
                "int; for several trailing axes reshape them into one (x.reshape(*lead, -1)) "
                "and use LayerNorm(their product)")
        self.eps = eps
        self.weight = Variable(np.ones(shape, dtype))
        self.bias = Variable(np.zeros(shape, dtype))

    def forward(self, x):
        x = rnp.as_array(x)
        if x.ndim < 1 or x.shape[-1] != self.weight.shape[0]:
            raise ReplicateError(f"LayerNorm({self.weight.shape[0]}) got input {x.shape}: its "
                                 "last axis is the one normalised")
        return layer_norm(x, self.weight, self.bias, self.eps)


class BatchNorm(Module):
    """Batch normalisation over the batch (and spatial) axes; channels on axis 1.

    With ``cross_replica=True`` the batch statistics are all-reduced over all replicas in the
    middle of the step, so R replicas with batch B normalise exactly as one replica with batch
    R*B (each replica's statistics weighted by its batch size: replicas whose batches differ
    normalise with the statistics of all their examples together). Otherwise each replica
    normalises with its own batch; the running averages are still averaged over replicas so
    that all replicas keep the same state.

    The batch variance is the mean squared deviation from the batch mean, never ``E[x^2] -
    E[x]^2``, which cancels in float32 for features far from zero (across replicas: each
    replica's, combined in float64 with the variance of the replicas' means, one exchange).
    The running variance averages that biased variance (Flax's choice; PyTorch's
    ``BatchNorm2d`` averages the unbiased one).
    """

    def __init__(self, num_features, momentum=0.1, eps=1e-5, cross_replica=False,
                 dtype=np.float32):
        super().__init__()
        self.momentum, self.eps, self.cross_replica = momentum, eps, cross_replica
        self.weight = Variable(np.ones(num_features, dtype))
        self.bias = Variable(np.zeros(num_features, dtype))
        self.register_buffer("running_mean", Variable(np.zeros(num_features, dtype)))
        self.register_buffer("running_var", Variable(np.ones(num_features, dtype)))

    def forward(self, x):
        x = rnp.as_array(x)
        if x.ndim < 2 or x.shape[1] != self.weight.shape[0]:
            raise ReplicateError(f"BatchNorm({self.weight.shape[0]}) got input {x.shape}")
        axes = (0,) + tuple(range(2, x.ndim))
        shape = (1, -1) + (1,) * (x.ndim - 2)
        if self.training:
            # the variance from the deviations (two passes), never E[x^2] - E[x]^2: that cancels
            # in float32 once the mean is large against the spread (at a mean of 3000 and a
            # spread of 1 the variance came out 0)
            mean = rnp.mean(x, axis=axes)
            centred = x - rnp.reshape(mean, shape)
            var = rnp.mean(centred * centred, axis=axes)
            if self.cross_replica:
                # one exchange: each replica's mean, variance and squared mean, in float64,
                # weighted by its count (replicas' batches may differ); the whole batch's
                # variance is the replicas' mean variance plus the variance of their means,
                # whose cancellation float64 makes harmless
                count = float(math.prod(x.shape[a] for a in axes))
                m, v = rnp.cast(mean, np.float64), rnp.cast(var, np.float64)
                m, v, m2, n = all_reduce((m * count, v * count, m * m * count,
                                          rnp.asarray(count, np.float64)), "sum")
                m, v, m2 = m / n, v / n, m2 / n
                mean = rnp.cast(m, mean.dtype)
                var = rnp.cast(v + rnp.maximum(m2 - m * m, 0.0), var.dtype)
                centred = x - rnp.reshape(mean, shape)
            run_mean, run_var = mean, var
            if not self.cross_replica and num_replicas() > 1:
                run_mean, run_var = all_reduce((mean, var), "mean")
            m = self.momentum
            self.running_mean.assign((1 - m) * self.running_mean.read()
                                     + m * rnp.stop_gradient(run_mean))
            self.running_var.assign((1 - m) * self.running_var.read()
                                    + m * rnp.stop_gradient(run_var))
        else:
            mean, var = self.running_mean.read(), self.running_var.read()
            centred = x - rnp.reshape(mean, shape)
        inv = rnp.rsqrt(var + self.eps) * self.weight
        return centred * rnp.reshape(inv, shape) + rnp.reshape(self.bias.read(), shape)


class Dropout(Module):
    """Zero each element with probability ``rate`` in training (keyed randomness: different on
    every replica and every step).

    ``seed=None`` (the default) gives each Dropout layer its own stream, taken from the count of
    generators created without a seed (``rnp.random.Generator``): deterministic, so the same
    program draws the same masks in every run and on every rank, and two default layers never
    draw the same masks. An integer ``seed`` gives the stream of that seed (equal seeds, equal
    masks); ``rnp.random.seed(base)`` restarts the default count."""

    def __init__(self, rate=0.5, seed=None):
        super().__init__()
        if not 0 <= rate < 1:
            raise ReplicateError(f"Dropout rate must be in [0, 1), got {rate}")
        self.rate = rate
        self.rng = rnp.random.Generator(seed, name="dropout.rng")
        self.register_buffer("rng_state", self.rng.state)

    def forward(self, x):
        x = rnp.as_array(x)
        if not self.training or self.rate == 0:
            return x
        keep = self.rng.bernoulli(1.0 - self.rate, x.shape)
        return rnp.where(keep, x / (1.0 - self.rate), 0.0)


class Flatten(Module):
    """Merge the axes ``start_dim`` to ``end_dim`` into one, as ``torch.nn.Flatten``; the
    default flattens all but the batch axis (``rp.nn.flatten``)."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return flatten(x, self.start_dim, self.end_dim)
