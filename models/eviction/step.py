"""One iteration of the priced-eviction server: Token-PD, FIFO, LRU, H2O and no
eviction on one continuous-batching loop (vLLM v0 prefill-first scheduling).

Implements ``docs/tokenpd-semantics.md`` (numbered steps in the comments). A stream's
tokens are its ring (the last W positions, one entry each) and its old groups (counts
per (true class, predicted class)); every policy looks only at those, so the counts are
exact. Structure (admission, preemption, the heap order) is exact at every temperature;
Token-PD's keep rule is soft when T > 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hardware import Work, work_time
from models import relax
from models.eviction.attention import token_groups
from models.eviction.state import (EvictAcc, EvictPolicy, EvictRecord, EvictSlots,
                                   EvictState, K_CLASSES, N_GROUPS)
from models.family import IterLog
from models.server import finish_outcomes, hist_add, nth_true

__all__ = ["Returns", "budget_tokens", "returns", "step", "stream_tier"]

_BIG = jnp.iinfo(jnp.int32).max
_KV_READ = 16.0  # tokens per KV read (vLLM's block)


def budget_tokens(params, cfg):
    """Token-PD's budget M in tokens (baselines are scored against half the capacity)."""
    share = params["budget"] if "budget" in params else jnp.float32(0.5)
    return share * cfg.capacity_tokens


class Returns(NamedTuple):
    """Per unit (``[S, G + W]``: old groups, then ring entries) of every slot."""

    n: jax.Array       # tokens in the unit
    x: jax.Array       # kept
    a: jax.Array       # realised share A of each token (per decode query)
    r_hat: jax.Array   # predicted return
    var: jax.Array     # predicted risk sigma^2
    k: jax.Array       # true class
    ring: jax.Array    # [U] bool the unit is a ring entry
    age: jax.Array     # ring entries' age (0 newest), -1 for old groups
    length: jax.Array  # [S] L


def _length(sl: EvictSlots, stored=None):
    """Tokens a stream holds: ``P + gen - 1`` after its first iteration (``P`` at its
    first admission; ``stored`` marks re-admitted streams, whose pending token is
    already stored: ``P + gen``)."""
    base = sl.prompt + jnp.maximum(sl.gen - 1, 0)
    return base if stored is None else base + stored.astype(base.dtype)


def returns(sl: EvictSlots, ex, window: int, stored=None) -> Returns:
    """Realised and predicted returns of every unit (the attention model)."""
    f32 = jnp.float32
    n_s = sl.req.shape[0]
    length = _length(sl, stored)
    gid = jnp.arange(N_GROUPS, dtype=jnp.int32)
    j = jnp.arange(window, dtype=jnp.int32)
    age = jnp.mod(length[:, None] - 1 - j[None, :], window)
    ring_ok = (sl.ring_g >= 0) & (age < length[:, None])
    rg = jnp.maximum(sl.ring_g, 0)
    k_old, kh_old = gid // K_CLASSES, gid % K_CLASSES
    k_ring, kh_ring = rg // K_CLASSES, rg % K_CLASSES
    n = jnp.concatenate([sl.old_n, ring_ok.astype(f32)], 1)
    x = jnp.concatenate([sl.old_x, jnp.where(ring_ok, sl.ring_x, 0.0)], 1)
    k = jnp.concatenate([jnp.broadcast_to(k_old, (n_s, N_GROUPS)), k_ring], 1)
    kh = jnp.concatenate([jnp.broadcast_to(kh_old, (n_s, N_GROUPS)), kh_ring], 1)
    h_tot = jnp.sum(n * ex.h[k], 1, keepdims=True)
    m_tot = jnp.sum(n * ex.m[kh], 1, keepdims=True)
    h_tot = jnp.where(h_tot > 0, h_tot, 1.0)  # empty slots: no NaN in the gradient
    m_tot = jnp.where(m_tot > 0, m_tot, 1.0)
    w_r = ex.recency
    rec = jnp.where(jnp.arange(N_GROUPS + window) >= N_GROUPS, 1.0, 0.0)[None, :] * (
        w_r / jnp.maximum(jnp.minimum(length, window), 1).astype(f32))[:, None]
    a = rec + (1.0 - w_r) * ex.h[k] / h_tot
    r_hat = rec + (1.0 - w_r) * ex.m[kh] / m_tot
    var = ((1.0 - w_r) / m_tot) ** 2 * ex.v[kh]
    ring = jnp.arange(N_GROUPS + window) >= N_GROUPS
    age_u = jnp.concatenate([jnp.full((n_s, N_GROUPS), -1, jnp.int32), age], 1)
    return Returns(n, x, a, r_hat, var, k, ring, age_u, length)


