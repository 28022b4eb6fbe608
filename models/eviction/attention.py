"""The attention model of the priced-eviction family (``docs/tokenpd-semantics.md``):
token classes from a Pareto heavy-hitter weight, the predictor's confusion matrix and
posterior moments, and the per-token class hash (NumPy on the host, JAX in the step).

Everything here is host-side model data except :func:`token_groups`, the traced hash.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

__all__ = ["AttentionTables", "QUANTILES", "attention_tables", "pareto_alpha",
           "token_groups", "token_groups_np"]

QUANTILES = (0.8, 0.95, 0.99)  # class boundaries (quantiles of h): K = 4 classes
_GOLD, _MIX, _SEED2 = 0x9E3779B1, 0x85EBCA77, 0x68E31DA4


@dataclass(frozen=True)
class AttentionTables:
    """Host-side tables (NumPy float32) of one attention model."""

    alpha: float         # Pareto shape of the heavy-hitter weight h
    p: np.ndarray        # [K] class probabilities
    h: np.ndarray        # [K] mean h within each class
    cum_p: np.ndarray    # [K-1] float32 cumulative class probabilities (the hash's cuts)
    conf: np.ndarray     # [K, K] P(k_hat | k)
    cum_conf: np.ndarray  # [K, K-1] float32 cumulative rows
    m: np.ndarray        # [K] E[h | k_hat]
    v: np.ndarray        # [K] Var[h | k_hat]


def pareto_alpha(recency: float, retained: float, top: float = 0.1) -> float:
    """Shape alpha of a Pareto whose top ``top`` share of tokens holds the heavy-hitter
    mass that makes ``recency + (1 - recency) * top ** (1 - 1/alpha) = retained``."""
    share = (retained - recency) / (1.0 - recency)
    if not 0.0 < share < 1.0 or not 0.0 < top < 1.0:
        raise ValueError(f"attention model: retained={retained} with recency={recency} "
                         "leaves no heavy-hitter share in (0, 1)")
    if share <= top:
        raise ValueError(f"attention model: retained={retained} needs the top {top:.0%} of "
                         "tokens to hold less than their count share (no heavy hitters)")
    return 1.0 / (1.0 - math.log(share) / math.log(top))


def _class_mean(alpha, q1, q2):
    """Mean of a Pareto(x_min = 1, alpha) between its quantiles q1 < q2."""
    e = 1.0 - 1.0 / alpha
    return ((1.0 - q1) ** e - (1.0 - q2) ** e) / (e * (q2 - q1))


def attention_tables(recency: float = 0.3, retained: float = 0.9,
                     predictor_sigma: float = 1.0, n_u: int = 4000,
                     n_eps: int = 64) -> AttentionTables:
    """Class probabilities and means, the predictor's confusion matrix (deterministic
    quadrature: ``n_u`` quantile midpoints of the Pareto within each class times
    ``n_eps`` Gauss-Hermite nodes of the log-normal noise) and the posterior mean and
    variance of the class weight ``h_k`` given the predicted class. (Moments of the
    continuous h would not do: a Pareto with alpha < 2 has no variance.)"""
    if not predictor_sigma >= 0:
        raise ValueError(f"attention model: predictor_sigma must be >= 0, got "
                         f"{predictor_sigma}")
    alpha = pareto_alpha(recency, retained)
    q = np.array((0.0,) + QUANTILES + (1.0,))
    p = np.diff(q)
    h = np.array([_class_mean(alpha, q[i], q[i + 1]) for i in range(len(p))])
    cuts = (1.0 - np.array(QUANTILES)) ** (-1.0 / alpha)  # h thresholds between classes
    n_k = len(p)
    conf = np.zeros((n_k, n_k))
    x, w = np.polynomial.hermite_e.hermegauss(n_eps)  # probabilists' Hermite
    w = w / w.sum()
    for k in range(n_k):
        u = q[k] + (np.arange(n_u) + 0.5) / n_u * (q[k + 1] - q[k])
        hv = (1.0 - u) ** (-1.0 / alpha)                       # [n_u]
        hat = hv[:, None] * np.exp(predictor_sigma * x[None, :])  # [n_u, n_eps]
        kh = np.searchsorted(cuts, hat, side="right")
        for j in range(n_k):
            conf[k, j] = np.sum(np.where(kh == j, w[None, :], 0.0)) / n_u
    # posterior moments over the class weights a token actually carries (the model's h_k)
    joint = p[:, None] * conf                                  # P(k, k_hat)
    post = joint / np.maximum(joint.sum(0, keepdims=True), 1e-30)
    m = post.T @ h
    v = np.maximum(post.T @ (h * h) - m * m, 0.0)
    f32 = np.float32
    return AttentionTables(alpha=alpha, p=p.astype(f32), h=h.astype(f32),
                           cum_p=np.cumsum(p)[:-1].astype(f32), conf=conf.astype(f32),
                           cum_conf=np.cumsum(conf, 1)[:, :-1].astype(f32),
                           m=m.astype(f32), v=v.astype(f32))


def _fmix32_np(h):
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def token_groups_np(req, pos, cum_p, cum_conf) -> np.ndarray:
    """Group ``k * K + k_hat`` of tokens at positions ``pos`` of requests ``req``
    (NumPy, broadcasting; the host-side twin of :func:`token_groups`)."""
    with np.errstate(over="ignore"):
        x = (np.asarray(req).astype(np.uint32) * np.uint32(_GOLD)
             + np.asarray(pos).astype(np.uint32) * np.uint32(_MIX))
        u1 = (_fmix32_np(x) >> np.uint32(8)).astype(np.float32) / np.float32(2 ** 24)
        u2 = (_fmix32_np(x ^ np.uint32(_SEED2)) >> np.uint32(8)).astype(
            np.float32) / np.float32(2 ** 24)
    cum_p, cum_conf = np.asarray(cum_p, np.float32), np.asarray(cum_conf, np.float32)
    k = np.sum(u1[..., None] >= cum_p, -1)
    kh = np.sum(u2[..., None] >= cum_conf[k], -1)
    return (k * (len(cum_p) + 1) + kh).astype(np.int32)


def _fmix32(h):
    h = h ^ (h >> jnp.uint32(16))
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> jnp.uint32(13))
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> jnp.uint32(16))


def token_groups(req, pos, cum_p, cum_conf):
    """:func:`token_groups_np` traced (uint32 arithmetic wraps identically)."""
    x = (jnp.asarray(req).astype(jnp.uint32) * jnp.uint32(_GOLD)
         + jnp.asarray(pos).astype(jnp.uint32) * jnp.uint32(_MIX))
    u1 = (_fmix32(x) >> jnp.uint32(8)).astype(jnp.float32) / jnp.float32(2 ** 24)
    u2 = (_fmix32(x ^ jnp.uint32(_SEED2)) >> jnp.uint32(8)).astype(
        jnp.float32) / jnp.float32(2 ** 24)
    k = jnp.sum(u1[..., None] >= cum_p, -1)
    kh = jnp.sum(u2[..., None] >= cum_conf[k], -1)
    return (k * (cum_p.shape[-1] + 1) + kh).astype(jnp.int32)
