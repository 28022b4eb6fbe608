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

__all__ = ["Returns", "budget_tokens", "kept_limit", "returns", "step", "stream_tier"]

_BIG = jnp.iinfo(jnp.int32).max
_KV_READ = 16.0  # tokens per KV read (vLLM's block)


def budget_tokens(params, cfg):
    """Token-PD's budget M in tokens (baselines are scored against half the capacity)."""
    share = params["budget"] if "budget" in params else jnp.float32(0.5)
    return share * cfg.capacity_tokens


def kept_limit(pol: EvictPolicy, m_budget, cap):
    """The most tokens the system may hold after its pass (appends included): Token-PD's
    hard budget ``floor(min(M, C))`` (the paper's constraint (3); whole tokens, so the
    exact heap takes whole tokens), the capacity ``C`` for the baselines."""
    if pol.kind == "pd":
        return jnp.floor(jnp.minimum(m_budget, cap))
    return cap


class Returns(NamedTuple):
    """Per unit (``[S, G + W]``: old groups, then ring entries) of every slot, and the
    per-slot normalisers the per-class values (:func:`_class_values`) are made of."""

    n: jax.Array       # tokens in the unit
    x: jax.Array       # kept
    a: jax.Array       # realised share A of each token (per decode query)
    r_hat: jax.Array   # predicted return
    var: jax.Array     # predicted risk sigma^2
    k: jax.Array       # true class
    kh: jax.Array      # predicted class
    ring: jax.Array    # [U] bool the unit is a ring entry
    age: jax.Array     # ring entries' age (0 newest), -1 for old groups
    length: jax.Array  # [S] L
    h_tot: jax.Array   # [S, 1] sum of n * h_k (1 for an empty slot)
    m_tot: jax.Array   # [S, 1] sum of n * m_k_hat (1 for an empty slot)
    rec: jax.Array     # [S] a ring token's recency share w_r / min(L, W)


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
    rec_s = w_r / jnp.maximum(jnp.minimum(length, window), 1).astype(f32)
    rec = jnp.where(jnp.arange(N_GROUPS + window) >= N_GROUPS, 1.0, 0.0)[None, :] * (
        rec_s[:, None])
    a = rec + (1.0 - w_r) * ex.h[k] / h_tot
    r_hat = rec + (1.0 - w_r) * ex.m[kh] / m_tot
    var = ((1.0 - w_r) / m_tot) ** 2 * ex.v[kh]
    ring = jnp.arange(N_GROUPS + window) >= N_GROUPS
    age_u = jnp.concatenate([jnp.full((n_s, N_GROUPS), -1, jnp.int32), age], 1)
    return Returns(n, x, a, r_hat, var, k, kh, ring, age_u, length, h_tot, m_tot, rec_s)


# -- per class: a unit's returns depend only on its stream, its class and whether it is
# in the ring, so the policies' orders and the clairvoyant's knapsack run over the
# [S, 2K] (slot, ring?, class) entries, not over the [S, G + W] units

def _class_values(ret: Returns, ex, by_true: bool):
    """The realised share ``A`` (``by_true``: per true class) or the predicted return and
    risk (per predicted class) of every (slot, ring?, class) entry, ``[S, 2K]`` (the old
    groups' K classes, then the ring's): the same arithmetic as :func:`returns` per unit,
    so a unit's value equals its entry's bit for bit."""
    w_r = ex.recency
    c = jnp.arange(2 * K_CLASSES) % K_CLASSES
    rec = jnp.where(jnp.arange(2 * K_CLASSES) >= K_CLASSES, 1.0, 0.0)[None, :] * (
        ret.rec[:, None])
    if by_true:
        return rec + (1.0 - w_r) * ex.h[c] / ret.h_tot
    r_hat = rec + (1.0 - w_r) * ex.m[c] / ret.m_tot
    var = ((1.0 - w_r) / ret.m_tot) ** 2 * ex.v[c]
    return r_hat, var


def _unit_values(v, ret: Returns, by_true: bool):
    """Each unit's entry of the per-entry values ``v`` [S, 2K] (bool or number; entries
    as :func:`_class_values`), ``[S, G + W]``: the old groups' by position (gid = k * K +
    k_hat), the ring entries' by a select over the K classes."""
    old = (jnp.repeat(v[:, :K_CLASSES], K_CLASSES, 1) if by_true
           else jnp.tile(v[:, :K_CLASSES], (1, K_CLASSES)))
    cls = (ret.k if by_true else ret.kh)[:, N_GROUPS:]
    ring = jnp.broadcast_to(v[:, K_CLASSES:K_CLASSES + 1], cls.shape)
    for c in range(1, K_CLASSES):
        ring = jnp.where(cls == c, v[:, K_CLASSES + c:K_CLASSES + c + 1], ring)
    return jnp.concatenate([old, ring], 1)