def _take_in_order(amount, need, perm):
    """Take ``need`` in total from ``amount`` [S] in the order ``perm`` (earliest
    first): how much each entry gives."""
    a = amount[perm]
    before = jnp.cumsum(a) - a
    out = jnp.clip(need - before, 0.0, a)
    return jnp.zeros_like(amount).at[perm].set(out)


def _evict_old(x, n_s: int, elig, need, perm):
    """FIFO order over the old groups ``elig`` [S, U] of the oldest stream first,
    proportionally within a stream. Returns (x, evicted)."""
    ex = jnp.where(elig, x, 0.0)
    per = jnp.sum(ex, 1)
    take = _take_in_order(per, need, perm)
    frac = jnp.where(per > 0, take / jnp.maximum(per, 1e-30), 0.0)
    return x - ex * frac[:, None], jnp.sum(take)


def _h2o(ret: Returns, run, params, window: int):
    """H2O per stream: the r newest kept; of the rest at most k, lowest class first
    (old groups in gid order, then ring entries oldest first)."""
    r, k_keep = params["r"], params["k"]
    cand = run[:, None] & ~(ret.ring[None, :] & (ret.age < r))
    u = jnp.arange(ret.n.shape[1])
    key = ret.k * 1000 + jnp.where(ret.ring[None, :], 100 + (window - ret.age), u[None, :])
    key = jnp.where(cand, key, _BIG)
    perm = jnp.argsort(key, axis=1, stable=True)
    xc = jnp.take_along_axis(jnp.where(cand, ret.x, 0.0), perm, 1)
    excess = jnp.maximum(jnp.sum(xc, 1) - k_keep, 0.0)
    before = jnp.cumsum(xc, 1) - xc
    ev_s = jnp.clip(excess[:, None] - before, 0.0, xc)
    ev = jnp.zeros_like(ret.x).at[jnp.arange(ret.x.shape[0])[:, None], perm].set(ev_s)
    return ret.x - ev, jnp.sum(ev)


def _ukey(v):
    """uint32 keys in the order of the float32 values ``v`` (IEEE bits, sign folded)."""
    i = jax.lax.bitcast_convert_type(v.astype(jnp.float32), jnp.int32)
    i = jnp.where(i < 0, i ^ jnp.int32(0x7FFFFFFF), i)
    return jax.lax.bitcast_convert_type(i, jnp.uint32) ^ jnp.uint32(0x80000000)


def _take_lowest(w, key, need):
    """Take ``need`` in total from the amounts ``w`` (flat) in increasing ``key``
    (float32), ties by flat index: how much each entry gives. A radix select of the
    threshold key (four 256-bin histograms) instead of a sort."""
    w = jnp.maximum(w, 0.0)
    return jax.lax.cond(need > 0, _take_lowest_on, lambda w, k, n: jnp.zeros_like(w),
                        w, key, need)


