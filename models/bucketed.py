"""Bucketed KV allocation: static pre-allocation, paged KV, S3 buckets and ODMA.

One pure ``step`` implements ``docs/server-semantics.md`` for the four systems; ``kind``
(static) selects the reservation and overflow rules, the temperature (traced) selects
exact (0) or relaxed (> 0) decisions. Policy parameters are a dict of float32 leaves:

- ``static``: none.
- ``paged``: ``block_size`` (tokens).
- ``s3``: ``bounds`` [B-1] (tokens, increasing).
- ``odma``: ``levels`` [B-1] quantile levels p_j, ``gamma`` (inflation), ``tau``
  (routing threshold on u), ``large_share`` (share of KV capacity in the large pool).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from hardware import iteration_time
from models import relax
from models.server import (Acc, ServerConfig, Slots, fifo_entries, hist_add, nth_true,
                           pack_bits, prefix_fit, prefix_gate, prefix_sum, slot_targets)
from models.workload import Workload

__all__ = ["KINDS", "Window", "Record", "Finished", "SimState", "reserve", "step", "absorb",
           "refresh", "PREEMPTING"]

KINDS = ("static", "paged", "s3", "odma")
PREEMPTING = ("paged", "s3", "odma")
# Relaxation scales: a temperature T smooths token comparisons over T * token_scale tokens
# (ServerConfig) and probability comparisons (u vs tau, quantile levels vs the window's
# CDF) over T * PROB_SCALE.
PROB_SCALE = 0.05


@struct.dataclass
class Window:
    """ODMA's sliding window of realised lengths and the current bucket bounds."""

    bounds: jax.Array  # [B-1] float32 tokens
    ring: jax.Array    # [W] int32 last W realised lengths (starts full with a prior)
    ptr: jax.Array     # [] int32 next ring position to overwrite
    hist: jax.Array    # [max_len + 1] float32 counts of the ring's lengths
    since: jax.Array   # [] int32 completions since the last refresh


@struct.dataclass
class Record:
    """Per-request outcomes (only kept for single-config evaluations)."""

    admit_iter: jax.Array   # [N] int32, -1 never admitted
    finish_iter: jax.Array  # [N] int32, -1 not finished
    first_s: jax.Array      # [N] float32 first-token time
    finish_s: jax.Array     # [N] float32 finish time
    reserved: jax.Array     # [N] float32 largest reservation (tokens, with prompt)
    r_admit: jax.Array      # [N] float32 output reservation at first admission


@struct.dataclass
class Finished:
    """One iteration's completions per slot (stacked per block by the scan)."""

    length: jax.Array  # [S] int32 realised length (<= max_len) entering the window; 0: none
    ttft: jax.Array    # [S] float32 seconds
    tpot: jax.Array    # [S] float32 seconds
    bits: jax.Array    # [ceil(S/32)] uint32 the completion mask, 32 slots per word


@struct.dataclass
class SimState:
    slots: Slots
    head: jax.Array    # [] int32 first request not yet admitted
    clock: jax.Array   # [] float32 seconds
    it: jax.Array      # [] int32 iteration counter
    win: Window
    acc: Acc
    rec: Record | None


def _pool_sizes(cfg, params, kind):
    cap = cfg.capacity_tokens
    if kind == "odma":
        raw = params["large_share"] * cap
        large = raw - jax.lax.stop_gradient(raw - jnp.floor(raw))  # floor, slope 1
        return cap - large, large
    return cap, jnp.zeros_like(cap)


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


def _need_resume(kind, params, ctx, prompt, cfg):
    if kind == "paged":
        k = params["block_size"]
        return jnp.ceil((ctx + 1) / k) * k
    return (prompt + cfg.max_len).astype(jnp.float32)


