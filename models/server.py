"""Shared parts of the continuous-batching server simulators.

A simulator is a pure ``step(state) -> (state, trace)`` under ``lax.scan`` over a fixed
table of ``n_slots`` running requests. This module holds what every memory system shares:
the static/traced server configuration, the slot table, FCFS prefix admission, slot
assignment, the latency histograms and the metric accumulators.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
from flax import struct

from models import relax

__all__ = [
    "ServerConfig",
    "Slots",
    "Acc",
    "Record",
    "Finished",
    "finish_outcomes",
    "init_slots",
    "init_acc",
    "init_record",
    "slot_fields",
    "prefix_fit",
    "prefix_gate",
    "assign_free_slots",
    "slot_targets",
    "pack_bits",
    "nth_bit",
    "nth_true",
    "fifo_entries",
    "hist_add",
    "hist_quantile",
    "LAT_EDGES",
    "prefix_sum",
    "cap_prefill",
]

# Latency histogram: 20 log-spaced bins per decade from 1 ms to 10^4 s (bin 0 catches
# anything below 1 ms, the last bin anything above).
LAT_EDGES = jnp.logspace(-3.0, 4.0, 141, dtype=jnp.float32)


@struct.dataclass
class ServerConfig:
    capacity_tokens: jax.Array   # [] KV tokens the replica holds
    max_batch: jax.Array         # [] running requests at most (vLLM max_num_seqs)
    max_prefill: jax.Array       # [] prefill tokens per iteration (first admission exempt)
    ttft_slo_s: jax.Array        # [] TTFT SLO for the attainment metric
    tpot_slo_s: jax.Array        # [] TPOT SLO for the attainment metric
    token_scale: jax.Array       # [] tokens per unit temperature in token comparisons
    kv_bytes_per_token: jax.Array  # [] per device, for migration copies
    watermark_tokens: jax.Array  # [] KV tokens a paged admission must leave free (vLLM
    #                              v0 block manager: 1% of the blocks)
    n_slots: int = struct.field(pytree_node=False, default=256)
    admit_window: int = struct.field(pytree_node=False, default=16)
    # with per-request priorities (``Workload.priority``): the waiting requests the
    # scheduler orders are the first ``priority_window`` not yet admitted (from the
    # oldest on); vLLM V1's priority queue holds every waiting request
    # (models.bucketed.admission)
    priority_window: int = struct.field(pytree_node=False, default=256)
    max_len: int = struct.field(pytree_node=False, default=4096)
    # scheduler: False = vLLM v0 default (prefill-only iterations, whole prompts under
    # the token budget); True = chunked prefill (vLLM V1: decodes first, prompts chunked
    # to fill the rest of the token budget). docs/server-semantics.md.
    chunked: bool = struct.field(pytree_node=False, default=False)
    # [] prefill tokens one request may compute per chunked iteration (vLLM V1's
    # long_prefill_token_threshold); None: no cap (vLLM's 0)
    prefill_cap: jax.Array | None = None


def cap_prefill(tokens, cfg: ServerConfig):
    """``tokens`` a request would prefill now: with chunked prefill at most
    ``cfg.prefill_cap`` of them; without it (or with no cap) all of them."""
    if not cfg.chunked or cfg.prefill_cap is None:
        return tokens
    return jnp.minimum(tokens, cfg.prefill_cap)


@struct.dataclass
class Slots:
    """The slot table every family shares (a family may subclass it to add fields)."""

    req: jax.Array        # [S] int32 request index, -1 when empty
    status: jax.Array     # [S] int32 0 empty, 1 running, 2 preempted (waiting)
    prompt: jax.Array     # [S] int32
    output: jax.Array     # [S] int32 realised output length
    gen: jax.Array        # [S] int32 tokens generated so far
    reserved: jax.Array   # [S] float32 KV tokens held
    weight: jax.Array     # [S] float32 admission weight (1 forward; soft gradient)
    arrival: jax.Array    # [S] float32
    t_admit: jax.Array    # [S] float32 clock when first admitted
    t_first: jax.Array    # [S] float32 first-token time


def slot_fields(n: int, cls=Slots) -> dict:
    """Zero fields of a slot table (``req`` -1) of class ``cls`` as keyword arguments."""
    zi = jnp.zeros(n, jnp.int32)
    zf = jnp.zeros(n, jnp.float32)
    out = {}
    for f in dataclasses.fields(cls):
        ints = ("status", "prompt", "output", "gen", "todo", "order")
        out[f.name] = zi if f.name in ints else zf
    out["req"] = zi - 1
    return out


def init_slots(n: int) -> Slots:
    return Slots(**slot_fields(n))


@struct.dataclass
class Acc:
    """Metric accumulators every family keeps (weighted by each request's admission
    weight); a family may subclass it to add its own counters."""

    completed: jax.Array     # [] requests finished
    tokens: jax.Array        # [] output tokens of finished requests
    actual_kv: jax.Array     # [] sum of prompt + output of finished requests
    preemptions: jax.Array   # []
    stalls: jax.Array        # [] slot-iterations without progress
    dropped: jax.Array       # []
    queue_s: jax.Array       # [] summed queueing delay (admission - arrival)
    ttft_ok: jax.Array       # [] (soft) count of finished requests within the TTFT SLO
    tpot_ok: jax.Array       # [] (soft) count within the TPOT SLO
    slo_ok: jax.Array        # [] (soft) count within both (DistServe's SLO attainment)
    ttft_hist: jax.Array     # [141] latency histogram counts
    tpot_hist: jax.Array     # [141]
    peak_kv: jax.Array       # [] largest reserved KV tokens during an iteration
    max_use: jax.Array       # [] largest used/size over pools and iterations
    busy_s: jax.Array        # [] summed iteration time
    iters: jax.Array         # [] iterations with work
    res_token_s: jax.Array   # [] KV tokens held x seconds (time-weighted occupancy)


def init_acc(cls=Acc):
    """Zero accumulators of class ``cls`` (:class:`Acc` or a subclass of scalars)."""
    z = jnp.zeros((), jnp.float32)
    h = jnp.zeros(LAT_EDGES.shape, jnp.float32)
    return cls(**{f.name: h if f.name.endswith("_hist") else z
                  for f in dataclasses.fields(cls)})


@struct.dataclass
class Record:
    """Per-request outcomes (only kept for single-config evaluations); a family may
    subclass it (e.g. to record reservations)."""

    admit_iter: jax.Array   # [N] int32, -1 never admitted
    finish_iter: jax.Array  # [N] int32, -1 not finished
    first_s: jax.Array      # [N] float32 first-token time
    finish_s: jax.Array     # [N] float32 finish time


def init_record(n: int, cls=Record):
    """An empty record of class ``cls``: iterations -1, times NaN, other fields 0."""
    def init(name):
        if name.endswith("_iter"):
            return jnp.full(n, -1, jnp.int32)
        if name.endswith("_s"):
            return jnp.full(n, jnp.nan, jnp.float32)
        return jnp.zeros(n, jnp.float32)
    return cls(**{f.name: init(f.name) for f in dataclasses.fields(cls)})


@struct.dataclass
class Finished:
    """One iteration's completions per slot (stacked per block by the scan)."""

    length: jax.Array  # [S] int32 realised length (<= max_len) of a completion; 0: none
    ttft: jax.Array    # [S] float32 seconds
    tpot: jax.Array    # [S] float32 seconds
    bits: jax.Array    # [ceil(S/32)] uint32 the completion mask, 32 slots per word


