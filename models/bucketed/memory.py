"""Pools and reservations of the bucketed server (``models.bucketed``).

The reservation rules a system's :class:`~models.bucketed.policies.BucketPolicy` is
made of (``reserve_*``, ``resume_*``, the overflow rules ``grow_block`` and
``migrate``), the pool split and the two phases of an iteration that settle running and
preempted slots before admissions: ``overflow`` (docs/server-semantics.md step 2: grow,
migrate, stall or preempt) and ``resume`` (step 3a: re-admit preempted slots). Each
phase takes the slot table and returns it updated, with what later phases need in a
NamedTuple.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from models import relax
from models.bucketed.state import PROB_SCALE, BucketAcc, BucketSlots
from models.server import ServerConfig, nth_true, prefix_fit

__all__ = [
    "Overflow",
    "Resume",
    "grow_block",
    "migrate",
    "overflow",
    "pool_sizes",
    "pool_use",
    "reserve_block",
    "reserve_bucket",
    "reserve_max_len",
    "reserve_routed",
    "resume",
    "resume_block",
    "resume_max_len",
]


def pool_sizes(cfg, params, pol):
    """``(normal, large)`` pool sizes in tokens; a ``large_pool`` policy gives the share
    ``large_share`` of capacity to the large pool."""
    cap = cfg.capacity_tokens
    if pol.large_pool:
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


# Reservation rules: (params, bounds, prompt, pred, u, t, cfg) -> (output reservation r,
# large-pool weight) for the admission candidates.

def reserve_max_len(params, bounds, prompt, pred, u, t, cfg):
    """Worst case: ``max_len`` output tokens (static pre-allocation)."""
    return jnp.full(pred.shape, jnp.float32(cfg.max_len)), jnp.zeros(pred.shape)


def reserve_block(params, bounds, prompt, pred, u, t, cfg):
    """Paged: the prompt's last block plus one token, rounded up to whole blocks."""
    k = params["block_size"]
    return jnp.ceil((prompt + 1) / k) * k - prompt, jnp.zeros(pred.shape)


def _bucket(est, bounds, t, cfg):
    """The smallest bound >= ``est`` (soft), ``max_len`` when none fits; also the
    probability that none fits."""
    fits = relax.soft_ge(bounds[None, :], est[:, None], t, cfg.token_scale)
    probs = relax.first_true_probs(fits)  # [A, B]: bucket j, last = none fits
    r = (jnp.sum(probs[:, :-1] * bounds[None, :], -1)
         + probs[:, -1] * jnp.float32(cfg.max_len))
    return r, probs[:, -1]


def reserve_bucket(params, bounds, prompt, pred, u, t, cfg):
    """S3: the bucket of the raw prediction."""
    return _bucket(pred, bounds, t, cfg)[0], jnp.zeros(pred.shape)


def reserve_routed(params, bounds, prompt, pred, u, t, cfg):
    """ODMA: the bucket of the inflated prediction ``pred (1 + gamma u)``; requests with
    ``u > tau`` (and those no bucket fits) go to the large pool with ``max_len``."""
    r_bucket, none = _bucket(pred * (1.0 + params["gamma"] * u), bounds, t, cfg)
    route = relax.soft_gt(u, params["tau"], t, PROB_SCALE)
    r = (1.0 - route) * r_bucket + route * jnp.float32(cfg.max_len)
    return r, route + (1.0 - route) * none


# Resume rules: (params, ctx, prompt, cfg) -> KV tokens a preempted slot reserves.

def resume_block(params, ctx, prompt, cfg):
    """Paged: the context plus one token, in whole blocks."""
    k = params["block_size"]
    return jnp.ceil((ctx + 1) / k) * k


def resume_max_len(params, ctx, prompt, cfg):
    """Buckets: the worst case ``prompt + max_len``."""
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