def _take_lowest_on(w, key, need):
    u = _ukey(jax.lax.stop_gradient(key))
    ws = jax.lax.stop_gradient(w)
    # radix select, 8 bits at a time: the smallest key T with sum(w[u <= T]) >= need
    thr, base = jnp.uint32(0), jnp.float32(0.0)
    for shift in (24, 16, 8, 0):
        same = (jnp.ones_like(u, bool) if shift == 24
                else (u >> (shift + 8)) == (thr >> (shift + 8)))
        digit = ((u >> shift) & jnp.uint32(0xFF)).astype(jnp.int32)
        hist = jnp.zeros(256, jnp.float32).at[digit].add(jnp.where(same, ws, 0.0))
        c = base + jnp.cumsum(hist)
        b = jnp.minimum(jnp.sum(c < need), 255)
        base = base + jnp.sum(jnp.where(jnp.arange(256) < b, hist, 0.0))
        thr = thr | (b.astype(jnp.uint32) << shift)
    lower = u < thr
    rest = need - jnp.sum(jnp.where(lower, w, 0.0))
    tie = jnp.where(u == thr, w, 0.0)
    before = jnp.cumsum(tie) - tie
    return jnp.where(lower, w, jnp.clip(rest - before, 0.0, tie))


def _heap(x, g, run, need):
    """Token-PD's shared heap: evict ``need`` kept tokens in increasing excess ``g``,
    ties by flat unit index."""
    key = jnp.where(run[:, None], g, jnp.inf).reshape(-1)
    ev = _take_lowest(x.reshape(-1), key, need)
    return x - ev.reshape(x.shape), jnp.sum(ev)


def _fill(amount, key, room):
    """Take up to ``room`` from ``amount`` [S, U] in increasing ``key``, ties by flat
    index (Token-PD's restores: the largest excess first)."""
    return _take_lowest(amount.reshape(-1), key.reshape(-1), room).reshape(amount.shape)


def _preempt_latest(kept_s, grow_s, run, order, cap):
    """vLLM's rule: the longest prefix (admission order) of running streams whose kept
    tokens and appends fit ``cap`` (half a token of slack: fluid evictions leave float32
    rounding in the sums); the rest are preempted."""
    perm = jnp.argsort(jnp.where(run, order, _BIG))
    tot = jnp.where(run, kept_s + grow_s, 0.0)[perm]
    ok_s = (jnp.cumsum(tot) <= cap + 0.5) | ~run[perm]
    ok_s = jnp.cumprod(ok_s.astype(jnp.int32)).astype(bool)
    keep = jnp.zeros_like(run).at[perm].set(ok_s)
    return run & ~keep


def _oracle(ret: Returns, dec, budget):
    """The clairvoyant's utility: the largest sum x * A over the decoding streams'
    tokens with sum x <= budget (fractional knapsack). A token's share depends only on
    its stream, true class and whether it is in the ring, so the knapsack runs over
    those 8 groups per stream."""
    k = jax.nn.one_hot(ret.k, K_CLASSES, dtype=jnp.float32)          # [S, U, K]
    ring = ret.ring[None, :, None]
    n = jnp.where(dec[:, None], ret.n, 0.0)[:, :, None] * k
    a = ret.a[:, :, None] * k
    n8 = jnp.concatenate([jnp.sum(jnp.where(ring, 0.0, n), 1),
                          jnp.sum(jnp.where(ring, n, 0.0), 1)], 1)    # [S, 2K]
    # every token of a (stream, class, ring?) group has the same share: the largest
    a8 = jnp.concatenate([jnp.max(jnp.where(ring, 0.0, a), 1),
                          jnp.max(jnp.where(ring, a, 0.0), 1)], 1)
    a8 = jnp.where(n8 > 0, a8, -1.0).reshape(-1)
    take = _take_lowest(n8.reshape(-1), -a8, budget)
    return jnp.sum(take * jnp.maximum(a8, 0.0))


