"""Relaxation primitives: one code path for exact (T = 0) and relaxed (T > 0) decisions.

Every discrete decision in a simulator goes through these functions. The temperature is a
traced scalar; ``T == 0`` selects the hard decision through a double ``where`` so that no
NaN gradient leaks out of the unused soft branch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "soft_ge",
    "soft_gt",
    "straight_through",
    "hard",
    "first_true_probs",
    "quantile_from_cdf",
]


def _safe(t):
    return jnp.where(t > 0, t, 1.0)


def soft_ge(x, y, t, scale=1.0, margin=0.0):
    """P(x >= y): ``sigmoid((x - y + margin) / (t * scale))`` for t > 0, else x >= y.

    For token counts pass ``margin=0.25``: a tie then relaxes to a gate that tends to 1
    as t -> 0 instead of sticking at 1/2, and the hard decision ``gate >= 1/2`` equals
    ``x >= y`` for every t whenever x - y lies on the half-token grid (integer counts, and
    the half-token bounds a tied soft quantile gives).
    """
    x, y = jnp.asarray(x), jnp.asarray(y)
    s = _safe(t) * scale
    soft = jax.nn.sigmoid((x - y + margin) / s)
    return jnp.where(t > 0, soft, (x >= y).astype(soft.dtype))


def soft_gt(x, y, t, scale=1.0, margin=0.0):
    """P(x > y): ``sigmoid((x - y - margin) / (t * scale))`` for t > 0, else x > y."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    s = _safe(t) * scale
    soft = jax.nn.sigmoid((x - y - margin) / s)
    return jnp.where(t > 0, soft, (x > y).astype(soft.dtype))


def hard(g):
    """The hard decision (``g >= 0.5``) of a soft gate, as a boolean."""
    return g >= 0.5


def straight_through(g):
    """Forward: the hard decision as 0/1; backward: the gradient of the soft gate ``g``."""
    h = hard(g).astype(g.dtype)
    return h + g - jax.lax.stop_gradient(g)


def first_true_probs(s):
    """Soft "index of the first true" over the last axis.

    ``s[..., j]`` is P(condition j holds). Returns ``[..., J + 1]``: entry j is
    ``s_j * prod_{i<j}(1 - s_i)``, the last entry the mass where none holds. With 0/1
    inputs this is exactly the one-hot of the first true index (or "none").
    """
    one = jnp.ones_like(s[..., :1])
    survive = jnp.cumprod(jnp.concatenate([one, 1.0 - s], axis=-1), axis=-1)
    return jnp.concatenate([s, one], axis=-1) * survive


def quantile_from_cdf(cdf, p, t):
    """Inverse CDF ``min{x : F(x) >= p}`` of an integer variable from its CDF ``[X]``.

    Exact at t = 0 (counts the x with F(x) < p); for t > 0 each indicator becomes a
    sigmoid in ``p`` (scale: probability), so the bound is smooth in the level ``p``.
    ``p`` may have leading axes; the result has p's shape. (A level exactly on the CDF,
    F(x) == p, relaxes to 1/2: half a token of bias, only for such ties.)
    """
    p = jnp.asarray(p)
    below = soft_gt(p[..., None], cdf, t)  # F(x) < p
    return jnp.sum(below, axis=-1)
