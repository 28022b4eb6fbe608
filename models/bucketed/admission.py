"""Admission of new requests in the bucketed server (``models.bucketed``).

``admit`` is docs/server-semantics.md step 3b (admission of up to ``admit_window``
new requests, head-of-line); ``drop_unservable`` the drop rule that follows it: when
nothing can run, the first waiting item that can never fit its pool is dropped.

The waiting requests are taken first-come-first-served, or, when the workload carries
per-request priorities (``Workload.priority``), in the order of vLLM V1's
``--scheduling-policy priority``: lowest priority value first, ties by arrival
(vllm/v1/core/sched/request_queue.py, ``PriorityRequestQueue`` at vllm-project/vllm
0097c7e, ordering requests by ``(priority, arrival_time)``). The walk stays head-of-line
in that order (V1's scheduler stops at the first waiting request it cannot schedule).
Where this differs from vLLM: the order is taken over the first ``priority_window``
requests not yet admitted (:class:`Queue`; vLLM's heap holds every waiting request), so
a request further back waits until the window reaches it; preempted requests resume
before any new admission, victims are still chosen from the running queue's tail
(``models.bucketed.memory``), where V1 with priorities would preempt the lowest-priority
running request and let preempted and new requests compete by priority.
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

__all__ = ["Admission", "Queue", "admit", "drop_unservable", "start_queue"]


class Queue(NamedTuple):
    """The requests not yet admitted: every index >= ``head`` except, with priorities,
    those whose ``taken`` flag is set (``taken[i]``: request ``head + i`` was admitted or
    dropped out of order). ``head`` is always the first request not taken."""

    head: jax.Array            # [] int32
    taken: jax.Array | None    # [W] bool, W = max(priority_window, admit_window); None:
    #                            first-come-first-served


def start_queue(wl: Workload, cfg: ServerConfig) -> Queue:
    """The queue before the first step (``taken`` only when ``wl`` has priorities)."""
    w = max(cfg.priority_window, cfg.admit_window)
    return Queue(head=jnp.int32(0),
                 taken=None if wl.priority is None else jnp.zeros(w, bool))


def _candidates(q: Queue, wl: Workload, clock, a: int):
    """The next ``a`` requests the walk tries, as (indices, window offsets or None, valid
    and still waiting): from the head in arrival order, or (priorities) the waiting
    requests of the window that have arrived, by (priority, arrival), then the rest."""
    n = wl.size
    if q.taken is None:
        cand = q.head + jnp.arange(a)
        return cand, None, (cand < n) & wl.valid[jnp.minimum(cand, n - 1)]
    pos = q.head + jnp.arange(q.taken.shape[0])
    pc = jnp.minimum(pos, n - 1)
    waiting = (pos < n) & wl.valid[pc] & ~q.taken & (wl.arrival_s[pc] <= clock)
    # the window is in arrival order, so a stable sort breaks priority ties by arrival
    off = jnp.argsort(jnp.where(waiting, wl.priority[pc], jnp.inf), stable=True)[:a]
    return q.head + off, off, waiting[off]


def _take(q: Queue, off, mask) -> Queue:
    """``q`` with the candidates at window offsets ``off`` where ``mask`` taken."""
    return q._replace(taken=q.taken.at[off].set(q.taken[off] | mask, unique_indices=True))


def _advance(q: Queue) -> Queue:
    """Move the head past the leading taken requests (and the window with it)."""
    w = q.taken.shape[0]
    lead = jnp.sum(jnp.cumprod(q.taken.astype(jnp.int32)))
    idx = jnp.arange(w) + lead
    return Queue(head=q.head + lead,
                 taken=jnp.where(idx < w, q.taken[jnp.minimum(idx, w - 1)], False))


class Admission(NamedTuple):
    """What the admission walk decided about its candidates (the next ``admit_window``)."""

    take: jax.Array       # [S] bool slots that received a new request
    chunk: jax.Array      # [S] float32 prefill tokens a new slot computes now
    n_adm: jax.Array      # [] int32 requests admitted
    ok_idx: jax.Array     # [A] bool candidate is a valid request (still waiting)
    off: jax.Array | None  # [A] int32 candidates' offsets in the priority window
    c_arrival: jax.Array  # [A] float32 candidates' arrival times
    need: jax.Array       # [A] float32 candidates' KV reservations (prompt + r)
    in_large: jax.Array   # [A] bool candidate goes to the large pool


def admit(sl: BucketSlots, q: Queue, acc: BucketAcc, bounds, rs: Resume, budget: Budget,
          n_free, pools, clock, wl: Workload, params, t, cfg: ServerConfig, pol):
    """Admission of new requests into free slots, after the resume walk.

    Candidates (first-come-first-served, or by priority: the module docstring) are
    admitted in order while they have arrived, a slot and a batch place are free, the
    token budget holds (:func:`~models.bucketed.memory.token_gate`; what the resumes
    used is gone), their pool has room (less the watermark) and no preempted slot
    waits; the walk stops at the first failure. Returns the updated slot table, queue,
    accumulators and the ``Admission``.
    """
    n, a = wl.size, cfg.admit_window
    scale = cfg.token_scale
    size_n, size_l = pools
    cand, off, ok_idx = _candidates(q, wl, clock, a)
    cc = jnp.minimum(cand, n - 1)
    c_arrival, c_output = wl.arrival_s[cc], wl.output_tokens[cc]
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
    q = q._replace(head=q.head + n_adm) if off is None else _take(q, off, admitted)
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
    return sl, q, acc, Admission(take=take, chunk=chunk, n_adm=n_adm, ok_idx=ok_idx,
                                 off=off, c_arrival=c_arrival, need=need,
                                 in_large=in_large)


def drop_unservable(sl: BucketSlots, q: Queue, acc: BucketAcc, rs: Resume, ad: Admission,
                    n_run0, pools, slot, clock, cfg: ServerConfig, pol):
    """Drop rule: nothing runs (``n_run0`` running at the walk's start), nothing was
    admitted and the first waiting item can never fit its pool (less the watermark).

    The first waiting preempted slot is freed, or else (no slot waits) the first waiting
    request (the head; with priorities the walk's first candidate) is skipped; either
    counts as dropped. Returns the slot table, queue (its head moved past what was
    taken) and accumulators.
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
    if ad.off is None:
        q = q._replace(head=q.head + drop_h)
    else:
        q = _advance(_take(q, ad.off[:1], drop_h[None]))
    acc = acc.replace(dropped=acc.dropped + drop_w + drop_h)
    return sl.replace(status=status), q, acc
