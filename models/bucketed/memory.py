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
from models.server import (ServerConfig, cap_prefill, prefix_fit, prefix_gate,
                           prefix_sum)

__all__ = [
    "Budget",
    "Overflow",
    "Resume",
    "in_queue",
    "grow_block",
    "large_room",
    "migrate",
    "overflow",
    "pool_sizes",
    "pool_use",
    "reserve_block",
    "reserve_bucket",
    "reserve_max_len",
    "reserve_routed",
    "reserve_routed_per_bucket",
    "resume",
    "resume_block",
    "resume_max_len",
    "token_gate",
    "watermark",
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


def large_room(pools, used, pol):
    """``(size, used)`` that a large-pool reservation is checked against: the large pool,
    or with ``borrow`` the whole memory (a large reservation may take any free token)."""
    if pol.borrow:
        return pools[0] + pools[1], used[0] + used[1]
    return pools[1], used[1]


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


def reserve_routed_per_bucket(params, bounds, prompt, pred, u, t, cfg):
    """ODMA with per-bucket inflation: the raw prediction's bucket ``k`` (smallest bound
    >= ``pred``; the last bucket when none fits) picks ``gamma[k]``, then routing as
    :func:`reserve_routed` with the inflated prediction ``pred (1 + gamma[k] u)``."""
    fits = relax.soft_ge(bounds[None, :], pred[:, None], t, cfg.token_scale)
    probs = relax.first_true_probs(fits)  # [A, B + 1]: raw bucket, last = none fits
    gam = params["gamma"]
    g = jnp.sum(probs[:, :-1] * gam[None, :], -1) + probs[:, -1] * gam[-1]
    return reserve_routed(dict(params, gamma=g), bounds, prompt, pred, u, t, cfg)


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


def in_queue(pos, mask, x):
    """Inclusive sums of ``x`` ([S] or [S, K]) along a queue: ``out[i]`` = the sum of
    ``x[j]`` over the masked slots j with ``pos[j] <= pos[i]``. The masked slots' queue
    positions ``pos`` are distinct in [0, S) (a dense queue), so this is a scatter into
    position order, a prefix sum and a gather: O(S), no sort."""
    n = pos.shape[0]
    idx = jnp.where(mask, pos, n)
    xm = jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, 0.0)
    buf = jnp.zeros(x.shape, jnp.float32).at[idx].add(xm, mode="drop")
    cum = prefix_sum(buf.T).T if x.ndim > 1 else prefix_sum(buf)
    return cum[jnp.clip(pos, 0, n - 1)]


def grow_block(sl, acc, over, over_g, ctx, pools, used, params, t, cfg, pol):
    """Paged overflow rule (vLLM ``Scheduler._schedule_running``, v0.6 and V1 alike):
    walking the running queue in order, a request needing a block takes one; when none
    is free the most recently (re)admitted request is preempted (recompute), again and
    again, until it fits or the request itself is the last. The kept set is the longest
    prefix in queue order whose blocks, grown ones included, fit the pool. Returns
    (reserved, large, preempt, stall, copy_bytes, acc)."""
    k = params["block_size"]
    running = sl.status == 1
    held = jnp.where(running, sl.reserved + jnp.where(over, k, 0.0), 0.0)
    keep = in_queue(sl.order, running, jax.lax.stop_gradient(held)) <= pools[0]
    granted = over & keep
    reserved = jnp.where(granted, sl.reserved + k, sl.reserved)
    return (reserved, sl.large, running & ~keep, jnp.zeros_like(over),
            jnp.zeros((), jnp.float32), acc)


def migrate(sl, acc, over, over_g, ctx, pools, used, params, t, cfg, pol):
    """Bucket overflow rule: migrate to ``prompt + max_len`` (the large pool for a
    ``large_pool`` policy) while it has room, copying the context; denied slots are
    preempted, or with a large pool stall while someone else holds large-pool memory."""
    need = (sl.prompt + jnp.float32(cfg.max_len)).astype(jnp.float32)
    size, use = large_room(pools, used, pol) if pol.large_pool else (pools[0], used[0])
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