def finish_outcomes(acc, sl, done, clock, t, cfg, hw):
    """The slots ``done`` this iteration into the shared accumulators (weighted by the
    admission weight; SLO attainment soft at T > 0) and :class:`Finished`. ``sl`` needs
    ``weight``, ``output``, ``prompt``, ``t_first`` and ``arrival``. Returns
    ``(acc, fin)``; ``fin.ttft`` is each slot's TTFT (finished or not)."""
    wd = jnp.where(done, sl.weight, 0.0)
    ttft = sl.t_first - sl.arrival + hw.request_overhead_s
    tpot = jnp.where(sl.output > 1, (clock - sl.t_first)
                     / jnp.maximum(sl.output - 1, 1).astype(jnp.float32), 0.0)
    ttft_ok = relax.soft_ge(cfg.ttft_slo_s, ttft, t, 0.1 * cfg.ttft_slo_s)
    tpot_ok = relax.soft_ge(cfg.tpot_slo_s, tpot, t, 0.1 * cfg.tpot_slo_s)
    acc = acc.replace(
        completed=acc.completed + jnp.sum(wd),
        tokens=acc.tokens + jnp.sum(wd * sl.output),
        actual_kv=acc.actual_kv + jnp.sum(wd * (sl.prompt + sl.output)),
        ttft_ok=acc.ttft_ok + jnp.sum(wd * ttft_ok),
        tpot_ok=acc.tpot_ok + jnp.sum(wd * tpot_ok),
        slo_ok=acc.slo_ok + jnp.sum(wd * ttft_ok * tpot_ok))
    fin = Finished(length=jnp.where(done, jnp.minimum(sl.output, cfg.max_len), 0),
                   ttft=ttft, tpot=tpot, bits=pack_bits(done))
    return acc, fin


