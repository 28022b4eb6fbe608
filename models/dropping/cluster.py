"""Cluster-level rules of the parameter-dropping family (docs/kunserve-semantics.md,
steps 2, 3 and 6): least-loaded dispatch, KunServe's drop plan (paper Fig. 6) with its
KV exchange, and restore. Pure functions on :class:`models.dropping.state.DropState`."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from models import relax

__all__ = ["DISPATCH_PER_STEP", "Loads", "loads", "dispatch", "drop", "restore_end", "restore_start",
           "exchange_time", "group_sizes", "group_sums"]

INF = jnp.inf


class Loads(NamedTuple):
    size: jnp.ndarray     # [N] members of the group named by the row (0: no such group)
    held: jnp.ndarray     # [N] KV tokens held by its running requests (+ reservations)
    queued: jnp.ndarray   # [N] tokens its queued requests need
    busy: jnp.ndarray     # [N] bool it has queued, running or swapped requests
    rg: jnp.ndarray       # [R] each request's group


def need(req):
    return req.target + 1.0


def group_sizes(gid):
    """[N] members of the group named by each row (0: no such group)."""
    rows = jnp.arange(gid.shape[0])
    return jnp.sum((gid[None, :] == rows[:, None]).astype(jnp.float32), axis=1)


def group_sums(r, rg, mask, n: int):
    """(held, queued, live, hol) by group row of the requests in ``mask`` ([R]),
    counted afresh: a masked reduction per row ([N, R]), no scatter. Token sums are of
    whole tokens, so they equal the state's running sums exactly (below 2 ** 24)."""
    n_req = r.status.shape[0]
    on = (rg[None, :] == jnp.arange(n)[:, None]) & mask[None, :]
    q = on & (r.status == 1)[None]
    held = jnp.sum(jnp.where(on & (r.status == 2)[None], r.kv[None], 0.0), axis=1)
    queued = jnp.sum(jnp.where(q, need(r)[None], 0.0), axis=1)
    live = jnp.sum((on & ((r.status == 1) | (r.status == 2) | (r.status == 4))[None])
                   .astype(jnp.int32), axis=1)
    hol = jnp.min(jnp.where(q, jnp.arange(n_req, dtype=jnp.int32)[None], n_req), axis=1)
    return held, queued, live, hol


def loads(s, n: int) -> Loads:
    """The groups' loads from the sums the state keeps (``s.held``, ``s.queued``,
    ``s.live``: O(N), where summing over every request would be O(R) per call)."""
    return Loads(size=group_sizes(s.gid), held=s.held + s.mig_res, queued=s.queued,
                 busy=s.live > 0, rg=s.gid[s.req.inst])


DISPATCH_PER_STEP = 16  # arrivals a step dispatches (more: the next step goes on)


def dispatch(s, arrival, t, ld: Loads):
    """Step 2: undispatched requests with arrival <= t to the least-loaded group, at most
    :data:`DISPATCH_PER_STEP` (a scan, so reverse-mode gradients pass). Returns
    ``(state, loads, more)``: ``more`` when arrivals <= t remain (the step then only
    dispatches). The scan carries only the groups' sums; the requests it dispatches
    (consecutive from ``head``) are written once after it."""
    n_req = arrival.shape[0]

    def body(c, _):
        head, queued, live, hol, iclock = c
        h = jnp.minimum(head, n_req - 1)
        go = (head < n_req) & (arrival[h] <= t)
        load = jnp.where(ld.size > 0, (ld.held + queued) / s.capw, INF)
        g = jnp.argmin(load).astype(jnp.int32)
        a = arrival[h]
        iclock = jnp.where(go & (s.gid == g) & (live[g] == 0), jnp.maximum(iclock, a),
                           iclock)
        return (head + go.astype(jnp.int32),
                jnp.where(go, queued.at[g].add(s.req.target[h] + 1.0), queued),
                jnp.where(go, live.at[g].add(1), live),
                # h is above every queued index: the head of line only if none
                jnp.where(go, hol.at[g].min(h), hol), iclock), \
            (jnp.where(go, h, n_req), g)

    c = (s.head, s.queued, s.live, s.hol, s.iclock)
    (head, queued, live, hol, iclock), (idx, gs) = jax.lax.scan(
        body, c, None, length=DISPATCH_PER_STEP)
    more = (head < n_req) & (arrival[jnp.minimum(head, n_req - 1)] <= t)
    # index n_req (not dispatched) is out of range: dropped
    req = s.req.replace(status=s.req.status.at[idx].set(1, mode="drop"),
                        inst=s.req.inst.at[idx].set(gs, mode="drop"))
    s = s.replace(head=head, iclock=iclock, queued=queued, live=live, hol=hol, req=req)
    return s, ld._replace(queued=queued, busy=live > 0, rg=s.gid[req.inst]), more


