"""Normalisation with `torch.nn.functional` names and semantics (NCHW, torch argument order).

torch's `batch_norm` updates `running_mean` / `running_var` in place when training; tgx is
functional, so `batch_norm` returns only the normalised tensor (like torch's return value) and
`batch_norm_with_stats` returns `(y, new_running_mean, new_running_var)`.

>>> import numpy as np, tgx.nn as tnn
>>> tnn.layer_norm(np.array([[1.0, 3.0]], np.float32), 2).round(3)
array([[-1.,  1.]], dtype=float32)
"""

from __future__ import annotations

from .. import numpy as tnp
from ..errors import Unsupported
from ..primitives import norms as Nm
from ..primitives.ops import _as_operand, _aval, _float_args
from ..shapes import as_dim, bfloat16, finfo, float16, float32

__all__ = ["layer_norm", "rms_norm", "batch_norm", "batch_norm_with_stats", "group_norm"]


def _like(p, x):
    """An optional parameter array in the input's dtype."""
    return None if p is None else _as_operand(tnp.astype(p, _aval(x).dtype))


def _as_float(x):
    (x,) = _float_args(x)
    return _as_operand(x)


def _norm_shape(normalized_shape) -> tuple:
    if isinstance(normalized_shape, (int, str)):
        normalized_shape = (normalized_shape,)
    return tuple(as_dim(d) for d in normalized_shape)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the trailing `normalized_shape` dims (biased variance), then
    `* weight + bias`."""
    x = _as_float(input)
    w, b = _like(weight, x), _like(bias, x)
    args = (x,) + tuple(a for a in (w, b) if a is not None)
    return Nm.layer_norm_p.bind(*args, normalized_shape=_norm_shape(normalized_shape),
                                eps=float(eps), has_weight=w is not None, has_bias=b is not None)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """`x / sqrt(mean(x**2) + eps) * weight` over the trailing dims. `eps=None` is the machine
    epsilon of the computation dtype (float32 for half inputs), as in torch."""
    x = _as_float(input)
    w = _like(weight, x)
    if eps is None:
        dt = _aval(x).dtype
        eps = float(finfo(float32 if dt in (float16, bfloat16) else dt).eps)
    args = (x,) + ((w,) if w is not None else ())
    return Nm.rms_norm_p.bind(*args, normalized_shape=_norm_shape(normalized_shape),
                              eps=float(eps), has_weight=w is not None)


def batch_norm_with_stats(input, running_mean, running_var, weight=None, bias=None,
                          training=False, momentum=0.1, eps=1e-5):
    """`(y, new_running_mean, new_running_var)`. Training normalises with the batch's biased
    variance over (N, *spatial) and moves the running stats by `momentum` towards the batch
    mean and *unbiased* variance; inference uses the running stats and returns them unchanged.
    """
    x = _as_float(input)
    w, b = _like(weight, x), _like(bias, x)
    has_running = running_mean is not None and running_var is not None
    running = (_as_operand(running_mean), _as_operand(running_var)) if has_running \
        else ()
    if momentum is None:
        raise Unsupported("batch_norm: momentum=None (cumulative average) needs a batch "
                          "counter; pass a float")
    args = (x,) + running + tuple(a for a in (w, b) if a is not None)
    outs = Nm.batch_norm_p.bind(*args, training=bool(training), momentum=float(momentum),
                                eps=float(eps), has_running=has_running,
                                has_weight=w is not None, has_bias=b is not None)
    if len(outs) == 3:
        return tuple(outs)
    return outs[0], running_mean, running_var


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Batch normalisation over channel axis 1; returns the normalised tensor only (see
    `batch_norm_with_stats` for the updated running statistics)."""
    return batch_norm_with_stats(input, running_mean, running_var, weight, bias, training,
                                 momentum, eps)[0]


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Normalise each of `num_groups` channel groups over (C / num_groups, *spatial), then a
    per-channel affine."""
    x = _as_float(input)
    w, b = _like(weight, x), _like(bias, x)
    args = (x,) + tuple(a for a in (w, b) if a is not None)
    return Nm.group_norm_p.bind(*args, num_groups=int(num_groups), eps=float(eps),
                                has_weight=w is not None, has_bias=b is not None)