def _class_totals(v, ret: Returns, by_true: bool):
    """Per-slot sums of the unit amounts ``v`` [S, G + W] by entry, ``[S, 2K]``: the old
    groups by reshaping (gid = k * K + k_hat), the ring entries by comparison."""
    n_s = v.shape[0]
    old = v[:, :N_GROUPS].reshape(n_s, K_CLASSES, K_CLASSES).sum(2 if by_true else 1)
    cls = (ret.k if by_true else ret.kh)[:, None, N_GROUPS:]
    ring = jnp.sum(jnp.where(cls == jnp.arange(K_CLASSES)[:, None], v[:, None, N_GROUPS:],
                             0.0), 2)
    return jnp.concatenate([old, ring], 1)


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


def _h2o(ret: Returns, run, params):
    """H2O per stream: the r newest kept; of the rest at most k, lowest true class
    first (old groups in gid order, then ring entries oldest first). A unit's place in
    that order without a sort: the lower classes' kept tokens, then its class's old
    groups before it, then (ring entries) its class's older ring entries."""
    r, k_keep = params["r"], params["k"]
    n_s = ret.x.shape[0]
    cand = run[:, None] & ~(ret.ring[None, :] & (ret.age < r))
    xc = jnp.where(cand, ret.x, 0.0)
    excess = jnp.maximum(jnp.sum(xc, 1) - k_keep, 0.0)
    tot = _class_totals(xc, ret, by_true=True)                  # [S, 2K] old, ring
    per_k = tot[:, :K_CLASSES] + tot[:, K_CLASSES:]
    lower_k = jnp.cumsum(per_k, 1) - per_k
    old = xc[:, :N_GROUPS].reshape(n_s, K_CLASSES, K_CLASSES)   # [S, k, k_hat]
    old_before = lower_k[:, :, None] + (jnp.cumsum(old, 2) - old)
    ring_cls = jnp.concatenate([lower_k, lower_k + tot[:, :K_CLASSES]], 1)  # [S, 2K]
    kr, age, xr = ret.k[:, N_GROUPS:], ret.age[:, N_GROUPS:], xc[:, N_GROUPS:]
    older = (kr[:, None, :] == kr[:, :, None]) & (age[:, None, :] > age[:, :, None])
    ring_before = (_unit_values(ring_cls, ret, by_true=True)[:, N_GROUPS:]
                   + jnp.sum(jnp.where(older, xr[:, None, :], 0.0), 2))
    before = jnp.concatenate([old_before.reshape(n_s, N_GROUPS), ring_before], 1)
    ev = jnp.clip(excess[:, None] - before, 0.0, xc)
    return ret.x - ev, jnp.sum(ev)


def _ukey(v):
    """uint32 keys in the order of the float32 values ``v`` (IEEE bits, sign folded)."""
    i = jax.lax.bitcast_convert_type(v.astype(jnp.float32), jnp.int32)
    i = jnp.where(i < 0, i ^ jnp.int32(0x7FFFFFFF), i)
    return jax.lax.bitcast_convert_type(i, jnp.uint32) ^ jnp.uint32(0x80000000)


def _threshold(w, u, need):
    """The smallest uint32 key ``T`` with ``sum(w[u <= T]) >= need`` (all ones when the
    amounts ``w`` [N] fall short): a binary search over the key's 32 bits, top first,
    one masked sum over N per bit (no scatter, no sort). Exact for integer-valued
    amounts below 2**24.

    The same passes, so the same result, on every backend: on CPU in a loop (unrolled,
    XLA:CPU would recompute the keys inside every pass, ~3x slower), elsewhere unrolled
    (on GPU each iteration of a loop waits for the host)."""

    def bisect(i, thr):
        low = (jnp.uint32(1) << (jnp.uint32(31) - i.astype(jnp.uint32))) - jnp.uint32(1)
        short = jnp.sum(jnp.where(u <= (thr | low), w, 0.0)) < need
        return jnp.where(short, thr | (low + jnp.uint32(1)), thr)

    def looped():
        return jax.lax.fori_loop(0, 32, bisect, jnp.uint32(0))

    def unrolled():
        return jax.lax.fori_loop(0, 32, bisect, jnp.uint32(0), unroll=True)

    return jax.lax.platform_dependent(cpu=looped, default=unrolled)