def exchange_time(tokens, links, kvb, bw, chunk_bytes, t_chunk):
    """Seconds to move ``tokens`` KV tokens over ``links`` parallel links in chunks."""
    b = tokens * kvb
    return jnp.where(b > 0, b / (links * bw) + jnp.ceil(b / chunk_bytes) * t_chunk, 0.0)


def drop(s, ld: Loads, t, p, x, hw, kvb, cfg, temp, enable=True):
    """Step 3: throttled groups -> the Fig. 6 plan (heap key (size, 0 if throttled
    else 1, gid): the smallest groups, throttled ones first among equals); merged
    groups exchange KV. ``p``: params, ``x``: DropInputs. Returns (state, merges)."""
    n = s.gid.shape[0]
    r = s.req
    rows = jnp.arange(n)
    is_g = ld.size > 0
    elig = is_g & (s.x_end <= t) & ~s.restoring
    # head-of-line queued request of each group: the smallest index (kept per group)
    n_req = r.status.shape[0]
    hol = s.hol
    has_hol = hol < n_req
    need_hol = jnp.where(has_hol, need(r)[jnp.minimum(hol, r.status.shape[0] - 1)], 0.0)
    lim = (1.0 - p["margin"]) * s.capw
    thr = enable & elig & has_hol & (ld.held + need_hol > lim)
    need_total = jnp.sum(jnp.where(thr, ld.held + ld.queued - lim, 0.0))
    gate = jnp.max(jnp.where(elig & has_hol, relax.soft_gt(ld.held + need_hol, lim, temp,
                                                         cfg.token_scale), 0.0))
    freed_unit = x.weight_tokens * relax.straight_through(jnp.maximum(gate, 1e-6))
    chunk_bytes = p["chunk_mib"] * 2.0 ** 20
    big = 4 * n * n  # above every live key: size <= n, so key <= 2 n^2 + 2 n - 1

    def merge(c, _):
        gid, size, alive, hot, iclock, capw, held, x_end, fresh, freed, nm, xt, rows_, \
            hol = c
        # heap key (size, 0 if throttled else 1, gid): size first (Fig. 6); among equal
        # sizes the throttled groups first (the drop happens on the throttled GPUs)
        key = jnp.where(alive, size * (2 * n) + jnp.where(hot, 0, n) + rows, big)
        a = jnp.argmin(key)
        key2 = key.at[a].set(big)
        b = jnp.argmin(key2)
        ok = jnp.any(thr) & (key2[b] < big) & (freed < need_total)
        lo, hi = jnp.minimum(a, b), jnp.maximum(a, b)
        sa, sb = size[a], size[b]
        tm = jnp.maximum(iclock[a], iclock[b])
        tok = jnp.maximum(held[a] * sb, held[b] * sa) / jnp.maximum(sa + sb, 1.0)
        xe = tm + exchange_time(tok, jnp.minimum(sa, sb), kvb, hw.network_bw, chunk_bytes,
                                x.t_chunk)
        xe = jnp.maximum(xe, jnp.maximum(jnp.where(fresh[a], x_end[a], -INF),
                                         jnp.where(fresh[b], x_end[b], -INF)))
        mem = (gid == a) | (gid == b)
        gid = jnp.where(ok & mem, lo, gid)
        iclock = jnp.where(ok & mem, tm, iclock)
        upd = lambda v, new: jnp.where(ok, v.at[hi].set(0).at[lo].set(new), v)  # noqa: E731
        capw_new = capw[a] + capw[b] + freed_unit
        return (gid, upd(size, sa + sb), jnp.where(ok, alive.at[hi].set(False), alive),
                # the merged group holds the throttled demand of its parts
                jnp.where(ok, hot.at[hi].set(False).at[lo].set(hot[a] | hot[b]), hot),
                iclock, jnp.where(ok, capw.at[lo].set(capw_new), capw),
                upd(held, held[a] + held[b]),
                jnp.where(ok, x_end.at[lo].set(xe), x_end),
                jnp.where(ok, fresh.at[lo].set(True).at[hi].set(False), fresh),
                freed + jnp.where(ok, x.weight_tokens, 0.0), nm + ok.astype(jnp.int32),
                xt + jnp.where(ok, 2.0 * tok, 0.0),
                # the state's group rows: sums add, the head of line is the smaller
                tuple(upd(v, v[a] + v[b]) for v in rows_),
                jnp.where(ok, hol.at[hi].set(n_req).at[lo].set(jnp.minimum(hol[a], hol[b])),
                          hol)), None

    c0 = (s.gid, ld.size, elig, thr, s.iclock, s.capw, ld.held, s.x_end,
          jnp.zeros(n, bool), jnp.float32(0.0), jnp.int32(0), jnp.float32(0.0),
          (s.held, s.queued, s.live), s.hol)
    c, _ = jax.lax.scan(merge, c0, None, length=max(n - 1, 0))
    gid, _, _, _, iclock, capw, _, x_end, fresh, _, nm, xt, (held, queued, live), hol = c
    rg = gid[r.inst]
    hit = (r.status == 2) & fresh[rg]
    new_stall = jnp.where(hit, jnp.maximum(r.stall, x_end[rg]), r.stall)
    stalled = jnp.sum(jnp.where(hit, new_stall - jnp.maximum(r.stall, iclock[rg]), 0.0))
    acc = s.acc.replace(drops=s.acc.drops + nm, exchanged=s.acc.exchanged + xt,
                        stall_s=s.acc.stall_s + stalled)
    s = s.replace(gid=gid, iclock=iclock, capw=capw, x_end=x_end, acc=acc,
                  held=held, queued=queued, live=live, hol=hol,
                  req=r.replace(stall=new_stall))
    return s, nm