def overflow(sl: BucketSlots, acc: BucketAcc, pools, params, t, cfg: ServerConfig, pol,
             active=True):
    """Running slots whose next token does not fit their reservation follow the policy's
    overflow rule (grow, migrate, stall or preempt); without a rule (static) nothing
    overflows. Only in iterations that decode (``active``; vLLM v0 runs none in an
    iteration that prefills) and only for slots done with their prefill. With a
    priority policy the preempted slots go to the front of the waiting queue, in their
    running order, ahead of slots preempted earlier (vLLM v0
    ``waiting.extendleft(preempted)``). Queues are dense positions (``order``): the
    running queue 0..R-1, the waiting queue 0..W-1; the victims are the running queue's
    suffix, so they take the waiting positions 0.. and the earlier waiting shift back."""
    running = sl.status == 1
    ctx = sl.prompt + sl.gen
    used = pool_use(running, sl.reserved, sl.large)
    eligible = running & (sl.todo == 0) & active
    over_g = relax.soft_gt(ctx + 1.0, sl.reserved, t, cfg.token_scale, margin=0.25) * eligible
    over = relax.hard(over_g) & eligible
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
    todo = jnp.where(preempt, 0, sl.todo)
    order = sl.order
    if pol.priority:
        n_keep = jnp.sum(running & ~preempt)
        order = jnp.where(preempt, order - n_keep,
                          jnp.where(sl.status == 2, order + jnp.sum(preempt), order))
    n_pre, n_stall = jnp.sum(preempt), jnp.sum(stall)
    acc = acc.replace(preemptions=acc.preemptions + n_pre, stalls=acc.stalls + n_stall)
    decoding = eligible & ~preempt & ~stall
    used_n, used_l = pool_use(status == 1, reserved, large)
    sl = sl.replace(status=status, reserved=reserved, large=large, peak_res=peak_res,
                    todo=todo, order=order)
    return sl, acc, Overflow(ctx=ctx, preempt=preempt, stall=stall, decoding=decoding,
                             n_pre=n_pre, n_stall=n_stall, copy_bytes=copy_bytes,
                             used_n=used_n, used_l=used_l)


class Budget(NamedTuple):
    """The token budget of an iteration's prefill walk (resumes, then new requests)."""

    tokens: jax.Array   # [] prefill tokens the walk may schedule
    exempt: jax.Array   # [] bool the walk's first item ignores ``tokens`` (vLLM v0: a
    #                     prompt <= max_model_len <= max_num_batched_tokens always fits)
    allowed: jax.Array  # [] bool the walk may admit at all (V1: not after a preemption)


def token_gate(cum, tok, budget: Budget, chunked: bool):
    """Which walk items fit the token budget, and the tokens each computes now.

    v0 (whole prompts): the cumulative tokens up to the item fit, or it is the first
    item and exempt. Chunked: some budget is left before the item; it computes what is
    left of it (only the last admitted item can be cut short)."""
    before = cum - tok
    if chunked:
        return before < budget.tokens, jnp.minimum(tok, jnp.maximum(budget.tokens - before,
                                                                     0.0))
    first = before <= 0
    return (cum <= budget.tokens) | (first & budget.exempt), tok


class Resume(NamedTuple):
    """What the resume walk decided, and the slot counts after it."""

    resumed: jax.Array      # [S] bool preempted slots running again
    chunk: jax.Array        # [S] float32 prefill tokens a resumed slot computes now
    need_p: jax.Array | None  # [S] float32 resume reservations (None: not preempting)
    tokens: jax.Array       # [] prefill tokens scheduled by the walk
    n_run: jax.Array        # [] int32 running slots (stalled included)
    n_wait: jax.Array       # [] int32 preempted slots still waiting
    n_res: jax.Array        # [] int32 slots resumed
    any_waiting: jax.Array  # [] bool a preempted slot still waits (blocks admissions)
    used_n: jax.Array       # [] float32 normal-pool tokens held afterwards
    used_l: jax.Array       # [] float32 large-pool tokens held afterwards