def _append(sl: EvictSlots, mask, ex, window: int):
    """Store position ``P + gen - 1`` (kept) of the ``mask``ed streams: it takes ring
    entry ``p mod W``, whose previous position moves into its old group."""
    pos = sl.prompt + sl.gen - 1
    hit = mask[:, None] & (jnp.arange(window)[None, :] == jnp.mod(pos, window)[:, None])
    leave_g = jnp.sum(jnp.where(hit, sl.ring_g, 0), 1)
    leave = mask & (jnp.sum(jnp.where(hit, (sl.ring_g >= 0).astype(jnp.int32), 0), 1) > 0) \
        & (pos - window >= 0)
    leave_x = jnp.sum(jnp.where(hit, sl.ring_x, 0.0), 1)
    onehot = (jnp.arange(N_GROUPS)[None, :] == leave_g[:, None]) & leave[:, None]
    g_new = token_groups(sl.req, pos, ex.cum_p, ex.cum_conf)
    return sl.replace(
        old_n=sl.old_n + onehot, old_x=sl.old_x + jnp.where(onehot, leave_x[:, None], 0.0),
        ring_g=jnp.where(hit, g_new[:, None], sl.ring_g),
        ring_x=jnp.where(hit, 1.0, sl.ring_x))


def stream_tier(prompt, bounds):
    """Each stream's priority tier (token-pd-tiers): the number of the static ``bounds``
    (ascending prompt tokens) <= its prompt length. The prompt never changes, so the
    tier is the one fixed at admission."""
    b = jnp.asarray(bounds, jnp.int32)
    return jnp.sum(prompt[:, None] >= b[None, :], 1)


def _per_stream(v, tier):
    """A Token-PD value as seen by each stream: ``v`` itself (token-pd: a scalar) or,
    with a ``tier`` per stream, the stream's tier's entry of ``v`` as a column [S, 1]."""
    return v if tier is None else v[tier][:, None]


def _soft(v, t, mu):
    """P(v >= 0) for an excess ``v`` in attention share per token; the temperature is
    relative to the price (floored: a price decayed to ~0 keeps a finite scale)."""
    return relax.soft_ge(v, 0.0, t, jnp.maximum(mu, 1e-8))