def prefix_sum(x):
    """Inclusive prefix sum over the last axis.

    XLA's CPU cumsum is slow for the short vectors of a slot table; for lengths divisible
    by 16 this does it as two small triangular matmuls over 16-blocks (exact for integer
    valued float32 sums below 2**24). Integer and boolean inputs are summed as float32
    and cast back.
    """
    n = x.shape[-1]
    if n < 32:
        return jnp.cumsum(x, axis=-1)
    dtype = x.dtype
    xf = x.astype(jnp.float32)
    if n % 16:  # pad to whole blocks (zeros do not change a prefix sum)
        pad = jnp.zeros(x.shape[:-1] + (16 - n % 16,), jnp.float32)
        return prefix_sum(jnp.concatenate([xf, pad], -1))[..., :n].astype(dtype) \
            if jnp.issubdtype(dtype, jnp.floating) else \
            jnp.round(prefix_sum(jnp.concatenate([xf, pad], -1))[..., :n]).astype(jnp.int32)
    # full float32 products: a GPU's default may use TF32 (10-bit mantissa) for float32
    # matmuls, which would make sums above 2**11 inexact
    mm = partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
    tri = jnp.triu(jnp.ones((16, 16), jnp.float32))
    blocks = mm(xf.reshape(x.shape[:-1] + (n // 16, 16)), tri)
    offsets = mm(blocks[..., -1], jnp.triu(jnp.ones((n // 16, n // 16), jnp.float32), 1))
    out = (blocks + offsets[..., None]).reshape(x.shape)
    if jnp.issubdtype(dtype, jnp.floating):
        return out.astype(dtype)
    return jnp.round(out).astype(jnp.int32)


def prefix_fit(need, size, used, mask, t, scale):
    """Prefix rule: item i passes iff the summed ``need`` of masked items up to i fits in
    ``size - used``.

    Returns the soft gate (hard at t = 0). The gradient flows through this iteration's
    ``need`` and the pool ``size``; ``used`` (occupancy built by earlier decisions) is
    stop-gradiented, the fix for exploding gradients through chains of admissions.
    """
    return prefix_gate(prefix_sum(jnp.where(mask, need, 0.0)), size, used, mask, t, scale)


def prefix_gate(cum, size, used, mask, t, scale):
    """:func:`prefix_fit` from the prefix sums ``cum`` of the masked needs (so several
    prefix rules can share one stacked :func:`prefix_sum`)."""
    free = size - jax.lax.stop_gradient(used)
    gate = relax.soft_ge(free - cum, 0.0, t, scale, margin=0.25)
    return jnp.where(mask, gate, 0.0)


def assign_free_slots(free_mask, n_new):
    """Slot s takes the k-th new item iff it is the k-th free slot (k < n_new).

    Returns ``(take [S] bool, k [S] int32)``.
    """
    rank = prefix_sum(free_mask.astype(jnp.int32)) - 1
    take = free_mask & (rank < n_new)
    return take, jnp.where(take, rank, 0)


def pack_bits(mask):
    """A boolean [S] mask as uint32 words (slot s is bit s % 32 of word s // 32)."""
    m = jnp.pad(mask, (0, -mask.shape[-1] % 32)).reshape(-1, 32).astype(jnp.uint32)
    return jnp.sum(m << jnp.arange(32, dtype=jnp.uint32), -1, dtype=jnp.uint32)


def nth_bit(x, q):
    """Position of the ``q``-th (0-based) set bit of the uint32 ``x`` (elementwise; q must
    be below popcount(x)): the largest p with popcount(x & (2**p - 1)) <= q."""
    pos = jnp.zeros(jnp.shape(q), jnp.int32)
    for b in (16, 8, 4, 2, 1):
        low = x & ((jnp.uint32(1) << (pos + b).astype(jnp.uint32)) - jnp.uint32(1))
        pos = jnp.where(jax.lax.population_count(low).astype(jnp.int32) <= q, pos + b, pos)
    return pos


def nth_true(mask, n):
    """Index of the ``n``-th (0-based) True of a boolean [S] mask, for each of ``n`` [K]
    (S where the mask has fewer; n >= 0). Exact integer work on packed words: no prefix
    sum over S."""
    n_slots = mask.shape[-1]
    words = pack_bits(mask)
    pc = jax.lax.population_count(words).astype(jnp.int32)
    ends = jnp.cumsum(pc)
    w = jnp.sum(ends[None, :] <= n[:, None], -1)  # word holding it (len(words): none)
    wc = jnp.minimum(w, words.shape[0] - 1)
    idx = wc * 32 + nth_bit(words[wc], n - (ends[wc] - pc[wc]))
    return jnp.where(w < words.shape[0], idx, n_slots)


def fifo_entries(bits, targets):
    """(row, slot) of the completions numbered ``targets`` (0-based) in FIFO order
    (row = iteration, then slot) of a block's packed completion masks ``bits`` [R, W].

    Counts by popcount: the row, then the word, then the bit (a binary search on the
    word's low bits). Targets beyond the block's count give valid indices (mask them).
    """
    n_rows = bits.shape[0]
    pc = jax.lax.population_count(bits).astype(jnp.int32)  # [R, W]
    word_end = jnp.cumsum(pc, -1)
    row_end = prefix_sum(word_end[:, -1])
    row = jnp.minimum(jnp.sum(row_end[None, :] <= targets[:, None], -1), n_rows - 1)
    q = targets - (row_end[row] - word_end[row, -1])  # rank within the row
    ends = word_end[row]  # [K, W]
    word = jnp.minimum(jnp.sum(ends <= q[:, None], -1), bits.shape[1] - 1)
    q = q - (jnp.take_along_axis(ends, word[:, None], -1)[:, 0] - pc[row, word])
    x = bits[row, word]
    return row, word * 32 + nth_bit(x, q)


def slot_targets(free_mask, n_new, n_items: int):
    """Slots taking the first ``n_new`` of ``n_items`` new items (the k-th item goes to
    the k-th free slot; ``n_new`` must not exceed the free slots).

    Returns ``(take [S] bool, dst [n_items] int32)``: ``dst[k]`` is item k's slot, or a
    distinct out-of-range index (>= S) for items not placed, so that
    ``old.at[dst].set(x, mode="drop", unique_indices=True)`` places them (a scatter of
    ``n_items`` values instead of a gather per slot).
    """
    n_slots = free_mask.shape[-1]
    item = jnp.arange(n_items, dtype=jnp.int32)
    dst = nth_true(free_mask, item)
    last = jnp.max(jnp.where(item < n_new, dst, -1))  # slot of the last item placed
    take = free_mask & (jnp.arange(n_slots, dtype=jnp.int32) <= last)
    return take, jnp.where(item < n_new, dst, n_slots + item)


def hist_add(hist, values, weights):
    """Add ``weights`` at the latency bins of ``values`` (seconds)."""
    # index of the first edge >= value (edges are 10**(-3 + i/20)), by arithmetic
    pos = jnp.ceil((jnp.log10(jnp.maximum(values, 1e-4)) + 3.0) * 20.0 - 1e-4)
    idx = jnp.clip(pos, 0, LAT_EDGES.shape[0] - 1).astype(jnp.int32)
    return hist.at[idx].add(weights)


def hist_quantile(hist, q):
    """Upper bin edge at which the histogram's CDF reaches ``q`` (nan when empty)."""
    total = jnp.sum(hist)
    cdf = jnp.cumsum(hist) / jnp.maximum(total, 1e-9)
    idx = jnp.argmax(cdf >= q - 1e-6)
    return jnp.where(total > 0, LAT_EDGES[idx], jnp.nan)