def grow_block(sl, acc, over, over_g, ctx, pools, used, params, t, cfg, pol):
    """Paged overflow rule: grow by one block while the pool has room (slot order),
    else preempt. Returns (reserved, large, preempt, stall, copy_bytes, acc)."""
    k = params["block_size"]
    grant_g = prefix_fit(jnp.full(over.shape, k), pools[0], used[0], over, t,
                         cfg.token_scale)
    granted = over & relax.hard(grant_g)
    reserved = jnp.where(granted, sl.reserved + k, sl.reserved)
    return (reserved, sl.large, over & ~granted, jnp.zeros_like(over),
            jnp.zeros((), jnp.float32), acc)


def migrate(sl, acc, over, over_g, ctx, pools, used, params, t, cfg, pol):
    """Bucket overflow rule: migrate to ``prompt + max_len`` (the large pool for a
    ``large_pool`` policy) while it has room, copying the context; denied slots are
    preempted, or with a large pool stall while someone else holds large-pool memory."""
    need = (sl.prompt + jnp.float32(cfg.max_len)).astype(jnp.float32)
    size, use = (pools[1], used[1]) if pol.large_pool else (pools[0], used[0])
    grant_g = prefix_fit(need, size, use, over, t, cfg.token_scale)
    granted = over & relax.hard(grant_g)
    w_mig = grant_g * over_g  # soft weight of the event (1 in exact mode)
    copy_bytes = jnp.sum(jnp.where(granted, w_mig * ctx, 0.0)) * cfg.kv_bytes_per_token
    acc = acc.replace(migrations=acc.migrations + jnp.sum(jnp.where(granted, w_mig, 0.0)))
    reserved = jnp.where(granted, need, sl.reserved)
    large = jnp.where(granted, 1.0 if pol.large_pool else 0.0, sl.large)
    denied = over & ~granted
    if not pol.large_pool:
        return reserved, large, denied, jnp.zeros_like(over), copy_bytes, acc
    # waiting helps only if someone holds large-pool memory
    hopeless = used[1] + jnp.sum(jnp.where(granted, need, 0.0)) <= 0
    return reserved, large, denied & hopeless, denied & ~hopeless, copy_bytes, acc


def overflow(sl: BucketSlots, acc: BucketAcc, pools, params, t, cfg: ServerConfig, pol):
    """Step 2: running slots whose next token does not fit their reservation follow the
    policy's overflow rule (grow, migrate, stall or preempt), in slot order, before
    admissions; without a rule (static) nothing overflows."""
    running = sl.status == 1
    ctx = sl.prompt + sl.gen
    used = pool_use(running, sl.reserved, sl.large)
    over_g = relax.soft_gt(ctx + 1.0, sl.reserved, t, cfg.token_scale, margin=0.25) * running
    over = relax.hard(over_g) & running
    if pol.on_overflow is None:
        over = jnp.zeros_like(over)
        reserved, large, preempt, stall = sl.reserved, sl.large, over, over
        copy_bytes = jnp.zeros((), jnp.float32)
    else:
        reserved, large, preempt, stall, copy_bytes, acc = pol.on_overflow(
            sl, acc, over, over_g, ctx, pools, used, params, t, cfg, pol)
    peak_res = jnp.maximum(sl.peak_res, jnp.where(running, reserved, 0.0))
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


def resume(sl: BucketSlots, ov: Overflow, n_free, n_wait, pools, slot, params, t,
           cfg: ServerConfig, pol):
    """Step 3a: re-admit preempted slots in slot order, head-of-line (the first that
    does not fit stops the walk), within ``max_batch``; slots preempted in this
    iteration wait at least one."""
    size_n, size_l = pools
    migr_large = 1.0 if pol.large_pool else 0.0
    used_n, used_l = ov.used_n, ov.used_l
    status, reserved, large, peak_res = sl.status, sl.reserved, sl.large, sl.peak_res
    resumed = jnp.zeros_like(ov.preempt)
    n_run = cfg.n_slots - n_free - n_wait - ov.n_pre  # status == 1
    n_dec = n_run - ov.n_stall  # decoding
    n_wait = n_wait + ov.n_pre
    n_res = jnp.zeros((), jnp.int32)
    need_p = None
    if pol.preempts:
        waiting = (status == 2) & ~ov.preempt
        need_p = pol.need_resume(params, ov.ctx, sl.prompt, cfg)
        size, used = (size_l, used_l) if pol.large_pool else (size_n, used_n)
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