def restore_end(s, g, t0, p, x, hw, kvb, C, active=True):
    """Step 6a: a restoring group whose pull ended splits into singletons; homes by a
    balanced cut; running requests stall for the KV gather. Nothing happens unless
    ``active`` (the step runs a round)."""
    n = s.gid.shape[0]
    r = s.req
    mem = s.gid == g
    k = jnp.sum(mem.astype(jnp.float32))
    fire = active & s.restoring[g] & (t0 >= s.pull_end[g])
    rank = jnp.cumsum(mem.astype(jnp.int32)) - 1
    by_rank = jnp.argmax((rank[None, :] == jnp.arange(n)[:, None]) & mem[None, :], axis=1)
    rg = s.gid[r.inst]
    ing = rg == g
    run = ing & (r.status == 2)
    kv = jnp.where(run, r.kv, 0.0)
    K = jnp.sum(kv)
    before = jnp.cumsum(kv) - kv
    m_run = jnp.minimum(k - 1.0, jnp.floor(k * before / jnp.maximum(K, 1e-9)))
    m_q = jnp.mod(jnp.arange(r.status.shape[0]), jnp.maximum(k, 1.0).astype(jnp.int32))
    m = jnp.where(run, m_run.astype(jnp.int32), m_q)
    moved = ing & ((r.status == 1) | run | (r.status == 4))
    home = jnp.broadcast_to(by_rank[0], m.shape)  # by_rank[m], as selects (no gather)
    for j in range(1, n):
        home = jnp.where(m == j, by_rank[j], home)
    inst = jnp.where(fire & moved, home, r.inst)
    share = K * (1.0 - 1.0 / jnp.maximum(k, 1.0)) / jnp.maximum(k, 1.0)
    xs = exchange_time(share, 1.0, kvb, hw.network_bw, p["chunk_mib"] * 2.0 ** 20, x.t_chunk)
    stall = jnp.where(fire & run, jnp.maximum(r.stall, t0 + xs), r.stall)
    rows = jnp.arange(n)
    split = fire & mem
    acc = s.acc.replace(restores=s.acc.restores + fire.astype(jnp.float32),
                        exchanged=s.acc.exchanged + jnp.where(fire, K * (1.0 - 1.0 / jnp.maximum(k, 1.0)), 0.0),
                        stall_s=s.acc.stall_s + jnp.where(fire, jnp.sum(jnp.where(run, xs, 0.0)), 0.0))
    r = r.replace(inst=inst, stall=stall)
    # the new singletons' sums (each member is its own group: row = home)
    held, queued, live, hol = group_sums(r, inst, moved, n)
    return s.replace(gid=jnp.where(split, rows, s.gid),
                     capw=jnp.where(split, C, s.capw),
                     x_end=jnp.where(split, t0 + xs, s.x_end),
                     restoring=jnp.where(split, False, s.restoring),
                     held=jnp.where(split, held, s.held),
                     queued=jnp.where(split, queued, s.queued),
                     live=jnp.where(split, live, s.live),
                     hol=jnp.where(split, hol, s.hol), acc=acc, req=r)


def restore_start(s, g, t0, ld: Loads, p, x, hw, kvb, C, cfg, temp):
    """Step 6b: a group whose demand fell below theta of its undropped capacity starts
    pulling its dropped weights (its capacity returns to k C at once)."""
    k = ld.size[g]
    lim = p["theta"] * k * C
    demand = ld.held[g] + ld.queued[g]
    gate = relax.soft_ge(lim, demand, temp, cfg.token_scale)
    fire = (k > 1) & ~s.restoring[g] & (s.x_end[g] <= t0) & relax.hard(gate)
    st = relax.straight_through(jnp.maximum(gate, 1e-6))
    cap = k * C + (k - 1.0) * x.weight_tokens * (1.0 - st)
    pull = t0 + x.weight_tokens * kvb * (1.0 - 1.0 / jnp.maximum(k, 1.0)) / hw.network_bw
    return s.replace(restoring=s.restoring.at[g].set(s.restoring[g] | fire),
                     pull_end=jnp.where(fire, s.pull_end.at[g].set(pull), s.pull_end),
                     capw=jnp.where(fire, s.capw.at[g].set(cap), s.capw))