def step(st: EvictState, inputs, hw, params, t, pol: EvictPolicy, fopts, log: bool = False):
    """One iteration (docs/tokenpd-semantics.md steps 1-7)."""
    wl, cfg, ex = inputs.wl, inputs.cfg, inputs.extra
    sl, acc = st.slots, st.acc
    n, n_s, window = wl.size, cfg.n_slots, int(fopts.window)
    f32 = jnp.float32
    cap = cfg.capacity_tokens
    # 1 idle jump
    head_arr = jnp.where(st.head < n, wl.arrival_s[jnp.minimum(st.head, n - 1)], jnp.inf)
    idle = ~jnp.any(sl.status > 0)
    clock = jnp.where(idle & (head_arr > st.clock) & jnp.isfinite(head_arr), head_arr,
                      st.clock)
    # 2 admission (vLLM v0 prefill-first)
    run0 = sl.status == 1
    kept0 = jnp.sum(sl.old_x, 1) + jnp.sum(sl.ring_x, 1)
    if pol.kind in ("none", "h2o"):
        protected = jnp.sum(jnp.where(run0, kept0, 0.0))
    elif pol.kind in ("fifo", "lru"):
        protected = jnp.sum(jnp.where(run0, jnp.sum(sl.ring_x, 1), 0.0))
    else:
        protected = f32(0.0)
    a_w = cfg.admit_window
    perm0 = jnp.argsort(jnp.where(sl.status > 0, sl.order, _BIG))
    pre_s = (sl.status == 2)[perm0]
    rank = jnp.cumsum(pre_s.astype(jnp.int32)) - 1
    pre_slot = jnp.full(a_w, n_s, jnp.int32).at[jnp.where(pre_s, rank, a_w)].set(
        perm0.astype(jnp.int32), mode="drop")
    n_pre = jnp.minimum(jnp.sum(sl.status == 2), a_w)
    j = jnp.arange(a_w, dtype=jnp.int32)
    is_pre = j < n_pre
    new = st.head + j - n_pre
    nc = jnp.clip(new, 0, n - 1)
    free_slot = nth_true(sl.status == 0, jnp.maximum(j - n_pre, 0))
    ps = jnp.minimum(pre_slot, n_s - 1)
    c_slot = jnp.where(is_pre, pre_slot, free_slot)
    c_req = jnp.where(is_pre, sl.req[ps], nc)
    c_prompt = jnp.where(is_pre, sl.prompt[ps], wl.prompt_tokens[nc])
    c_gen = jnp.where(is_pre, sl.gen[ps], 0)
    c_need = (c_prompt + c_gen).astype(f32)
    present = jnp.where(is_pre, True, (new < n) & wl.valid[nc]
                        & (wl.arrival_s[nc] <= clock) & (free_slot < n_s))
    n_run0 = jnp.sum(run0)
    ok = (present & (n_run0 + j + 1 <= cfg.max_batch)
          & ((j == 0) | (jnp.cumsum(c_need) <= cfg.max_prefill))
          & (protected + jnp.cumsum(c_need) <= cap - cfg.watermark_tokens))
    adm = jnp.cumprod(ok.astype(jnp.int32)).astype(bool)
    n_adm = jnp.sum(adm)
    prefill_it = n_adm > 0
    drop = (n_run0 == 0) & ~prefill_it & present[0] & (c_need[0] > cap - cfg.watermark_tokens)
    # place the admitted (new ones into free slots, preempted ones in place)
    dst = jnp.where(adm, c_slot, n_s + j)

    def put(x, old):
        return old.at[dst].set(x, mode="drop", unique_indices=True)

    placed = put(jnp.ones(a_w, bool), jnp.zeros(n_s, bool))
    first_adm = placed & ~put(is_pre, jnp.zeros(n_s, bool))
    readm = placed & ~first_adm
    new_old = put(ex.old0[nc], jnp.zeros_like(sl.old_n))
    new_ring = put(ex.ring0[nc], jnp.full_like(sl.ring_g, -1))
    old_n = jnp.where(first_adm[:, None], new_old, sl.old_n)
    ring_g = jnp.where(first_adm[:, None], new_ring, sl.ring_g)
    sl = sl.replace(
        req=put(c_req, sl.req), prompt=put(c_prompt, sl.prompt),
        output=put(jnp.where(is_pre, sl.output[ps], wl.output_tokens[nc]), sl.output),
        gen=put(c_gen, sl.gen), status=jnp.where(placed, 1, sl.status),
        order=put(st.counter + j, sl.order), weight=jnp.where(placed, 1.0, sl.weight),
        arrival=put(jnp.where(is_pre, sl.arrival[ps], wl.arrival_s[nc]), sl.arrival),
        t_admit=jnp.where(first_adm, clock, sl.t_admit), old_n=old_n,
        old_x=jnp.where(placed[:, None], old_n, sl.old_x), ring_g=ring_g,
        ring_x=jnp.where(placed[:, None], (ring_g >= 0).astype(f32), sl.ring_x))
    sl = _append(sl, readm, ex, window)  # the token it had sampled, recomputed too
    run = sl.status == 1
    dec = run & ~prefill_it
    grow_s = dec.astype(f32)
    # 3 policy pass
    ret = returns(sl, ex, window, readm)
    x = ret.x
    kept_in = jnp.sum(x)
    restored_s = jnp.zeros(n_s, f32)
    mu = st.mu
    if pol.kind == "pd":
        # token-pd-tiers: a stream's tokens see its tier's lam, delta and price
        tier = stream_tier(sl.prompt, fopts.tier_bounds) if pol.tiered else None
        lam_s, delta_s, mu_s = (_per_stream(v, tier)
                                for v in (params["lam"], params["delta"], mu))
        g = ret.r_hat - lam_s * ret.var - mu_s
        x = jnp.where(run[:, None], x * _soft(g, t, mu_s), x)
        need = jnp.maximum(jnp.sum(x) + jnp.sum(grow_s) - cap, 0.0)
        x, _ = _heap(x, g, run, need)
        # restores: evicted tokens worth delta * mu, best first, into the room left
        want = jnp.where(run[:, None], (ret.n - ret.x) * _soft(
            g - delta_s * mu_s, t, mu_s), 0.0)
        room = jnp.maximum(cap - jnp.sum(grow_s) - jnp.sum(x), 0.0)
        back = _fill(want, -g, room)
        x = x + back
        restored_s = jnp.sum(back, 1)
    elif pol.kind == "h2o":
        x, _ = _h2o(ret, run, params, window)
    elif pol.kind in ("fifo", "lru"):
        perm = jnp.argsort(jnp.where(run, sl.order, _BIG))
        old = run[:, None] & ~ret.ring[None, :]
        # fluid amounts: a little more (1e-5 of the capacity), so float32 rounding of the
        # sums cannot leave the kept tokens above the capacity
        over = jnp.sum(x) + jnp.sum(grow_s) - cap
        need = jnp.where(over > 0, over + 0.01 + 1e-5 * cap, 0.0)
        if pol.kind == "lru":
            h_tot = jnp.sum(ret.n * inputs.extra.h[ret.k], 1, keepdims=True)
            used = ((1.0 - ex.recency) * ex.h[ret.k] / jnp.where(h_tot > 0, h_tot, 1.0)
                    >= 1.0 / jnp.maximum(ret.length, 1)[:, None].astype(f32))
            x, took = _evict_old(x, n_s, old & ~used, need, perm)
            x, _ = _evict_old(x, n_s, old & used, need - took, perm)
        else:
            x, _ = _evict_old(x, n_s, old, need, perm)
    kept_s = jnp.sum(x, 1)
    evicted = jnp.maximum(kept_in + jnp.sum(restored_s) - jnp.sum(kept_s), 0.0)
    if pol.kind == "pd":
        preempt = jnp.zeros(n_s, bool)
    else:
        preempt = _preempt_latest(jax.lax.stop_gradient(kept_s), grow_s, run, sl.order, cap)
    x = jnp.where(preempt[:, None], 0.0, x)
    run = run & ~preempt
    dec = dec & ~preempt
    grow_s = jnp.where(preempt, 0.0, grow_s)
    kept_s = jnp.sum(x, 1)
    k_tot = jnp.sum(kept_s)
    sl = sl.replace(status=jnp.where(preempt, 2, sl.status),
                    old_x=x[:, :N_GROUPS], ring_x=x[:, N_GROUPS:])
    # 4 work and time
    adm_tok = jnp.where(placed & ~preempt, (sl.prompt + sl.gen).astype(f32), 0.0)
    length = ret.length.astype(f32)
    rest = jnp.where(run, restored_s, 0.0)
    prefill = jnp.sum(adm_tok) + jnp.sum(rest)
    pairs = jnp.sum(adm_tok * (adm_tok + 1.0) / 2.0) + jnp.sum(rest * length)
    dec_seqs = jnp.sum(dec).astype(f32)
    dec_ctx = jnp.sum(jnp.where(dec, kept_s + 1.0, 0.0))
    busy = (prefill > 0) | (dec_seqs > 0)
    work = Work(prefill, dec_seqs, dec_ctx, f32(_KV_READ), f32(0.0), pairs)
    dt = jnp.where(busy, work_time(hw, work), 0.0)
    dt_plain = jnp.where(busy, work_time(hw, Work(
        jnp.sum(adm_tok), dec_seqs, dec_ctx, f32(_KV_READ), f32(0.0),
        jnp.sum(adm_tok * (adm_tok + 1.0) / 2.0))), 0.0)
    clock = clock + dt
    # 5 quality (decode iterations, before the appends)
    m_budget = budget_tokens(params, cfg)
    lost = jnp.sum(jnp.where(dec[:, None], (ret.n - x) * ret.a, 0.0))
    util = jnp.sum(jnp.where(dec[:, None], x * ret.a, 0.0))
    oracle = _oracle(jax.lax.stop_gradient(ret), dec, m_budget)
    peak = k_tot + jnp.sum(grow_s)
    # 6 appends, first tokens, completions
    progressed = dec | placed & ~preempt
    first = progressed & (sl.gen == 0)
    sl = _append(sl, dec, ex, window)
    sl = sl.replace(gen=jnp.where(progressed, sl.gen + 1, sl.gen),
                    t_first=jnp.where(first, clock, sl.t_first))
    acc = acc.replace(
        preemptions=acc.preemptions + jnp.sum(preempt), dropped=acc.dropped + drop,
        queue_s=acc.queue_s + jnp.sum(jnp.where(first_adm & ~preempt,
                                                clock - dt - sl.arrival, 0.0)),
        peak_kv=jnp.maximum(acc.peak_kv, peak), max_use=jnp.maximum(acc.max_use, peak / cap),
        busy_s=acc.busy_s + dt, iters=acc.iters + busy,
        res_token_s=acc.res_token_s + peak * dt, kept_token_s=acc.kept_token_s + peak * dt,
        lost=acc.lost + lost, queries=acc.queries + dec_seqs, utility=acc.utility + util,
        oracle=acc.oracle + oracle,
        viol_pos=acc.viol_pos + jnp.where(dec_seqs > 0, jnp.maximum(k_tot - m_budget, 0.0),
                                          0.0),
        viol_signed=acc.viol_signed + jnp.where(dec_seqs > 0, k_tot - m_budget, 0.0),
        evicted=acc.evicted + evicted, restored=acc.restored + jnp.sum(rest),
        recompute_s=acc.recompute_s + (dt - dt_plain))
    sl, acc, fin, rec = _complete(sl, acc, st.rec, first_adm & ~preempt, first, clock,
                                  st.it, n, t, cfg, hw)
    # drop: a new head request is skipped, a preempted one freed
    drop_pre = drop & is_pre[0]
    dslot = (jnp.arange(n_s) == ps[0]) & drop_pre
    sl = sl.replace(status=jnp.where(dslot, 0, sl.status), req=jnp.where(dslot, -1, sl.req))
    head = st.head + jnp.sum(adm & ~is_pre) + (drop & ~is_pre[0])
    # 7 price (token-pd-tiers: every tier's price from the same K, elementwise)
    if pol.kind == "pd":
        k_fb = jax.lax.stop_gradient(k_tot) if fopts.price_grad == "stop" else k_tot
        mu = jnp.where(busy, mu * jnp.exp(params["eta"] * (k_fb - m_budget) / m_budget), mu)
    new = EvictState(slots=sl, head=head, clock=clock, it=st.it + 1,
                     counter=st.counter + n_adm.astype(jnp.int32), mu=mu, acc=acc, rec=rec)
    out = (peak, fin)
    if log:
        return new, out + (IterLog(work=work, busy=busy, clock=clock),)
    return new, out