def _take_lowest(w, key, need):
    """Take ``need`` in total from the amounts ``w`` (flat) in increasing ``key``
    (float32), ties by flat index: how much each entry gives."""
    w = jnp.maximum(w, 0.0)
    return jax.lax.cond(need > 0, _take_lowest_on, lambda w, k, n: jnp.zeros_like(w),
                        w, key, need)


def _take_lowest_on(w, key, need):
    u = _ukey(jax.lax.stop_gradient(key))
    thr = _threshold(jax.lax.stop_gradient(w), u, need)
    lower = u < thr
    rest = need - jnp.sum(jnp.where(lower, w, 0.0))
    tie = jnp.where(u == thr, w, 0.0)
    before = jnp.cumsum(tie) - tie
    return jnp.where(lower, w, jnp.clip(rest - before, 0.0, tie))


def _take_lowest_units(w, key, ret: Returns, need):
    """:func:`_take_lowest` of the units' amounts ``w`` [S, G + W] whose keys are their
    predicted-class entries' ``key`` [S, 2K] (Token-PD's heap and restores): the
    threshold is found on the entries' totals (S * 2K amounts, not S * (G + W)); units
    below it give everything, those at it give the rest in flat unit order."""
    w = jnp.maximum(w, 0.0)
    return jax.lax.cond(need > 0, _take_lowest_units_on,
                        lambda w, k, r, n: jnp.zeros_like(w), w, key, ret, need)


def _take_lowest_units_on(w, key, ret: Returns, need):
    u = _ukey(jax.lax.stop_gradient(key))
    tot = _class_totals(w, ret, by_true=False)
    thr = _threshold(jax.lax.stop_gradient(tot).reshape(-1), u.reshape(-1), need)
    rest = need - jnp.sum(jnp.where(u < thr, tot, 0.0))
    lower = _unit_values(u < thr, ret, by_true=False)
    tie = jnp.where(_unit_values(u == thr, ret, by_true=False), w, 0.0)
    # before each unit in flat order: the earlier slots' ties, then the slot's own (a
    # log-depth scan: XLA:CPU runs a cumsum of short rows as a windowed sum, ~4x slower)
    row = jax.lax.associative_scan(jnp.add, tie, axis=1)
    before = (jnp.cumsum(row[:, -1]) - row[:, -1])[:, None] + (row - tie)
    return jnp.where(lower, w, jnp.clip(rest - before, 0.0, tie))


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


