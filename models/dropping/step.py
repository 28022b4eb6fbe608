"""One step of the parameter-dropping cluster: dispatch, KunServe's drop plan, the pick of
the earliest group, migrations landing, restore, and one round of that group
(docs/kunserve-semantics.md). Pure; one code path for exact (T = 0) and relaxed runs."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp

from models.dropping.cluster import (dispatch, drop, group_sizes, loads, need,
                                     restore_end, restore_start)
from models.dropping.split import layout, lookahead_pieces, pieces, round_time, token_cuts
from models.dropping.state import DropPolicy, DropState
from models.server import finish_outcomes, prefix_gate

__all__ = ["step"]

INF = jnp.inf


def _last_true(mask):
    n = mask.shape[0]
    return n - 1 - jnp.argmax(mask[::-1])


def _by_row(idx, mask, v, n: int):
    """[N] sums of ``v`` over the requests in ``mask`` by row ``idx`` ([R] each): a
    masked reduction per row, not a scatter (whole tokens: exact in any order)."""
    on = (idx[None, :] == jnp.arange(n)[:, None]) & mask[None, :]
    return jnp.sum(jnp.where(on, v[None, :], jnp.zeros((), v.dtype)), axis=1)


def _migrate(s: DropState, g, t0, ld, dec0, kvb, bw):
    """7b: Llumnix moves its newest running request out of a throttled group."""
    r = s.req
    ing = ld.rg == g
    q = (r.status == 1) & ing
    hol = jnp.argmax(q)
    held = ld.held[g]
    thr = jnp.any(q) & (held + jnp.sum(dec0) + need(r)[hol] > s.capw[g])
    out = jnp.any((r.mig_to >= 0) & ing)
    cand = (r.status == 2) & ing & (r.stall <= t0) & (r.mig_to < 0)
    v = _last_true(cand)
    free = jnp.where((ld.size > 0) & (jnp.arange(ld.size.shape[0]) != g),
                     s.capw - ld.held - ld.queued, -INF)
    dest = jnp.argmax(free).astype(jnp.int32)
    ok = thr & ~out & jnp.any(cand) & (free[dest] >= r.kv[v])
    kv = r.kv[v]
    vi = jnp.where(ok, v, r.kv.shape[0])  # out of range (dropped) unless ok
    req = r.replace(mig_to=r.mig_to.at[vi].set(dest, mode="drop"),
                    mig_end=r.mig_end.at[vi].set(t0 + kv * kvb / bw, mode="drop"),
                    mig_kv=r.mig_kv.at[vi].set(kv, mode="drop"))
    acc = s.acc.replace(migrations=s.acc.migrations + ok.astype(jnp.float32),
                        exchanged=s.acc.exchanged + jnp.where(ok, kv, 0.0))
    return s.replace(req=req, acc=acc,
                     mig_res=jnp.where(ok, s.mig_res.at[dest].add(kv), s.mig_res))


def _cancel(s: DropState, mask):
    """Cancel the migrations of ``mask`` (finished or preempted requests)."""
    r = s.req
    m = mask & (r.mig_to >= 0)
    res = s.mig_res - _by_row(r.mig_to, m, r.mig_kv, s.mig_res.shape[0])
    return s.replace(mig_res=res, req=r.replace(mig_to=jnp.where(m, -1, r.mig_to),
                                                mig_kv=jnp.where(m, 0.0, r.mig_kv)))


def _next_event(s: DropState, g, t0, ing, arrival, hw, migrate: bool):
    r = s.req
    n_req = arrival.shape[0]
    cands = jnp.stack([
        jnp.min(jnp.where(ing & (r.status == 2) & (r.stall > t0), r.stall, INF)),
        jnp.where(s.x_end[g] > t0, s.x_end[g], INF),
        jnp.where(s.restoring[g] & (s.pull_end[g] > t0), s.pull_end[g], INF),
        # only Llumnix migrates (elsewhere mig_to stays -1)
        jnp.min(jnp.where((r.mig_to >= 0) & (r.mig_end > t0), r.mig_end, INF))
        if migrate else jnp.float32(INF),
        jnp.where(s.head < n_req, arrival[jnp.minimum(s.head, n_req - 1)], INF),
    ])
    cands = jnp.where(cands > t0, cands, INF)
    nxt = jnp.min(cands)
    return jnp.where(jnp.isfinite(nxt), nxt, t0 + hw.step_overhead_s)


def step(state: DropState, inputs, hw, params, t, pol: DropPolicy, opts):
    """One step (see the module doc): ``(state, (cluster KV held, Finished))``."""
    wl, cfg, x = inputs.wl, inputs.cfg, inputs.extra
    fo = opts.family
    n = state.gid.shape[0]
    kvb = cfg.kv_bytes_per_token
    bw = hw.network_bw
    C = cfg.capacity_tokens
    p = params
    chunk_bytes = (p["chunk_mib"] if "chunk_mib" in p else 32.0) * 2.0 ** 20
    s = state
    n_req = wl.arrival_s.shape[0]
    arrival = jnp.where(wl.valid, wl.arrival_s, INF)

    # 1-2 the step's time and dispatch
    ld = loads(s, n)
    t_arr = jnp.where(s.head < n_req, arrival[jnp.minimum(s.head, n_req - 1)], INF)
    t_busy = jnp.min(jnp.where(ld.busy & (ld.size > 0), s.iclock, INF))
    t_now = jnp.minimum(t_arr, t_busy)
    s, ld, more = dispatch(s, arrival, t_now, ld)
    # 3 drop plan (after every arrival <= t is dispatched)
    if pol.drop:
        s, _ = drop(s, ld, t_now, p, x, hw, kvb, cfg, t, enable=~more)
        ld = loads(s, n)
    # 4 pick
    key = jnp.where(ld.busy & (ld.size > 0), s.iclock, INF)
    g = jnp.argmin(key).astype(jnp.int32)
    t0 = key[g]
    active = jnp.isfinite(t0) & ~more
    t0 = jnp.where(active, t0, 0.0)
    mid = s
    # 5 migrations land
    if pol.migrate:
        r = s.req
        land = active & (r.mig_to >= 0) & (r.mig_end <= t0)
        res = s.mig_res - _by_row(r.mig_to, land, r.mig_kv, n)
        # the landed (running) requests move from their group to the destination's
        src = s.gid[r.inst]
        moved = _by_row(r.mig_to, land, r.kv, n) - _by_row(src, land, r.kv, n)
        one = jnp.ones_like(r.status)
        moved_n = _by_row(r.mig_to, land, one, n) - _by_row(src, land, one, n)
        s = s.replace(mig_res=res, held=s.held + moved, live=s.live + moved_n,
                      req=r.replace(inst=jnp.where(land, r.mig_to, r.inst),
                                    mig_to=jnp.where(land, -1, r.mig_to),
                                    mig_kv=jnp.where(land, 0.0, r.mig_kv)))
    # 6 restore
    if pol.drop and fo.restore:
        s = restore_end(s, g, t0, p, x, hw, kvb, C, active)
        ld = loads(s, n)
        s = restore_start(s, g, t0, ld, p, x, hw, kvb, C, cfg, t)
    ld = loads(s, n)
    r = s.req
    mem = s.gid == g
    k = jnp.sum(mem.astype(jnp.float32))
    cap = s.capw[g]
    # the round's requests; none unless the step runs a round, so that every request
    # update below is masked (the state's request arrays need no final select)
    ing = (ld.rg == g) & active
    running = (r.status == 2) & ing
    runnable = running & (r.stall <= t0)
    dec0 = runnable & (r.done >= r.target)
    # 7b migration
    if pol.migrate:
        s = _migrate(s, g, t0, ld, dec0, kvb, bw)
        r = s.req
    # 7a growth and preemption (newest first)
    grow = dec0.astype(jnp.float32)
    P = jnp.cumsum(jnp.where(running, r.kv + grow, 0.0)) + s.mig_res[g]
    victim = running & (P > cap)
    any_victim = jnp.any(victim)
    if pol.swap:
        swapped_out = jnp.sum(jnp.where(victim, r.kv, 0.0))
        r = r.replace(status=jnp.where(victim, 4, r.status),
                      host=jnp.where(victim, r.kv, r.host), kv=jnp.where(victim, 0.0, r.kv))
    else:
        swapped_out = jnp.float32(0.0)
        r = r.replace(status=jnp.where(victim, 1, r.status),
                      target=jnp.where(victim, wl.prompt_tokens + r.gen, r.target),
                      done=jnp.where(victim, 0.0, r.done), kv=jnp.where(victim, 0.0, r.kv))
    s = s.replace(req=r)
    if pol.migrate:
        s = _cancel(s, victim)
        r = s.req
    keep = running & ~victim
    held = jnp.sum(jnp.where(keep, r.kv, 0.0)) + s.mig_res[g]
    growth = jnp.sum(jnp.where(keep, grow, 0.0))
    # 7c swap in (none in a round that preempted: vLLM's scheduler); a returning
    # request in decode needs room for its next token
    swapped_in = jnp.zeros_like(victim)
    if pol.swap:
        sw = (r.status == 4) & ing & ~any_victim
        d_in = jnp.where(sw & (r.done >= r.target), 1.0, 0.0)
        cum = jnp.cumsum(jnp.where(sw, r.host + d_in, 0.0))
        swapped_in = sw & (held + growth + cum <= cap)
        back = jnp.sum(jnp.where(swapped_in, r.host, 0.0))
        r = r.replace(status=jnp.where(swapped_in, 2, r.status),
                      kv=jnp.where(swapped_in, r.host, r.kv),
                      host=jnp.where(swapped_in, 0.0, r.host))
        held = held + back
        growth = growth + jnp.sum(jnp.where(swapped_in, d_in, 0.0))
        swap_tokens = swapped_out + back
    else:
        swap_tokens = swapped_out
    # 7d admission
    q = (r.status == 1) & ing
    nd = jnp.where(q, need(r), 0.0)
    cum = jnp.cumsum(nd)
    n_run = jnp.sum(((r.status == 2) & ing).astype(jnp.float32))
    room = k * cfg.max_batch.astype(jnp.float32) - n_run
    free = cap - k * cfg.watermark_tokens - held - growth
    admit = q & (cum <= free) & (jnp.cumsum(q.astype(jnp.float32)) <= room)
    first = admit & jnp.isnan(r.t_admit)
    gate = prefix_gate(cum, cap - k * cfg.watermark_tokens, held + growth, q, t,
                       cfg.token_scale)
    w = jnp.where(first, jnp.where(t > 0, gate, 1.0), r.weight)
    acc = s.acc.replace(queue_s=s.acc.queue_s + jnp.sum(jnp.where(first, w * (t0 - wl.arrival_s), 0.0)),
                        preemptions=s.acc.preemptions + jnp.sum(victim.astype(jnp.float32)),
                        swapped=s.acc.swapped + swap_tokens)
    r = r.replace(status=jnp.where(admit, 2, r.status), kv=jnp.where(admit, nd, r.kv),
                  done=jnp.where(admit, 0.0, r.done), weight=w,
                  t_admit=jnp.where(first, t0, r.t_admit))
    # 7e work
    run = (r.status == 2) & ing & (r.stall <= t0)
    dec = run & (r.done >= r.target)
    pre = run & (r.done < r.target)
    n_dec = jnp.sum(dec.astype(jnp.float32))
    budget = jnp.maximum(k * cfg.max_prefill - n_dec, 0.0)
    rem = jnp.where(pre, r.target - r.done, 0.0)
    chunk = jnp.where(pre, jnp.clip(budget - (jnp.cumsum(rem) - rem), 0.0, rem), 0.0)
    # 7f-g microbatches and time
    it = layout(dec, chunk, r.kv, r.done, x.cost_a, x.cost_b)
    exch = (s.x_end[g] > t0) | s.restoring[g]
    if fo.coordinated:
        delay = jnp.where(exch, chunk_bytes / bw, 0.0)
        wait = 0.0
    else:  # the activations wait for a whole exchange; a weight pull stays chunked
        delay = jnp.where(s.restoring[g], chunk_bytes / bw, 0.0)
        wait = jnp.where((s.x_end[g] > t0) & (k > 1), s.x_end[g] - t0, 0.0)
    act = hw.activation_bytes_per_token
    if pol.lookahead and fo.microbatch == "lookahead":
        cuts, cuts_up, gd = lookahead_pieces(it, x.cost_a, x.cost_b, p["min_tokens"],
                                             fo.max_depth, t, cfg.token_scale)
        T, bub, pipe = round_time(pieces(it, cuts), k, hw, act, bw, delay)
        T2, bub2, pipe2 = round_time(pieces(it, cuts_up), k, hw, act, bw, delay)
        T = jnp.where(t > 0, gd * T + (1.0 - gd) * T2, T)
    else:
        T, bub, pipe = round_time(pieces(it, token_cuts(it.n, cfg.max_prefill)), k, hw,
                                  act, bw, delay)
    T = T + jnp.where(it.n > 0, wait, 0.0)
    T = jnp.maximum(T, swap_tokens * kvb / hw.host_link_bw)
    work = (it.n > 0) | (swap_tokens > 0)
    t1 = jnp.where(work, t0 + T,
                   _next_event(s.replace(req=r), g, t0, ing, arrival, hw, pol.migrate))
    # 7h progress
    newdone = r.done + chunk
    made = pre & (chunk > 0) & (newdone >= r.target)
    tok = dec | made
    gen = r.gen + tok.astype(jnp.float32)
    t_first = jnp.where(tok & (r.gen == 0), t1, r.t_first)
    fin = (r.status == 2) & ing & (gen >= wl.output_tokens)
    r = r.replace(done=newdone, gen=gen, kv=jnp.where(dec, r.kv + 1.0, r.kv),
                  t_first=t_first)
    sl = types.SimpleNamespace(weight=r.weight, output=wl.output_tokens,
                               prompt=wl.prompt_tokens,
                               t_first=jnp.where(jnp.isnan(r.t_first), t1, r.t_first),
                               arrival=wl.arrival_s)
    acc, fin_out = finish_outcomes(acc, sl, fin, t1, t, cfg, hw)
    r = r.replace(status=jnp.where(fin, 3, r.status), kv=jnp.where(fin, 0.0, r.kv),
                  t_done=jnp.where(fin, t1, r.t_done))
    s = s.replace(req=r)
    if pol.migrate:
        s = _cancel(s, fin)
        r = s.req
    dt = t1 - t0
    # the group's rows afresh (only its requests changed in the round)
    queued_g = (r.status == 1) & ing
    kv_g = jnp.sum(jnp.where((r.status == 2) & ing, r.kv, 0.0))
    live_g = ing & ((r.status == 1) | (r.status == 2) | (r.status == 4))
    s = s.replace(held=s.held.at[g].set(kv_g),
                  queued=s.queued.at[g].set(jnp.sum(jnp.where(queued_g, need(r), 0.0))),
                  live=s.live.at[g].set(jnp.sum(live_g.astype(jnp.int32))),
                  hol=s.hol.at[g].set(jnp.min(jnp.where(
                      queued_g, jnp.arange(n_req, dtype=jnp.int32), n_req))))
    held_g = kv_g + s.mig_res[g]
    cl_held = jnp.sum(s.held) + jnp.sum(s.mig_res)
    sizes = group_sizes(s.gid)
    cl_cap = jnp.sum(jnp.where(sizes > 0, s.capw, 0.0))
    wf = work.astype(jnp.float32)
    acc = acc.replace(
        peak_kv=jnp.maximum(acc.peak_kv, cl_held),
        max_use=jnp.maximum(acc.max_use, held_g / cap),
        busy_s=acc.busy_s + wf * dt, iters=acc.iters + wf,
        res_token_s=acc.res_token_s + held_g * dt,
        bubble_gpu_s=acc.bubble_gpu_s + wf * bub, pipe_gpu_s=acc.pipe_gpu_s + wf * pipe,
        inst_s=acc.inst_s + wf * k * dt, group_inst_s=acc.group_inst_s + wf * k * k * dt,
        stalls=acc.stalls + jnp.sum((running & (r.stall > t0)).astype(jnp.float32)),
        peak_cap=jnp.maximum(acc.peak_cap, cl_cap))
    rec = s.rec
    if rec is not None:
        it_ = s.it
        rec = rec.replace(admit_iter=jnp.where(first, it_, rec.admit_iter),
                          finish_iter=jnp.where(fin, it_, rec.finish_iter),
                          first_s=jnp.where(tok & jnp.isnan(rec.first_s), t1, rec.first_s),
                          finish_s=jnp.where(fin, t1, rec.finish_s))
    new = s.replace(iclock=jnp.where(mem, t1, s.iclock), acc=acc, rec=None, req=None)
    # the cluster's rows and accumulators from the round if one ran; the requests and
    # the record were only updated under masks within the round (``ing``)
    out = jax.tree.map(lambda a, b: jnp.where(active, a, b), new,
                       mid.replace(rec=None, req=None))
    out = out.replace(it=state.it + 1, clock=jnp.maximum(state.clock, jnp.where(active, t1, 0.0)),
                      picked=jnp.where(active, g, -1),
                      round_s=jnp.where(active & work, T, 0.0), req=r, rec=rec)
    # no completion without a round (fin is within ``ing``); a slot's TTFT and TPOT are
    # read only where it completed
    return out, (jnp.where(active, cl_held, 0.0), fin_out)
