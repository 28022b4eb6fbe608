"""Admission of new requests in the bucketed server (``models.bucketed``).

``admit`` is docs/server-semantics.md step 3b (FCFS admission of up to ``admit_window``
new requests, head-of-line); ``drop_unservable`` the drop rule that follows it: when
nothing can run, the first waiting item that can never fit its pool is dropped.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from models import relax
from models.bucketed.memory import Budget, Resume, large_room, token_gate, watermark
from models.bucketed.state import BucketAcc, BucketSlots
from models.server import (
    ServerConfig,
    cap_prefill,
    prefix_gate,
    prefix_sum,
    slot_targets,
)
from models.workload import Workload

__all__ = ["Admission", "admit", "drop_unservable"]


class Admission(NamedTuple):
    """What the admission walk decided about its candidates (the next ``admit_window``)."""

    take: jax.Array       # [S] bool slots that received a new request
    chunk: jax.Array      # [S] float32 prefill tokens a new slot computes now
    n_adm: jax.Array      # [] int32 requests admitted
    ok_idx: jax.Array     # [A] bool candidate is a valid request
    c_arrival: jax.Array  # [A] float32 candidates' arrival times
    need: jax.Array       # [A] float32 candidates' KV reservations (prompt + r)
    in_large: jax.Array   # [A] bool candidate goes to the large pool


def admit(sl: BucketSlots, head, acc: BucketAcc, bounds, rs: Resume, budget: Budget,
          n_free, pools, clock, wl: Workload, params, t, cfg: ServerConfig, pol):
    """FCFS admission of new requests into free slots, after the resume walk.

    Candidates are admitted in order while they have arrived, a slot and a batch place
    are free, the token budget holds (:func:`~models.bucketed.memory.token_gate`; what
    the resumes used is gone), their pool has room (less the watermark) and no
    preempted slot waits; the walk stops at the first failure. Returns the updated slot
    table, head, accumulators and the ``Admission``.
    """
    n, a = wl.size, cfg.admit_window
    scale = cfg.token_scale
    size_n, size_l = pools
    cand = head + jnp.arange(a)
    cc = jnp.minimum(cand, n - 1)
    c_arrival, c_output = wl.arrival_s[cc], wl.output_tokens[cc]
    ok_idx = (cand < n) & wl.valid[cc]
    c_prompt = wl.prompt_tokens[cc]
    r, large_soft = pol.reserve(params, bounds, c_prompt.astype(jnp.float32),
                                wl.pred_tokens[cc], wl.pred_u[cc], t, cfg)
    in_large = relax.hard(large_soft) if pol.large_pool else jnp.zeros(a, bool)
    need = c_prompt + r
    # one stacked prefix sum: normal-pool needs, prompts, large-pool needs (if any)
    m_n, m_l = ok_idx & ~in_large, ok_idx & in_large
    tok = c_prompt.astype(jnp.float32)
    # chunked: each prompt's first chunk at most long_prefill_token_threshold tokens
    tok_now = cap_prefill(tok, cfg)
    rows = [jnp.where(m_n, need, 0.0), tok_now]
    if pol.large_pool:
        rows.append(jnp.where(m_l, need, 0.0))
    cum = prefix_sum(jnp.stack(rows))
    if pol.borrow:  # normal free = normal size - normal used - the large overspill
        spill = jnp.maximum(jax.lax.stop_gradient(rs.used_l) + cum[2] - size_l, 0.0)
        gate = prefix_gate(cum[0] + spill, size_n, rs.used_n, m_n, t, scale)
    else:
        gate = prefix_gate(cum[0], size_n - watermark(cfg, pol), rs.used_n, m_n, t, scale)
    if pol.large_pool:
        size_b, used_b = large_room(pools, (rs.used_n, rs.used_l), pol)
        gate_l = prefix_gate(cum[2] + (cum[0] if pol.borrow else 0.0), size_b, used_b, m_l,
                             t, scale)
        gate = jnp.where(in_large, gate_l, gate)
    rank = jnp.arange(a)
    left = Budget(tokens=budget.tokens - rs.tokens, exempt=budget.exempt & (rs.n_res == 0),
                  allowed=budget.allowed)
    fit_t, c_chunk = token_gate(cum[1], tok_now, left, cfg.chunked)
    ok = (ok_idx & (c_arrival <= clock) & (rank < n_free)
          & (rs.n_run + rank < cfg.max_batch) & fit_t & budget.allowed
          & relax.hard(gate) & ~rs.any_waiting)
    n_adm = jnp.min(jnp.where(ok, a, rank))  # the walk stops at the first failure
    admitted = rank < n_adm
    # the structure (who is admitted) is hard; what an admitted request contributes is
    # weighted by its soft gate (>= 0.5 when admitted, -> 1 as T -> 0; 1 in exact mode)
    w_c = gate
    take, dst = slot_targets(sl.status == 0, n_adm, a)

    def pick(x, old):
        return old.at[dst].set(x, mode="drop", unique_indices=True)

    sl_req = pick(cand, sl.req)
    prompt = pick(c_prompt, sl.prompt)
    output = pick(c_output, sl.output)
    gen = jnp.where(take, 0, sl.gen)
    reserved = pick(need, sl.reserved)
    peak_res = pick(need, sl.peak_res)
    r_admit = pick(r, sl.r_admit)
    large = pick(in_large.astype(jnp.float32), sl.large)
    weight = pick(w_c, sl.weight)
    arrival = pick(c_arrival, sl.arrival)
    chunk = jnp.where(take, pick(c_chunk, jnp.zeros_like(sl.reserved)), 0.0)
    todo = pick(jnp.round(tok - c_chunk).astype(jnp.int32), sl.todo)
    order = pick(rs.n_run + rank.astype(jnp.int32), sl.order)  # the running queue's tail
    t_admit = jnp.where(take, clock, sl.t_admit)
    status = jnp.where(take, 1, sl.status)
    head = head + n_adm
    if pol.counts_overflows:  # bucket overflows, counted (softly) at admission
        ovf = relax.soft_gt(c_output.astype(jnp.float32), r, t, scale,
                            margin=0.25) * (1.0 - large_soft)
        acc = acc.replace(
            overflows=acc.overflows + jnp.sum(jnp.where(admitted, w_c * ovf, 0.0)))
    acc = acc.replace(
        queue_s=acc.queue_s + jnp.sum(jnp.where(take, weight * (clock - arrival), 0.0)))
    sl = sl.replace(req=sl_req, status=status, prompt=prompt, output=output, gen=gen,
                    reserved=reserved, peak_res=peak_res, r_admit=r_admit, large=large,
                    weight=weight, arrival=arrival, t_admit=t_admit, todo=todo,
                    order=order)
    return sl, head, acc, Admission(take=take, chunk=chunk, n_adm=n_adm, ok_idx=ok_idx,
                                    c_arrival=c_arrival, need=need, in_large=in_large)


def drop_unservable(sl: BucketSlots, head, acc: BucketAcc, rs: Resume, ad: Admission,
                    n_run0, pools, slot, clock, cfg: ServerConfig, pol):
    """Drop rule: nothing runs (``n_run0`` running at the walk's start), nothing was
    admitted and the first waiting item can never fit its pool (less the watermark).

    The first waiting preempted slot is freed, or else (no slot waits) the head request
    is skipped; either counts as dropped. Returns the slot table, head and accumulators.
    """
    size_n, size_l = pools
    size_n = size_n - watermark(cfg, pol)
    status = sl.status
    idle = (n_run0 == 0) & (rs.n_res + ad.n_adm == 0)
    if pol.preempts:
        waiting = status == 2
        key = sl.order if pol.priority else slot
        first_key = jnp.min(jnp.where(waiting, key, jnp.iinfo(jnp.int32).max))
        first = waiting & (key == first_key)
        pool_w = large_room(pools, (0.0, 0.0), pol)[0] if pol.large_pool else size_n
        drop_w = idle & jnp.any(first & (rs.need_p > pool_w))
        status = jnp.where(drop_w & first, 0, status)
        if pol.priority:  # the dropped head leaves the waiting queue
            sl = sl.replace(order=jnp.where(waiting & drop_w, sl.order - 1, sl.order))
        any_waiting = rs.n_wait - drop_w > 0
    else:
        drop_w = jnp.zeros((), bool)
        any_waiting = rs.any_waiting
    pool0 = jnp.where(ad.in_large[0], large_room(pools, (0.0, 0.0), pol)[0], size_n)
    drop_h = (idle & ~any_waiting & ~drop_w & ad.ok_idx[0] & (ad.c_arrival[0] <= clock)
              & (ad.need[0] > pool0))
    head = head + drop_h
    acc = acc.replace(dropped=acc.dropped + drop_w + drop_h)
    return sl.replace(status=status), head, acc