def _oracle(ret: Returns, ex, dec, budget):
    """The clairvoyant's utility: the largest sum x * A over the decoding streams'
    tokens with sum x <= budget (fractional knapsack). A token's share depends only on
    its stream, true class and whether it is in the ring, so the knapsack runs over
    those 2K entries per stream."""
    n8 = _class_totals(jnp.where(dec[:, None], ret.n, 0.0), ret, by_true=True)  # [S, 2K]
    a8 = jnp.where(n8 > 0, _class_values(ret, ex, by_true=True), -1.0).reshape(-1)
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
    m_budget = budget_tokens(params, cfg)
    limit = kept_limit(pol, m_budget, cap)  # token-pd: the hard budget, else C
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
    else:  # token-pd can evict every token but each running stream's next one
        protected = jnp.sum(run0).astype(f32)
    a_w = cfg.admit_window
    # the preempted streams in admission order (orders are distinct): the j-th is the
    # one with j earlier ones
    pre = sl.status == 2
    rank = jnp.sum(pre[None, :] & (sl.order[None, :] < sl.order[:, None]), 1)
    j = jnp.arange(a_w, dtype=jnp.int32)
    hit = pre[None, :] & (rank[None, :] == j[:, None])                      # [A, S]
    pre_slot = jnp.where(jnp.any(hit, 1), jnp.argmax(hit, 1), n_s).astype(jnp.int32)
    n_pre = jnp.minimum(jnp.sum(pre), a_w)
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
          & (protected + jnp.cumsum(c_need) <= limit - cfg.watermark_tokens))
    adm = jnp.cumprod(ok.astype(jnp.int32)).astype(bool)
    n_adm = jnp.sum(adm)
    prefill_it = n_adm > 0
    drop = (n_run0 == 0) & ~prefill_it & present[0] & (
        c_need[0] > limit - cfg.watermark_tokens)
    # place the admitted (new ones into free slots, preempted ones in place): each slot
    # gathers its candidate, if any
    lands = adm[None, :] & (c_slot[None, :] == jnp.arange(n_s)[:, None])    # [S, A]
    placed = jnp.any(lands, 1)
    src = jnp.argmax(lands, 1)

    def put(x, old):
        return jnp.where(placed.reshape((-1,) + (1,) * (old.ndim - 1)), x[src], old)

    first_adm = placed & ~is_pre[src]
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
    demand = None  # token-pd: the tokens its price rule keeps or restores (uncapped)
    mu = st.mu
    if pol.kind == "pd":
        # token-pd-tiers: a stream's tokens see its tier's lam, delta and price
        tier = stream_tier(sl.prompt, fopts.tier_bounds) if pol.tiered else None
        lam_s, delta_s, mu_s = (_per_stream(v, tier)
                                for v in (params["lam"], params["delta"], mu))
        # the excess g of each (slot, ring?, predicted class) entry, [S, 2K]; a unit's
        # keep and restore gates are its entry's
        r_hat, var = _class_values(ret, ex, by_true=False)
        g = r_hat - lam_s * var - mu_s

        def per_unit(v):
            return _unit_values(v, ret, by_true=False)

        x = jnp.where(run[:, None], x * per_unit(_soft(g, t, mu_s)), x)
        # restores wanted: evicted tokens worth delta * mu
        want = jnp.where(run[:, None], (ret.n - ret.x) * per_unit(_soft(
            g - delta_s * mu_s, t, mu_s)), 0.0)
        demand = jnp.sum(x) + jnp.sum(want)
        need = jnp.maximum(jnp.sum(x) + jnp.sum(grow_s) - limit, 0.0)
        # the shared heap: evict in increasing g, ties by flat unit index
        x = x - _take_lowest_units(x, jnp.where(run[:, None], g, jnp.inf), ret, need)
        # the restores, best first, into the room the hard budget leaves
        room = jnp.maximum(limit - jnp.sum(grow_s) - jnp.sum(x), 0.0)
        back = _take_lowest_units(want, -g, ret, room)
        x = x + back
        restored_s = jnp.sum(back, 1)
    elif pol.kind == "h2o":
        x, _ = _h2o(ret, run, params)
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
    if demand is None:
        demand = k_tot
    # 5 quality (decode iterations, before the appends)
    lost = jnp.sum(jnp.where(dec[:, None], (ret.n - x) * ret.a, 0.0))
    util = jnp.sum(jnp.where(dec[:, None], x * ret.a, 0.0))
    oracle = _oracle(jax.lax.stop_gradient(ret), ex, dec, m_budget)
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
        peak_budget_use=jnp.maximum(acc.peak_budget_use, peak / m_budget),
        busy_s=acc.busy_s + dt, iters=acc.iters + busy,
        res_token_s=acc.res_token_s + peak * dt, kept_token_s=acc.kept_token_s + peak * dt,
        lost=acc.lost + lost, queries=acc.queries + dec_seqs, utility=acc.utility + util,
        oracle=acc.oracle + oracle,
        viol_pos=acc.viol_pos + jnp.where(dec_seqs > 0, jnp.maximum(k_tot - m_budget, 0.0),
                                          0.0),
        viol_signed=acc.viol_signed + jnp.where(dec_seqs > 0, k_tot - m_budget, 0.0),
        demand_signed=acc.demand_signed + jnp.where(dec_seqs > 0, demand - m_budget, 0.0),
        evicted=acc.evicted + evicted, restored=acc.restored + jnp.sum(rest),
        recompute_s=acc.recompute_s + (dt - dt_plain))
    sl, acc, fin, rec = _complete(sl, acc, st.rec, first_adm & ~preempt, first, clock,
                                  st.it, n, t, cfg, hw)
    # drop: a new head request is skipped, a preempted one freed
    drop_pre = drop & is_pre[0]
    dslot = (jnp.arange(n_s) == ps[0]) & drop_pre
    sl = sl.replace(status=jnp.where(dslot, 0, sl.status), req=jnp.where(dslot, -1, sl.req))
    head = st.head + jnp.sum(adm & ~is_pre) + (drop & ~is_pre[0])
    # 7 price, fed by the price rule's demand D (token-pd-tiers: every tier's price from
    # the same D, elementwise)
    if pol.kind == "pd":
        k_fb = jax.lax.stop_gradient(demand) if fopts.price_grad == "stop" else demand
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