def step(st: SimState, wl: Workload, cfg: ServerConfig, hw, params, t, kind):
    """One continuous-batching iteration (docs/server-semantics.md, steps 1-6)."""
    sl, acc, n, a = st.slots, st.acc, wl.size, cfg.admit_window
    scale, max_len = cfg.token_scale, jnp.float32(cfg.max_len)
    size_n, size_l = _pool_sizes(cfg, params, kind)
    migr_large = 1.0 if kind == "odma" else 0.0

    slot = jnp.arange(cfg.n_slots, dtype=jnp.int32)

    # 1. idle jump
    head_arr = jnp.where(st.head < n, wl.arrival_s[jnp.minimum(st.head, n - 1)], jnp.inf)
    # slot counts by status, kept up to date below (integers: no further reductions)
    n_free, n_wait = jnp.sum(sl.status == 0), jnp.sum(sl.status == 2)
    jump = (n_free == cfg.n_slots) & (head_arr > st.clock) & jnp.isfinite(head_arr)
    clock = jnp.where(jump, head_arr, st.clock)

    # 2. overflow of running slots (before admissions)
    running = sl.status == 1
    ctx = sl.prompt + sl.gen
    held = jnp.where(running, sl.reserved, 0.0)
    used_l = jnp.sum(held * sl.large)
    used_n = jnp.sum(held) - used_l
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
        copy_bytes = jnp.sum(jnp.where(granted, w_mig * ctx, 0.0)) * cfg.kv_bytes_per_token
        acc = acc.replace(migrations=acc.migrations + jnp.sum(jnp.where(granted, w_mig, 0.0)))
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
    held = jnp.where(status == 1, reserved, 0.0)
    used_l = jnp.sum(held * large)
    used_n = jnp.sum(held) - used_l

    # 3a. re-admission of preempted slots (slot order, head-of-line)
    resumed = jnp.zeros_like(over)
    n_run = cfg.n_slots - n_free - n_wait - n_pre  # status == 1
    n_dec = n_run - n_stall  # decoding
    n_wait = n_wait + n_pre
    n_res = jnp.zeros((), jnp.int32)
    if kind in PREEMPTING:  # slots preempted in this iteration wait at least one
        waiting = (status == 2) & ~preempt
        need_p = _need_resume(kind, params, ctx, sl.prompt, cfg)
        size, used = (size_l, used_l) if kind == "odma" else (size_n, used_n)
        fit_p = relax.hard(prefix_fit(need_p, size, used, waiting, t, scale))
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
        held = jnp.where(status == 1, reserved, 0.0)
        used_l = jnp.sum(held * large)
        used_n = jnp.sum(held) - used_l
    else:
        any_waiting = jnp.zeros((), bool)

    # 3b. FCFS admission of new requests
    cand = st.head + jnp.arange(a)
    cc = jnp.minimum(cand, n - 1)
    c_arrival, c_output = wl.arrival_s[cc], wl.output_tokens[cc]
    ok_idx = (cand < n) & wl.valid[cc]
    c_prompt = wl.prompt_tokens[cc]
    r, large_soft = reserve(kind, params, st.win.bounds, c_prompt.astype(jnp.float32),
                            wl.pred_tokens[cc], wl.pred_u[cc], t, cfg)
    in_large = relax.hard(large_soft) if kind == "odma" else jnp.zeros(a, bool)
    need = c_prompt + r
    # one stacked prefix sum: normal-pool needs, large-pool needs (odma), prompts
    m_n, m_l = ok_idx & ~in_large, ok_idx & in_large
    rows = [jnp.where(m_n, need, 0.0), c_prompt.astype(jnp.float32)]
    if kind == "odma":
        rows.append(jnp.where(m_l, need, 0.0))
    cum = prefix_sum(jnp.stack(rows))
    gate = prefix_gate(cum[0], size_n, used_n, m_n, t, scale)
    if kind == "odma":
        gate = jnp.where(in_large, prefix_gate(cum[2], size_l, used_l, m_l, t, scale), gate)
    rank = jnp.arange(a)
    cum_prompt = jnp.round(cum[1]).astype(jnp.int32)
    ok = (ok_idx & (c_arrival <= clock) & (rank < n_free)
          & (n_run + rank < cfg.max_batch) & ((cum_prompt <= cfg.max_prefill) | (rank == 0))
          & relax.hard(gate) & ~any_waiting)
    n_adm = jnp.min(jnp.where(ok, a, rank))  # the walk stops at the first failure
    admitted = rank < n_adm
    # the structure (who is admitted) is hard; what an admitted request contributes is
    # weighted by its soft gate (>= 0.5 when admitted, -> 1 as T -> 0; 1 in exact mode)
    w_c = gate
    take, dst = slot_targets(status == 0, n_adm, a)
    pick = lambda x, old: old.at[dst].set(x, mode="drop", unique_indices=True)  # noqa: E731
    sl_req = pick(cand, sl.req)
    prompt = pick(c_prompt, sl.prompt)
    output = pick(c_output, sl.output)
    gen = jnp.where(take, 0, sl.gen)
    reserved = pick(need, reserved)
    peak_res = pick(need, peak_res)
    r_admit = pick(r, sl.r_admit)
    large = pick(in_large.astype(jnp.float32), large)
    weight = pick(w_c, sl.weight)
    arrival = pick(c_arrival, sl.arrival)
    t_admit = jnp.where(take, clock, sl.t_admit)
    status = jnp.where(take, 1, status)
    head = st.head + n_adm
    if kind in ("s3", "odma"):  # bucket overflows, counted (softly) at admission
        ovf = relax.soft_gt(c_output.astype(jnp.float32), r, t, scale,
                            margin=0.25) * (1.0 - large_soft)
        acc = acc.replace(overflows=acc.overflows + jnp.sum(jnp.where(admitted, w_c * ovf,
                                                                       0.0)))
    acc = acc.replace(queue_s=acc.queue_s + jnp.sum(jnp.where(take, weight * (clock - arrival),
                                                              0.0)))

    # drop rule: nothing can run and the first waiting item can never fit its pool
    idle = n_run + n_adm == 0
    if kind in PREEMPTING:
        waiting = (status == 2) & ~preempt
        first_w = jnp.min(jnp.where(waiting, slot, cfg.n_slots))
        pool_w = size_l if kind == "odma" else size_n
        drop_w = (idle & (first_w < cfg.n_slots)
                  & (need_p[jnp.minimum(first_w, cfg.n_slots - 1)] > pool_w))
        status = jnp.where(drop_w & (slot == first_w), 0, status)
        any_waiting = n_wait - drop_w > 0
    else:
        drop_w = jnp.zeros((), bool)
    pool0 = jnp.where(in_large[0], size_l, size_n)
    drop_h = (idle & ~any_waiting & ~drop_w & ok_idx[0] & (c_arrival[0] <= clock)
              & (need[0] > pool0))
    head = head + drop_h
    acc = acc.replace(dropped=acc.dropped + drop_w + drop_h)

    # 4-5. work and clock
    dec_w = jnp.where(decoding, weight, 0.0)
    prefill = (jnp.sum(jnp.where(take, weight * prompt, 0.0))
               + jnp.sum(jnp.where(resumed, weight * ctx, 0.0)))
    dec_seqs = jnp.sum(dec_w)
    dec_ctx = jnp.sum(dec_w * ctx)
    chunk = params["block_size"] if kind == "paged" else jnp.float32(cfg.max_len)
    busy = n_adm + n_res + n_dec > 0
    dt = jnp.where(busy, iteration_time(hw, prefill, dec_seqs, dec_ctx, chunk, copy_bytes), 0.0)
    clock = clock + dt
    progressed = take | resumed | decoding
    gen = jnp.where(progressed, gen + 1, gen)
    t_first = jnp.where(take, clock, sl.t_first)
    now = jnp.where(status == 1, reserved, 0.0)
    used_l = jnp.sum(now * large)
    use = jnp.maximum((jnp.sum(now) - used_l) / size_n,
                      jnp.where(size_l > 0, used_l / jnp.maximum(size_l, 1.0), 0.0))
    acc = acc.replace(peak_kv=jnp.maximum(acc.peak_kv, jnp.sum(now)),
                      max_use=jnp.maximum(acc.max_use, use),
                      busy_s=acc.busy_s + dt, iters=acc.iters + busy)

    # 6. completion
    done = (status == 1) & (gen >= output)
    wd = jnp.where(done, weight, 0.0)
    ttft = t_first - arrival
    tpot = jnp.where(output > 1, (clock - t_first) / jnp.maximum(output - 1, 1), 0.0)
    fit = relax.soft_ge(r_admit, output.astype(jnp.float32), t, scale, margin=0.25)
    acc = acc.replace(
        completed=acc.completed + jnp.sum(wd),
        tokens=acc.tokens + jnp.sum(wd * output),
        actual_kv=acc.actual_kv + jnp.sum(wd * (prompt + output)),
        reserved_kv=acc.reserved_kv + jnp.sum(wd * peak_res),
        fit=acc.fit + jnp.sum(wd * fit),
        ttft_ok=acc.ttft_ok + jnp.sum(wd * relax.soft_ge(
            cfg.ttft_slo_s, ttft, t, 0.1 * cfg.ttft_slo_s)),
        tpot_ok=acc.tpot_ok + jnp.sum(wd * relax.soft_ge(
            cfg.tpot_slo_s, tpot, t, 0.1 * cfg.tpot_slo_s)),
    )
    fin = Finished(length=jnp.where(done, jnp.minimum(output, cfg.max_len), 0),
                   ttft=ttft, tpot=tpot, bits=pack_bits(done))
    rec = st.rec
    if rec is not None:
        ridx = jnp.where(take, sl_req, n)  # out of range -> dropped by the scatter
        first_adm = take & (rec.admit_iter[jnp.minimum(sl_req, n - 1)] < 0)
        aidx = jnp.where(first_adm, sl_req, n)
        didx = jnp.where(done, sl_req, n)
        rec = Record(
            admit_iter=rec.admit_iter.at[aidx].set(st.it, mode="drop"),
            finish_iter=rec.finish_iter.at[didx].set(st.it, mode="drop"),
            first_s=rec.first_s.at[ridx].set(clock, mode="drop"),
            finish_s=rec.finish_s.at[didx].set(clock, mode="drop"),
            reserved=rec.reserved.at[didx].set(peak_res, mode="drop"),
            r_admit=rec.r_admit.at[aidx].set(r_admit, mode="drop"),
        )
    status = jnp.where(done, 0, status)
    slots = Slots(req=jnp.where(status == 0, -1, sl_req), status=status, prompt=prompt,
                  output=output, gen=gen, reserved=jnp.where(status == 0, 0.0, reserved),
                  peak_res=peak_res, r_admit=r_admit, large=large, weight=weight,
                  arrival=arrival, t_admit=t_admit, t_first=t_first)
    new = SimState(slots=slots, head=head, clock=clock, it=st.it + 1, win=st.win, acc=acc,
                   rec=rec)
    return new, (jnp.sum(now), fin)


