"""Drivers for the bucketed server: initial state, scanned runs, metrics.

``run_blocks`` is the pure, jittable core (a scan of ``refresh_check``-iteration blocks);
``simulate`` runs a fixed number of iterations (for gradients and sweeps);
``simulate_until_done`` runs exact-mode chunks until every request is accounted for.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from models import relax
from models.bucketed import (KINDS, PROB_SCALE, Record, SimState, Window, absorb, refresh,
                             step)
from models.server import ServerConfig, hist_quantile, init_acc, init_slots
from models.workload import Workload

__all__ = ["SimOptions", "init_state", "run_blocks", "simulate", "simulate_until_done",
           "metrics", "prior_from_predictions"]


class SimOptions:
    """Static options of a run (shapes and loop structure; changing one recompiles).

    ``latency_hist=False`` skips the TTFT/TPOT histograms (their p50/p99 metrics become
    NaN; the SLO-attainment counters stay), which sweeps that need no percentiles save.
    """

    def __init__(self, kind, *, window=10000, refresh_every=1000, refresh_check=16,
                 record=False, latency_hist=True):
        if kind not in KINDS:
            raise ValueError(f"unknown bucketed system {kind!r}; known: {', '.join(KINDS)}")
        if window < 1 or refresh_every < 1 or refresh_check < 1:
            raise ValueError("window, refresh_every and refresh_check must be >= 1")
        self.kind, self.window, self.refresh_every = kind, window, refresh_every
        self.refresh_check, self.record = refresh_check, record
        self.latency_hist = bool(latency_hist)

    def _key(self):
        return (self.kind, self.window, self.refresh_every, self.refresh_check, self.record,
                self.latency_hist)

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, SimOptions) and self._key() == other._key()


def prior_from_predictions(wl: Workload, window: int, max_len: int) -> np.ndarray:
    """Default window prior: the valid requests' rounded predictions, tiled to ``window``."""
    pred = np.asarray(wl.pred_tokens)[np.asarray(wl.valid)]
    sample = np.clip(np.round(pred[:window]), 1, max_len).astype(np.int32)
    return np.resize(sample, window)


def init_state(wl: Workload, cfg: ServerConfig, params, t, opts: SimOptions,
               prior=None) -> SimState:
    n_bounds = int(np.shape(params.get("levels", params.get("bounds", [0.0])))[0])
    if opts.kind == "odma":
        ring = jnp.asarray(prior if prior is not None
                           else prior_from_predictions(wl, opts.window, cfg.max_len))
        if ring.shape != (opts.window,):
            raise ValueError(f"prior must have shape ({opts.window},), got {ring.shape}")
        ring = jnp.clip(ring.astype(jnp.int32), 0, cfg.max_len)
        hist = jnp.zeros(cfg.max_len + 1, jnp.float32).at[ring].add(1.0)
        cdf = jnp.cumsum(hist) / jnp.sum(hist)
        bounds = relax.quantile_from_cdf(cdf, params["levels"], t * PROB_SCALE)
    else:
        ring = jnp.zeros(1, jnp.int32)
        hist = jnp.zeros(1, jnp.float32)
        bounds = jnp.asarray(params.get("bounds", jnp.zeros(n_bounds)), jnp.float32)
    win = Window(bounds=bounds, ring=ring, ptr=jnp.int32(0), hist=hist, since=jnp.int32(0))
    rec = None
    if opts.record:
        n = wl.size
        rec = Record(admit_iter=jnp.full(n, -1, jnp.int32),
                     finish_iter=jnp.full(n, -1, jnp.int32),
                     first_s=jnp.full(n, jnp.nan, jnp.float32),
                     finish_s=jnp.full(n, jnp.nan, jnp.float32),
                     reserved=jnp.zeros(n, jnp.float32), r_admit=jnp.zeros(n, jnp.float32))
    return SimState(slots=init_slots(cfg.n_slots), head=jnp.int32(0),
                    clock=jnp.float32(0.0), it=jnp.int32(0), win=win, acc=init_acc(),
                    rec=rec)


def run_blocks(state, wl, cfg, hw, params, t, opts: SimOptions, n_blocks: int):
    """Run ``n_blocks * refresh_check`` iterations; returns (state, used tokens per iter)."""
    t = jnp.asarray(t, jnp.float32)

    def inner(s, _):
        return step(s, wl, cfg, hw, params, t, opts.kind)

    def block(s, _):
        s, (used, fin) = jax.lax.scan(inner, s, None, length=opts.refresh_check)
        s = absorb(s, fin, opts.kind, latency=opts.latency_hist)
        if opts.kind == "odma":
            s = s.replace(win=refresh(s.win, params, t, opts.refresh_every))
        return s, used

    state, used = jax.lax.scan(block, state, None, length=n_blocks)
    return state, used.reshape(-1)


