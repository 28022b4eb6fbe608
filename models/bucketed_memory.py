"""Pools and reservations of the bucketed server (``models.bucketed``).

The per-system reservation rules (``pool_sizes``, ``reserve``, ``need_resume``) and the
two phases of an iteration that settle running and preempted slots before admissions:
``overflow`` (docs/server-semantics.md step 2: grow, migrate, stall or preempt) and
``resume`` (step 3a: re-admit preempted slots). Each phase takes the slot table and
returns it updated, with what later phases need in a NamedTuple.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from models import relax
from models.bucketed_state import PREEMPTING, PROB_SCALE
from models.server import Acc, ServerConfig, Slots, nth_true, prefix_fit

__all__ = [
    "Overflow",
    "Resume",
    "need_resume",
    "overflow",
    "pool_sizes",
    "pool_use",
    "reserve",
    "resume",
]


def pool_sizes(cfg, params, kind):
    """``(normal, large)`` pool sizes in tokens; only ``odma`` has a large pool."""
    cap = cfg.capacity_tokens
    if kind == "odma":
        raw = params["large_share"] * cap
        large = raw - jax.lax.stop_gradient(raw - jnp.floor(raw))  # floor, slope 1
        return cap - large, large
    return cap, jnp.zeros_like(cap)


def pool_use(held_mask, reserved, large):
    """``(normal, large)`` tokens held by the slots in ``held_mask``."""
    held = jnp.where(held_mask, reserved, 0.0)
    used_l = jnp.sum(held * large)
    used_n = jnp.sum(held) - used_l
    return used_n, used_l


def reserve(kind, params, bounds, prompt, pred, u, t, cfg):
    """Output-token reservation ``r`` and large-pool weight for requests at admission."""
    max_len = jnp.float32(cfg.max_len)
    if kind == "static":
        return jnp.full(pred.shape, max_len), jnp.zeros(pred.shape)
    if kind == "paged":
        k = params["block_size"]
        return jnp.ceil((prompt + 1) / k) * k - prompt, jnp.zeros(pred.shape)
    est = pred if kind == "s3" else pred * (1.0 + params["gamma"] * u)
    fits = relax.soft_ge(bounds[None, :], est[:, None], t, cfg.token_scale)
    probs = relax.first_true_probs(fits)  # [A, B]: bucket j, last = none fits
    r_bucket = jnp.sum(probs[:, :-1] * bounds[None, :], -1) + probs[:, -1] * max_len
    if kind == "s3":
        return r_bucket, jnp.zeros(pred.shape)
    route = relax.soft_gt(u, params["tau"], t, PROB_SCALE)
    r = (1.0 - route) * r_bucket + route * max_len
    return r, route + (1.0 - route) * probs[:, -1]


def need_resume(kind, params, ctx, prompt, cfg):
    """KV tokens a preempted slot reserves when it resumes."""
    if kind == "paged":
        k = params["block_size"]
        return jnp.ceil((ctx + 1) / k) * k
    return (prompt + cfg.max_len).astype(jnp.float32)


class Overflow(NamedTuple):
    """What step 2 decided, besides the updated slot table and accumulators."""

    ctx: jax.Array         # [S] int32 prompt + generated at the iteration's start
    preempt: jax.Array     # [S] bool preempted in this iteration
    stall: jax.Array       # [S] bool odma: denied a large-pool block, keeps its memory
    decoding: jax.Array    # [S] bool running, neither preempted nor stalled
    n_pre: jax.Array       # [] int32 slots preempted
    n_stall: jax.Array     # [] int32 slots stalled
    copy_bytes: jax.Array  # [] float32 KV bytes copied by migrations
    used_n: jax.Array      # [] float32 normal-pool tokens held afterwards
    used_l: jax.Array      # [] float32 large-pool tokens held afterwards


def overflow(sl: Slots, acc: Acc, pools, params, t, cfg: ServerConfig, kind):
    """Step 2: running slots whose next token does not fit their reservation grow it
    (paged: one block), migrate (s3, odma: to ``prompt + max_len``), stall (odma) or are
    preempted, in slot order, before admissions."""
    scale, max_len = cfg.token_scale, jnp.float32(cfg.max_len)
    size_n, size_l = pools
    migr_large = 1.0 if kind == "odma" else 0.0
    running = sl.status == 1
    ctx = sl.prompt + sl.gen
    used_n, used_l = pool_use(running, sl.reserved, sl.large)
    over_g = relax.soft_gt(ctx + 1.0, sl.reserved, t, scale, margin=0.25) * running
    over = relax.hard(over_g) & running
    if kind == "static":
        over = jnp.zeros_like(over)
    copy_bytes = jnp.zeros((), jnp.float32)
    stall = jnp.zeros_like(over)
    preempt = jnp.zeros_like(over)
    reserved, large, peak_res = sl.reserved, sl.large, sl.peak_res
    if kind == "paged":
        k = params["block_size"]
        grant_g = prefix_fit(jnp.full(over.shape, k), size_n, used_n, over, t, scale)
        granted = over & relax.hard(grant_g)
        reserved = jnp.where(granted, reserved + k, reserved)
        preempt = over & ~granted
    elif kind in ("s3", "odma"):
        need = (sl.prompt + max_len).astype(jnp.float32)
        size, used = (size_l, used_l) if kind == "odma" else (size_n, used_n)
        grant_g = prefix_fit(need, size, used, over, t, scale)
        granted = over & relax.hard(grant_g)
        w_mig = grant_g * over_g  # soft weight of the event (1 in exact mode)
        copy_bytes = (jnp.sum(jnp.where(granted, w_mig * ctx, 0.0))
                      * cfg.kv_bytes_per_token)
        acc = acc.replace(
            migrations=acc.migrations + jnp.sum(jnp.where(granted, w_mig, 0.0)))
        reserved = jnp.where(granted, need, reserved)
        large = jnp.where(granted, migr_large, large)
        denied = over & ~granted
        if kind == "odma":  # waiting helps only if someone holds large-pool memory
            hopeless = used_l + jnp.sum(jnp.where(granted, need, 0.0)) <= 0
            preempt = denied & hopeless
            stall = denied & ~hopeless
        else:
            preempt = denied
    peak_res = jnp.maximum(peak_res, jnp.where(running, reserved, 0.0))
    status = jnp.where(preempt, 2, sl.status)
    reserved = jnp.where(preempt, 0.0, reserved)
    n_pre, n_stall = jnp.sum(preempt), jnp.sum(stall)
    acc = acc.replace(preemptions=acc.preemptions + n_pre, stalls=acc.stalls + n_stall)
    decoding = running & ~preempt & ~stall
    used_n, used_l = pool_use(status == 1, reserved, large)
    sl = sl.replace(status=status, reserved=reserved, large=large, peak_res=peak_res)
    return sl, acc, Overflow(ctx=ctx, preempt=preempt, stall=stall, decoding=decoding,
                             n_pre=n_pre, n_stall=n_stall, copy_bytes=copy_bytes,
                             used_n=used_n, used_l=used_l)


class Resume(NamedTuple):
    """What step 3a decided, and the slot counts after it."""

    resumed: jax.Array      # [S] bool preempted slots running again
    need_p: jax.Array | None  # [S] float32 resume reservations (None: not preempting)
    n_run: jax.Array        # [] int32 running slots (stalled included)
    n_dec: jax.Array        # [] int32 decoding slots (running before 3a, not stalled)
    n_wait: jax.Array       # [] int32 preempted slots still waiting
    n_res: jax.Array        # [] int32 slots resumed
    any_waiting: jax.Array  # [] bool a preempted slot still waits (blocks admissions)
    used_n: jax.Array       # [] float32 normal-pool tokens held afterwards
    used_l: jax.Array       # [] float32 large-pool tokens held afterwards


def resume(sl: Slots, ov: Overflow, n_free, n_wait, pools, slot, params, t,
           cfg: ServerConfig, kind):
    """Step 3a: re-admit preempted slots in slot order, head-of-line (the first that
    does not fit stops the walk), within ``max_batch``; slots preempted in this
    iteration wait at least one."""
    size_n, size_l = pools
    migr_large = 1.0 if kind == "odma" else 0.0
    used_n, used_l = ov.used_n, ov.used_l
    status, reserved, large, peak_res = sl.status, sl.reserved, sl.large, sl.peak_res
    resumed = jnp.zeros_like(ov.preempt)
    n_run = cfg.n_slots - n_free - n_wait - ov.n_pre  # status == 1
    n_dec = n_run - ov.n_stall  # decoding
    n_wait = n_wait + ov.n_pre
    n_res = jnp.zeros((), jnp.int32)
    need_p = None
    if kind in PREEMPTING:
        waiting = (status == 2) & ~ov.preempt
        need_p = need_resume(kind, params, ov.ctx, sl.prompt, cfg)
        size, used = (size_l, used_l) if kind == "odma" else (size_n, used_n)
        fit_p = relax.hard(prefix_fit(need_p, size, used, waiting, t, cfg.token_scale))
        cap = cfg.max_batch - n_run  # resumed slots: the first ``cap`` waiting at most
        cap_end = jnp.where(cap > 0, nth_true(waiting, jnp.maximum(cap, 0)[None])[0], 0)
        ok_p = waiting & fit_p & (slot < cap_end)
        first_fail = jnp.min(jnp.where(waiting & ~ok_p, slot, cfg.n_slots))
        resumed = ok_p & (slot < first_fail)
        status = jnp.where(resumed, 1, status)
        reserved = jnp.where(resumed, need_p, reserved)
        large = jnp.where(resumed, migr_large, large)
        peak_res = jnp.maximum(peak_res, jnp.where(resumed, need_p, 0.0))
        n_res = jnp.sum(resumed)
        n_run, n_wait = n_run + n_res, n_wait - n_res
        any_waiting = n_wait > 0
        used_n, used_l = pool_use(status == 1, reserved, large)
    else:
        any_waiting = jnp.zeros((), bool)
    sl = sl.replace(status=status, reserved=reserved, large=large, peak_res=peak_res)
    return sl, Resume(resumed=resumed, need_p=need_p, n_run=n_run, n_dec=n_dec,
                      n_wait=n_wait, n_res=n_res, any_waiting=any_waiting,
                      used_n=used_n, used_l=used_l)
