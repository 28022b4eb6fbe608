"""ODMA's sliding window (docs/server-semantics.md step 7): the prior that fills it, the
completion sink that enters realised lengths in FIFO order, and the refresh of bucket
bounds as window quantiles."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from models import relax
from models.bucketed.state import PROB_SCALE, Window
from models.family import Sink
from models.server import prefix_sum

__all__ = ["init_window", "prior", "refresh", "ring_sink"]


def prior(wl, window: int, max_len: int, history=None) -> np.ndarray:
    """The window's initial contents: the last ``window`` realised lengths of
    ``history`` (the requests before the workload), tiled to ``window``; without a
    history the valid requests' rounded predictions."""
    if history is not None and len(history):
        h = np.minimum(np.asarray(history)[-window:], max_len)
        return np.resize(h, window).astype(np.int32)
    pred = np.asarray(wl.pred_tokens)[np.asarray(wl.valid)]
    sample = np.clip(np.round(pred[:window]), 1, max_len).astype(np.int32)
    return np.resize(sample, window)


def init_window(ring, params, t, cfg, adaptive: bool, n_bounds: int) -> Window:
    """Ring and bounds at the start: quantiles of the prior ``ring`` (adaptive), else
    the fixed ``bounds`` parameter (zeros if the system has none)."""
    if adaptive:
        ring = jnp.clip(jnp.asarray(ring).astype(jnp.int32), 0, cfg.max_len)
        hist = jnp.zeros(cfg.max_len + 1, jnp.float32).at[ring].add(1.0)
        cdf = jnp.cumsum(hist) / jnp.sum(hist)
        bounds = relax.quantile_from_cdf(cdf, params["levels"], t * PROB_SCALE)
    else:
        ring = jnp.zeros(1, jnp.int32)
        hist = jnp.zeros(1, jnp.float32)
        bounds = jnp.asarray(params.get("bounds", jnp.zeros(n_bounds)), jnp.float32)
    return Window(bounds=bounds, ring=ring, ptr=jnp.int32(0), hist=hist, since=jnp.int32(0))


def _get(st):
    return st.win.ring, st.win.hist, st.win.ptr


def _add(carry, fin, r, s, ok, j):
    ring, whist, ptr = carry
    w = ring.shape[0]
    ones = jnp.where(ok, 1.0, 0.0)
    lengths = jnp.where(ok, fin.length[r, s], 0)
    rpos = jnp.where(ok, (ptr + j) % w, w)
    old = ring[jnp.minimum(rpos, w - 1)]
    whist = whist.at[jnp.where(ok, old, 0)].add(-ones).at[lengths].add(ones)
    ring = ring.at[rpos].set(lengths, mode="drop")
    return ring, whist, (ptr + jnp.sum(ok)) % w


def _put(st, carry, m):
    ring, whist, ptr = carry
    return st.replace(win=st.win.replace(ring=ring, hist=whist, ptr=ptr,
                                         since=st.win.since + m))


# ring positions within one chunk must stay distinct: chunks of at most the ring's size
ring_sink = Sink(get=_get, add=_add, put=_put, max_chunk=lambda st: st.win.ring.shape[0])


def refresh(win: Window, params, t, refresh_every):
    """Recompute bounds as window quantiles if enough completions arrived (step 7)."""
    cdf = prefix_sum(win.hist) / jnp.sum(win.hist)
    fresh = relax.quantile_from_cdf(cdf, params["levels"], t * PROB_SCALE)
    due = win.since >= refresh_every
    return win.replace(bounds=jnp.where(due, fresh, win.bounds),
                       since=jnp.where(due, 0, win.since))