def watermark(cfg: ServerConfig, pol):
    """KV tokens an admission must leave free (vLLM v0's block-manager watermark; the
    paged policy only)."""
    return cfg.watermark_tokens if pol.watermark else jnp.zeros((), jnp.float32)


def resume(sl: BucketSlots, n_run, n_wait, used, pools, slot, budget: Budget,
           params, t, cfg: ServerConfig, pol):
    """Re-admit preempted slots, the head of vLLM's waiting queue: in queue order
    (paged: (re)admission order, vLLM v0 puts preempted requests back at the front in
    that order; other systems: slot order), head-of-line (the first that does not fit
    stops the walk), within ``max_batch``, the token budget and the pool (less the
    watermark). A resumed slot recomputes its context as prefill and takes the queue's
    next ``order`` (``order0`` + its rank)."""
    size_n, size_l = pools
    used_n, used_l = used
    status, reserved, large, peak_res = sl.status, sl.reserved, sl.large, sl.peak_res
    zero = jnp.zeros((), jnp.float32)
    resumed = jnp.zeros(sl.status.shape, bool)
    chunk = jnp.zeros(sl.status.shape, jnp.float32)
    n_res = jnp.zeros((), jnp.int32)
    need_p, tokens, todo, order = None, zero, sl.todo, sl.order
    if pol.preempts:
        waiting = status == 2
        ctx = (sl.prompt + sl.gen).astype(jnp.float32)
        need_p = pol.need_resume(params, ctx, sl.prompt, cfg)
        size, use = (large_room(pools, used, pol) if pol.large_pool
                     else (size_n, used_n))
        ctx_now = cap_prefill(ctx, cfg)  # the first chunk
        rows = jnp.stack([jnp.where(waiting, need_p, 0.0),
                          jnp.where(waiting, ctx_now, 0.0),
                          waiting.astype(jnp.float32)], -1)
        if pol.priority:
            cum = in_queue(sl.order, waiting, rows)
            key = sl.order
        else:
            cum = prefix_sum(rows.T).T
            key = slot
        fit_m = relax.hard(prefix_gate(cum[:, 0], size - watermark(cfg, pol), use,
                                       waiting, t, cfg.token_scale))
        fit_t, chunk_all = token_gate(cum[:, 1], ctx_now, budget, cfg.chunked)
        ok_p = waiting & fit_m & fit_t & (n_run + cum[:, 2] <= cfg.max_batch) & budget.allowed
        first_fail = jnp.min(jnp.where(waiting & ~ok_p, key, jnp.iinfo(jnp.int32).max))
        resumed = ok_p & (key < first_fail)
        chunk = jnp.where(resumed, chunk_all, 0.0)
        tokens = jnp.sum(chunk)
        status = jnp.where(resumed, 1, status)
        reserved = jnp.where(resumed, need_p, reserved)
        large = jnp.where(resumed, 1.0 if pol.large_pool else 0.0, large)
        peak_res = jnp.maximum(peak_res, jnp.where(resumed, need_p, 0.0))
        todo = jnp.where(resumed, jnp.round(ctx - chunk_all).astype(jnp.int32), todo)
        if pol.priority:  # resumed: the running tail; the rest move up the waiting queue
            order = jnp.where(resumed, n_run + order,
                              jnp.where(waiting, order - jnp.sum(resumed), order))
        n_res = jnp.sum(resumed)
        n_run, n_wait = n_run + n_res, n_wait - n_res
        any_waiting = n_wait > 0
        used_n, used_l = pool_use(status == 1, reserved, large)
    else:
        any_waiting = jnp.zeros((), bool)
    sl = sl.replace(status=status, reserved=reserved, large=large, peak_res=peak_res,
                    todo=todo, order=order)
    return sl, Resume(resumed=resumed, chunk=chunk, need_p=need_p, tokens=tokens,
                      n_run=n_run, n_wait=n_wait, n_res=n_res, any_waiting=any_waiting,
                      used_n=used_n, used_l=used_l)
