"""Loss functions with `torch.nn.functional` names, argument order and semantics.

Each binds one composite primitive of `tgx.primitives.losses`. The deprecated torch arguments
`size_average` and `reduce` are accepted in their positions but must be None.

>>> import numpy as np, tgx.nn as tnn
>>> x = np.array([[2.0, 0.0, -1.0]], np.float32)
>>> round(float(tnn.cross_entropy(x, np.array([0]))), 4)
0.1698
"""

from __future__ import annotations

from ..errors import OptionError, Unsupported
from ..primitives import losses as L
from ..primitives.ops import _as_operand, _aval, _float_args
from ..shapes import is_float

__all__ = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "kl_div",
           "binary_cross_entropy", "binary_cross_entropy_with_logits"]


def _no_legacy(op, size_average, reduce):
    if size_average is not None or reduce is not None:
        raise Unsupported(f"{op}: size_average/reduce are deprecated; use reduction=")


def _floats(*xs):
    """Promote to one floating dtype (None entries stay None)."""
    present = [x for x in xs if x is not None]
    cast = iter(_float_args(*present))
    return [None if x is None else _as_operand(next(cast)) for x in xs]


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                  reduce=None, reduction="mean", label_smoothing=0.0):
    """Cross-entropy between logits `input` (C), (N, C) or (N, C, d1, ...) and a target of class
    indices (integers, shape without the class axis) or class probabilities (floats, the shape
    of `input`). `ignore_index` targets add nothing and are left out of the mean's divisor
    (the sum of the targets' class weights); when every target is ignored the mean is NaN, as in
    torch. `label_smoothing` mixes the target with the uniform distribution.

    >>> import numpy as np
    >>> round(float(cross_entropy(np.zeros((2, 4), np.float32), np.array([1, -100]))), 4)
    1.3863
    """
    _no_legacy("cross_entropy", size_average, reduce)
    probs = is_float(_aval(target).dtype)
    if probs:
        input, target, weight = _floats(input, target, weight)
    else:
        input, weight = _floats(input, weight)
        target = _as_operand(target)
    args = (input, target) + ((weight,) if weight is not None else ())
    return L.cross_entropy_p.bind(*args, has_weight=weight is not None,
                                  ignore_index=int(ignore_index), reduction=reduction,
                                  label_smoothing=float(label_smoothing), probs=bool(probs))


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """Negative log-likelihood of log-probabilities `input` at class-index `target`; the mean
    divides by the summed class weights of the non-ignored targets (NaN if all are ignored)."""
    _no_legacy("nll_loss", size_average, reduce)
    input, weight = _floats(input, weight)
    args = (input, _as_operand(target)) + ((weight,) if weight is not None else ())
    return L.nll_loss_p.bind(*args, has_weight=weight is not None,
                             ignore_index=int(ignore_index), reduction=reduction)


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """Mean squared error `(input - target)**2`, reduced."""
    _no_legacy("mse_loss", size_average, reduce)
    return L.mse_loss_p.bind(*_floats(input, target), reduction=reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """Mean absolute error `|input - target|`, reduced."""
    _no_legacy("l1_loss", size_average, reduce)
    return L.l1_loss_p.bind(*_floats(input, target), reduction=reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """Huber-like loss: `0.5 d**2 / beta` where `|d| < beta`, else `|d| - 0.5 beta`."""
    _no_legacy("smooth_l1_loss", size_average, reduce)
    if beta < 0:
        raise OptionError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
    return L.smooth_l1_loss_p.bind(*_floats(input, target), reduction=reduction,
                                   beta=float(beta))


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """KL divergence with `input` in log space: `target * (log(target) - input)` (0 where the
    target is 0), or `exp(target) * (target - input)` when `log_target`. Reductions: none,
    sum, mean (over every element, torch's default) and batchmean (sum / batch size)."""
    _no_legacy("kl_div", size_average, reduce)
    return L.kl_div_p.bind(*_floats(input, target), reduction=reduction,
                           log_target=bool(log_target))


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """BCE of probabilities `input`; each log is clamped at -100 as in torch."""
    _no_legacy("binary_cross_entropy", size_average, reduce)
    input, target, weight = _floats(input, target, weight)
    args = (input, target) + ((weight,) if weight is not None else ())
    return L.binary_cross_entropy_p.bind(*args, reduction=reduction,
                                         has_weight=weight is not None)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    """BCE of logits, computed stably: `(1 - t) x + (1 + (pos_weight - 1) t) softplus(-x)`;
    `pos_weight` broadcasts along the last (class) axis."""
    _no_legacy("binary_cross_entropy_with_logits", size_average, reduce)
    input, target, weight, pos_weight = _floats(input, target, weight, pos_weight)
    args = (input, target) + tuple(a for a in (weight, pos_weight) if a is not None)
    return L.binary_cross_entropy_with_logits_p.bind(
        *args, reduction=reduction, has_weight=weight is not None,
        has_pos_weight=pos_weight is not None)
