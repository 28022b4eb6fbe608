"""A round's microbatches and its time on a pipeline group (docs/kunserve-semantics.md,
7f-7g): items laid out along the round's token axis (decodes, then prefill chunks, each
in request order), cut by token count (vLLM PP) or by KunServe's lookahead cost halving
(paper Fig. 11 on equation (1)), and timed as a cyclic flow shop of identical stages."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from hardware.roofline import iteration_time
from models import relax
from models.dropping.state import MAX_PIECES

__all__ = ["Items", "Pieces", "layout", "cost_cuts", "token_cuts", "pieces", "round_time",
           "lookahead_pieces"]

KV_BLOCK = 16.0  # tokens per paged KV block (vLLM's default block_size)


class Items(NamedTuple):
    start: jnp.ndarray   # [R] first token of the item on the round's axis
    tokens: jnp.ndarray  # [R] new tokens (1 per decode, the chunk per prefill, 0 none)
    prefix: jnp.ndarray  # [R] tokens attended before the item (context / computed prompt)
    dec: jnp.ndarray     # [R] bool decode item
    cost0: jnp.ndarray   # [R] cumulative cost before the item
    cost: jnp.ndarray    # [R] the item's cost, eq. (1) without the per-batch term
    n: jnp.ndarray       # [] tokens in the round
    total: jnp.ndarray   # [] cost of the round


class Pieces(NamedTuple):
    prefill: jnp.ndarray  # [P] prefill tokens
    pairs: jnp.ndarray    # [P] prefill (query, key) pairs
    seqs: jnp.ndarray     # [P] decode sequences
    ctx: jnp.ndarray      # [P] decode context tokens
    tokens: jnp.ndarray   # [P]


def _excl(x):
    return jnp.cumsum(x) - x


def _chunk_cost(a, b, p, c):
    return a * (p * c + (c * c + c) / 2.0) + b * c


def layout(dec, chunk, kv, done, a, b) -> Items:
    """Items of a round: ``dec`` [R] decoding requests (one token, prefix ``kv``),
    ``chunk`` [R] prefill tokens of the others (prefix ``done``)."""
    decf = dec.astype(jnp.float32)
    pre = ~dec & (chunk > 0)
    tok = jnp.where(dec, 1.0, jnp.where(pre, chunk, 0.0))
    p = jnp.where(dec, kv, done)
    n_dec = jnp.sum(decf)
    start = jnp.where(dec, _excl(decf), n_dec + _excl(jnp.where(pre, tok, 0.0)))
    cost = jnp.where(tok > 0, _chunk_cost(a, b, p, tok), 0.0)
    cdec = jnp.where(dec, cost, 0.0)
    cost0 = jnp.where(dec, _excl(cdec), jnp.sum(cdec) + _excl(jnp.where(pre, cost, 0.0)))
    return Items(start=start, tokens=tok, prefix=p, dec=dec, cost0=cost0, cost=cost,
                 n=jnp.sum(tok), total=jnp.sum(cost))


def cost_cuts(it: Items, y, a, b):
    """Token offsets of cuts at cumulative costs ``y`` [J]: the smallest integer offset
    whose cumulative cost reaches y (0 for y <= 0, n past the total).

    The item holding a cut (``cost0 < y <= cost0 + cost``) is found by comparisons
    alone; the offset inside it is solved for that item only. Adjacent items can both
    hold y by a float32 rounding of their bounds (then their offsets are added, as a
    sum over every item would); three cannot, as long as an item costs more than the
    rounding of the cumulative cost (2^-23 of the round's)."""
    y = jnp.asarray(y)
    yc = y[:, None]
    inside = ((it.tokens[None] > 0) & (it.cost0[None] < yc)
              & (yc <= it.cost0[None] + it.cost[None]))
    n_items = it.tokens.shape[0]
    first = jnp.argmax(inside, axis=1)
    last = n_items - 1 - jnp.argmax(inside[:, ::-1], axis=1)
    any_in = jnp.any(inside, axis=1)

    def offset(i):  # start + the cut's offset in item i ([J] each)
        delta = y - it.cost0[i]
        p, tok = it.prefix[i], it.tokens[i]
        b1 = a * p + a / 2.0 + b
        root = 2.0 * delta / (b1 + jnp.sqrt(jnp.maximum(b1 * b1 + 2.0 * a * delta, 0.0)))
        c = jnp.clip(jnp.ceil(root - 1e-4), 1.0, tok)
        # ceil of a float root can miss by one token: move to the smallest c reaching delta
        c = jnp.where(_chunk_cost(a, b, p, c - 1.0) >= delta, c - 1.0, c)
        c = jnp.where(_chunk_cost(a, b, p, c) < delta, c + 1.0, c)
        c = jnp.clip(c, 1.0, tok)
        return it.start[i] + c

    u = jnp.where(any_in, offset(first), 0.0) + jnp.where(any_in & (last != first),
                                                           offset(last), 0.0)
    return jnp.where(y <= 0.0, 0.0, jnp.where(any_in, u, it.n))


def token_cuts(n, B):
    """Cuts at multiples of ``B`` (token-count microbatches of B tokens)."""
    j = jnp.arange(1, MAX_PIECES, dtype=jnp.float32)
    return jnp.minimum(j * B, n)


def _depth_cuts(it: Items, deepest, max_depth: int, d):
    """The cuts ``j / 2^d`` of the cost (``j = 1 .. MAX_PIECES - 1``; ``n`` for
    ``j >= 2^d``), taken from ``deepest``, the cuts at ``i / 2^max_depth``: the same
    fractions (``j / 2^d = j 2^(max_depth - d) / 2^max_depth``, exact in float), so the
    same cuts."""
    j = jnp.arange(1, MAX_PIECES, dtype=jnp.int32)
    if max_depth == 0:
        return jnp.broadcast_to(it.n, j.shape)
    i = jnp.left_shift(j, max_depth - d) - 1
    return jnp.where(j < jnp.left_shift(1, d),
                     deepest[jnp.clip(i, 0, deepest.shape[0] - 1)], it.n)


def lookahead_pieces(it: Items, a, b, min_tokens, max_depth: int, t, scale):
    """(cuts at the chosen depth, cuts one level shallower, soft gate of the choice):
    the depth is the smallest d <= max_depth whose first microbatch has <= min_tokens
    tokens (Fig. 11 stops when the first microbatch is small enough). Every depth's
    cuts are among the deepest's (the cost at ``i / 2^max_depth``), so the cost curve is
    cut once."""
    i = jnp.arange(1, 2 ** max_depth, dtype=jnp.float32)
    deepest = cost_cuts(it, i / 2.0 ** max_depth * it.total, a, b)  # [2^max_depth - 1]
    # the first cut at depth d >= 1: fraction 1 / 2^d, deepest index 2^(max_depth-d) - 1
    firsts = [2 ** (max_depth - d) - 1 for d in range(1, max_depth + 1)]
    first = jnp.concatenate([it.n[None], deepest[np.asarray(firsts, np.int32)]])
    ok = first <= min_tokens
    d = jnp.where(jnp.any(ok), jnp.argmax(ok), max_depth).astype(jnp.int32)
    first_d = first[d]
    gate = relax.soft_ge(min_tokens, first_d, t, scale, margin=0.25)
    gate = jnp.where(jnp.any(ok) & (d > 0), gate, 1.0)
    return (_depth_cuts(it, deepest, max_depth, d),
            _depth_cuts(it, deepest, max_depth, jnp.maximum(d - 1, 0)), gate)


def pieces(it: Items, cuts) -> Pieces:
    """Work of each microbatch ``[lo_j, hi_j)`` between consecutive cuts ([P - 1])."""
    hi = jnp.concatenate([cuts, it.n[None]])
    lo = jnp.concatenate([jnp.zeros(1, hi.dtype), cuts])
    hi = jnp.maximum(hi, lo)
    u0 = jnp.clip(lo[:, None] - it.start[None], 0.0, it.tokens[None])
    u1 = jnp.clip(hi[:, None] - it.start[None], 0.0, it.tokens[None])
    o = u1 - u0
    dec = it.dec[None]
    pre_o = jnp.where(dec, 0.0, o)
    pairs = jnp.where(dec, 0.0, o * it.prefix[None] + (u1 * (u1 + 1.0) - u0 * (u0 + 1.0)) / 2.0)
    dec_o = jnp.where(dec, o, 0.0)
    return Pieces(prefill=jnp.sum(pre_o, 1), pairs=jnp.sum(pairs, 1), seqs=jnp.sum(dec_o, 1),
                  ctx=jnp.sum(dec_o * it.prefix[None], 1), tokens=jnp.sum(o, 1))


def round_time(pc: Pieces, k, hw, act_bytes, bw, delay):
    """(T, bubble GPU-seconds) of a round on a group of ``k`` instances (7g)."""
    kf = jnp.asarray(k, jnp.float32)
    single = iteration_time(hw, jnp.sum(pc.prefill), jnp.sum(pc.seqs), jnp.sum(pc.ctx),
                            KV_BLOCK, prefill_ctx_tokens=jnp.sum(pc.pairs))
    stage = hw._replace(weight_bytes=hw.weight_bytes / kf,
                        kv_bytes_per_token=hw.kv_bytes_per_token / kf,
                        dense_flops_per_token=hw.dense_flops_per_token / kf,
                        attn_flops_per_ctx_token=hw.attn_flops_per_ctx_token / kf,
                        allreduces_per_stage=hw.allreduces_per_stage / kf,
                        pp=1.0, step_overhead_s=0.0, token_overhead_s=0.0)
    s = iteration_time(stage, pc.prefill, pc.seqs, pc.ctx, KV_BLOCK,
                       prefill_ctx_tokens=pc.pairs)
    live = pc.tokens > 0
    s = jnp.where(live, s, 0.0)
    act = jnp.where(live, kf * (pc.tokens * act_bytes / bw + delay), 0.0)
    tc = jnp.maximum(jnp.sum(s), jnp.max(kf * s + act))
    piped = tc + hw.step_overhead_s + hw.token_overhead_s * jnp.sum(pc.tokens)
    bubble = kf * tc - kf * jnp.sum(s)
    multi = kf > 1.0
    return jnp.where(multi, piped, single), jnp.where(multi, bubble, 0.0), jnp.where(multi, kf * tc, 0.0)