def absorb(st: SimState, fin: Finished, kind, chunk: int = 64, latency: bool = True
           ) -> SimState:
    """Enter a block's completions ``fin`` ([R, S]) into the latency histograms (unless
    ``latency`` is False) and, for ``odma``, the window ring (steps 6-7), in FIFO order
    (iteration, then slot).

    Completions are taken ``chunk`` at a time, so the histogram and ring work follows the
    number of completions, not ``R * S``.
    """
    if not latency and kind != "odma":
        return st
    m = jnp.sum(jax.lax.population_count(fin.bits).astype(jnp.int32))
    n_slots = fin.length.shape[-1]
    win, acc = st.win, st.acc
    if kind == "odma":
        chunk = min(chunk, win.ring.shape[0])  # ring positions within a chunk stay distinct
    j = jnp.arange(chunk, dtype=jnp.int32)

    def body(c):
        c0, ring, whist, ptr, th, ph = c
        r, s = fifo_entries(fin.bits, c0 + j)
        s = jnp.minimum(s, n_slots - 1)
        ok = c0 + j < m
        ones = jnp.where(ok, 1.0, 0.0)
        ttft, tpot = jax.lax.stop_gradient((fin.ttft[r, s], fin.tpot[r, s]))
        if latency:
            th, ph = hist_add(th, ttft, ones), hist_add(ph, tpot, ones)
        if kind == "odma":
            w = ring.shape[0]
            lengths = jnp.where(ok, fin.length[r, s], 0)
            rpos = jnp.where(ok, (ptr + j) % w, w)
            old = ring[jnp.minimum(rpos, w - 1)]
            whist = whist.at[jnp.where(ok, old, 0)].add(-ones).at[lengths].add(ones)
            ring = ring.at[rpos].set(lengths, mode="drop")
            ptr = (ptr + jnp.sum(ok)) % w
        return c0 + chunk, ring, whist, ptr, th, ph

    # the first chunk outside the loop: XLA runs a loop body markedly slower, and the
    # loop (more than ``chunk`` completions in a block) is rare
    c = body((jnp.zeros((), jnp.int32), win.ring, win.hist, win.ptr, acc.ttft_hist,
              acc.tpot_hist))
    c = jax.lax.while_loop(lambda c: c[0] < m, body, c)
    if kind == "odma":
        win = win.replace(ring=c[1], hist=c[2], ptr=c[3], since=win.since + m)
    return st.replace(win=win, acc=acc.replace(ttft_hist=c[4], tpot_hist=c[5]))


def refresh(win: Window, params, t, refresh_every):
    """Recompute bounds as window quantiles if enough completions arrived (step 7)."""
    cdf = prefix_sum(win.hist) / jnp.sum(win.hist)
    fresh = relax.quantile_from_cdf(cdf, params["levels"], t * PROB_SCALE)
    due = win.since >= refresh_every
    return win.replace(bounds=jnp.where(due, fresh, win.bounds),
                       since=jnp.where(due, 0, win.since))