def simulate(wl, cfg, hw, params, t, opts: SimOptions, n_steps: int, prior=None):
    """Fixed-length run from the initial state: ``(final state, used tokens per iter)``."""
    n_blocks = -(-n_steps // opts.refresh_check)
    state = init_state(wl, cfg, params, t, opts, prior)
    return run_blocks(state, wl, cfg, hw, params, t, opts, n_blocks)


@partial(jax.jit, static_argnames=("opts", "n_blocks", "exact"))
def _chunk(state, wl, cfg, hw, params, t, opts, n_blocks, exact=False):
    # exact: T = 0 as a constant, so XLA drops every relaxed branch (same results)
    t = 0.0 if exact else t
    state, used = run_blocks(state, wl, cfg, hw, params, t, opts, n_blocks)
    return state, jnp.max(used)


def simulate_until_done(wl, cfg, hw, params, opts: SimOptions, *, t=0.0, prior=None,
                        max_steps=2_000_000, chunk_blocks=64):
    """Exact-mode evaluation: run chunks until every valid request finished or dropped."""
    n_valid = int(np.sum(np.asarray(wl.valid)))
    state = init_state(wl, cfg, params, jnp.float32(t), opts, prior)
    exact = float(t) == 0.0
    steps = 0
    while steps < max_steps:
        state, _ = _chunk(state, wl, cfg, hw, params, jnp.float32(t), opts, chunk_blocks,
                          exact)
        steps += chunk_blocks * opts.refresh_check
        if int(state.head) >= n_valid and not bool(jnp.any(state.slots.status > 0)):
            break
    return state


def metrics(state: SimState, wl: Workload, cfg: ServerConfig) -> dict:
    """Metrics of a finished (or truncated) run, as float32 scalars (differentiable)."""
    acc = state.acc
    n_valid = jnp.sum(wl.valid)
    first = wl.arrival_s[0]
    span = jnp.maximum(state.clock - first, 1e-9)
    done = jnp.maximum(acc.completed, 1e-9)
    out = {
        "kv_utilization": acc.actual_kv / jnp.maximum(acc.reserved_kv, 1e-9),
        "tps": acc.tokens / span,
        "requests_per_s": acc.completed / span,
        "migrations": acc.migrations,
        "overflows": acc.overflows,
        # share of requests whose realised length outgrows the bucket they were given
        # (each must migrate or be preempted): the papers' "migration rate". Smooth in
        # relaxed mode (a soft indicator per admission), exact at T = 0.
        "migration_rate": acc.overflows / done,
        "preemptions": acc.preemptions,
        "stalls": acc.stalls,
        "dropped": acc.dropped,
        "unserved": n_valid - acc.completed,
        "completed": acc.completed,
        "accuracy": acc.fit / done,
        "peak_kv_tokens": acc.peak_kv,
        "peak_kv_share": acc.peak_kv / cfg.capacity_tokens,
        "max_pool_use": acc.max_use,
        "queue_delay_mean_s": acc.queue_s / done,
        "ttft_slo_attainment": acc.ttft_ok / jnp.maximum(n_valid, 1),
        "tpot_slo_attainment": acc.tpot_ok / jnp.maximum(n_valid, 1),
        "makespan_s": span,
        "iterations": acc.iters,
    }
    if state.rec is not None:
        rec = state.rec
        fin = rec.finish_iter >= 0
        arr = wl.arrival_s
        ttft = jnp.where(fin, rec.first_s - arr, jnp.nan)
        tpot = jnp.where(fin & (wl.output_tokens > 1),
                         (rec.finish_s - rec.first_s) / jnp.maximum(wl.output_tokens - 1, 1),
                         jnp.nan)
        for name, v in (("ttft", ttft), ("tpot", tpot)):
            out[f"{name}_p50_s"] = jnp.nanpercentile(v, 50.0)
            out[f"{name}_p99_s"] = jnp.nanpercentile(v, 99.0)
    else:
        out["ttft_p50_s"] = hist_quantile(acc.ttft_hist, 0.5)
        out["ttft_p99_s"] = hist_quantile(acc.ttft_hist, 0.99)
        out["tpot_p50_s"] = hist_quantile(acc.tpot_hist, 0.5)
        out["tpot_p99_s"] = hist_quantile(acc.tpot_hist, 0.99)
    return out