def _complete(sl: EvictSlots, acc: EvictAcc, rec, admitted_new, first, clock, it, n, t,
              cfg, hw):
    """Step 6: finished streams free their slot; outcomes enter the accumulators."""
    done = (sl.status == 1) & (sl.gen >= sl.output)
    acc, fin = finish_outcomes(acc, sl, done, clock, t, cfg, hw)
    e2e = clock - sl.arrival + hw.request_overhead_s
    acc = acc.replace(e2e_hist=hist_add(acc.e2e_hist, jax.lax.stop_gradient(e2e),
                                        jnp.where(done, 1.0, 0.0)))
    if rec is not None:
        req = sl.req
        rec = EvictRecord(
            admit_iter=rec.admit_iter.at[jnp.where(admitted_new, req, n)].set(it,
                                                                               mode="drop"),
            finish_iter=rec.finish_iter.at[jnp.where(done, req, n)].set(it, mode="drop"),
            first_s=rec.first_s.at[jnp.where(first, req, n)].set(clock, mode="drop"),
            finish_s=rec.finish_s.at[jnp.where(done, req, n)].set(clock, mode="drop"))
    z = jnp.zeros_like
    sl = sl.replace(status=jnp.where(done, 0, sl.status), req=jnp.where(done, -1, sl.req),
                    old_n=jnp.where(done[:, None], 0.0, sl.old_n),
                    old_x=jnp.where(done[:, None], 0.0, sl.old_x),
                    ring_g=jnp.where(done[:, None], -1, sl.ring_g),
                    ring_x=jnp.where(done[:, None], z(sl.ring_x), sl.ring_x))
    return sl, acc, fin, rec
