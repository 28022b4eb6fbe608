"""The one table of parameter domains: what values are legal, how a gradient tuner maps an
unconstrained ``z`` to them and back, and how a random search samples them.

A :class:`ParamSpec` names its domain by key; ``registry.validate_params``,
``tuner.objective.space.Space`` and ``tuner.sweep.random_points`` all read :data:`DOMAINS`, so a new
domain is one entry here. Transforms are pure ``jax.numpy`` (jittable, differentiable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Domain", "DOMAINS", "get_domain"]


def _logit(x):
    return jnp.log(x) - jnp.log1p(-x)


def _inv_softplus(y):
    """``z`` with ``softplus(z) = y`` (y > 0), as ``y + log(1 - exp(-y))``: the plain
    ``log(expm1(y))`` overflows float32 above y = 88 (a bucket bound of 200 tokens
    came back as inf)."""
    return y + jnp.log(-jnp.expm1(-y))


@dataclass(frozen=True)
class Domain:
    """One kind of parameter value.

    ``check(v, p)`` returns an error phrase (``"must lie in (0, 1)"``) or None for a
    float32 array ``v`` of the parameter ``p``; ``fwd(z, p)`` / ``inv(x, p)`` are the
    gradient tuner's transforms (None: not tunable by gradient); ``sample(rng, p, v0,
    max_len)`` draws a value of the default's shape for a random search. ``ordered``
    domains are vectors whose length may differ from the default's.
    """

    name: str
    check: Callable
    sample: Callable
    fwd: Callable | None = None
    inv: Callable | None = None
    ordered: bool = False


def _increasing(v):
    return v.size > 1 and bool(np.any(np.diff(v) <= 0))


def _check_unit(v, p):
    return "must lie in (0, 1)" if np.any((v <= 0) | (v >= 1)) else None


def _check_positive(v, p):
    return "must be > 0" if np.any(v <= 0) else None


def _check_interval(v, p):
    return (f"must lie in [{p.lower}, {p.upper}]" if np.any((v < p.lower) | (v > p.upper))
            else None)


def _check_ordered(inner):
    def check(v, p):
        msg = inner(v, p)
        if msg is None and _increasing(v):
            msg = "must be strictly increasing"
        return msg
    return check


def _check_integer(v, p):
    if np.any(v <= 0):
        return "must be > 0"
    return "must be an integer" if np.any(v != np.round(v)) else None


def _check_int_range(v, p):
    if np.any(v != np.round(v)):
        return "must be an integer"
    return (f"must lie in [{p.lower:g}, {p.upper:g}]"
            if np.any((v < p.lower) | (v > p.upper)) else None)


def _int_log_fwd(z, p):
    """An integer in [lower, upper], log-scaled: ``round(lower * (upper / lower) **
    sigmoid(z))``, the rounding straight-through (exact runs see integers)."""
    x = p.lower * (p.upper / p.lower) ** jax.nn.sigmoid(z)
    return x + jax.lax.stop_gradient(jnp.round(x) - x)


def _int_log_inv(x, p):
    s = jnp.log(x / p.lower) / math.log(p.upper / p.lower)
    return _logit(jnp.clip(s, 1e-4, 1 - 1e-4))


def _int_log_sample(rng, p, v0, max_len):
    v = np.exp(rng.uniform(math.log(p.lower), math.log(p.upper), np.shape(v0)))
    return np.clip(np.round(v), p.lower, p.upper)


def _near_default(rng, v0, integer=False):
    """Within a factor of two of the default (log-uniform)."""
    v = v0 * np.exp(rng.uniform(-math.log(2), math.log(2), np.shape(v0)))
    return np.maximum(np.round(v), 1) if integer else v


def _uniform(lo, hi, ordered=False):
    def sample(rng, p, v0, max_len):
        lo_, hi_ = (lo(p, max_len), hi(p, max_len))
        v = rng.uniform(lo_, hi_, np.shape(v0))
        return np.sort(v) if ordered else v
    return sample


def _ordered_unit_fwd(z, p):  # increments of a softmax over K+1 logits
    inc = jax.nn.softmax(jnp.concatenate([z, jnp.zeros(1, z.dtype)]))
    return jnp.cumsum(inc)[:-1]


def _ordered_unit_inv(x, p):
    logits = jnp.log(jnp.diff(jnp.concatenate([jnp.zeros(1), x, jnp.ones(1)])))
    return logits[:-1] - logits[-1]


def _interval_inv(x, p):
    return _logit(jnp.clip((x - p.lower) / (p.upper - p.lower), 1e-4, 1 - 1e-4))


DOMAINS: dict[str, Domain] = {d.name: d for d in (
    Domain("ordered_unit", _check_ordered(_check_unit),
           _uniform(lambda p, m: 0.05, lambda p, m: 0.999, ordered=True),
           _ordered_unit_fwd, _ordered_unit_inv, ordered=True),
    Domain("ordered_positive", _check_ordered(_check_positive),
           _uniform(lambda p, m: 1.0, lambda p, m: float(m), ordered=True),
           lambda z, p: jnp.cumsum(jax.nn.softplus(z)),
           lambda x, p: _inv_softplus(jnp.diff(jnp.concatenate([jnp.zeros(1), x]))),
           ordered=True),
    Domain("unit", _check_unit, _uniform(lambda p, m: 0.001, lambda p, m: 0.999),
           lambda z, p: jax.nn.sigmoid(z), lambda x, p: _logit(x)),
    Domain("interval", _check_interval,
           _uniform(lambda p, m: p.lower, lambda p, m: p.upper),
           lambda z, p: p.lower + (p.upper - p.lower) * jax.nn.sigmoid(z), _interval_inv),
    Domain("positive", _check_positive,
           lambda rng, p, v0, max_len: _near_default(rng, v0),
           lambda z, p: jax.nn.softplus(z), lambda x, p: _inv_softplus(x)),
    # a positive scale tuned in log space (sizes spanning orders of magnitude)
    Domain("log_positive", _check_positive,
           lambda rng, p, v0, max_len: _near_default(rng, v0),
           lambda z, p: jnp.exp(z), lambda x, p: jnp.log(x)),
    Domain("integer", _check_integer,
           lambda rng, p, v0, max_len: _near_default(rng, v0, integer=True)),
    # an integer setting spanning orders of magnitude (an engine's batch limits)
    Domain("int_log", _check_int_range, _int_log_sample, _int_log_fwd, _int_log_inv),
)}


def get_domain(name: str) -> Domain:
    if name not in DOMAINS:
        raise ValueError(f"unknown parameter domain {name!r}; known: {', '.join(DOMAINS)}")
    return DOMAINS[name]
