"""Independent NumPy/Python reference of the parameter-dropping family (``kunserve``,
``vllm-dp``, ``vllm-pp``, ``infercept``, ``llumnix``).

This file implements ``docs/kunserve-semantics.md`` (exact mode, T = 0) literally, with
plain Python loops over requests, instances and microbatches. It shares no code with
``models/dropping`` (the JAX family it checks) and imports from the package only the
device cost model's parameter type (``hardware.roofline.RooflineParams``); the roofline
formula itself is transcribed in float64 below (``iteration_time_f64``) because the
JAX ``iteration_time`` costs ~1 ms per call (and runs in float32 without x64); the
self-check test compares the two. The deployment numbers the family derives for itself
are derived here again from the model's and the device's preset fields, by this file's
own arithmetic: the roofline parameters (``roofline_of``), the KV bytes per token
(``kv_bytes_per_token``), the weight tokens W (``weight_tokens``), the lookahead cost
model (``fit_cost_model``: its own least squares) and the per-chunk overhead
(``T_CHUNK_S``, the doc's 20 us). Section numbers (``# 7d``) cite the doc's "One step"
list.

Interpretations
---------------
Where the doc leaves a choice open, this reference does the following. The JAX side
should be aligned with these.

1. Numbers. Times, loads and costs are float64; token counts (``target``, ``done``,
   ``gen``, ``kv``, ``host``) are int64. ``iteration_time_f64`` is
   ``hardware.roofline.iteration_time`` (``copy_bytes = 0``) evaluated in float64.
   ``chunk_bytes = chunk_mib * 2**20``; ``chunk_mib`` defaults to 32 for every system.
2. Arrivals must be non-decreasing (the doc indexes requests in arrival order; a
   decreasing array is refused). Hence every request dispatched in one step has
   arrival == t, and "an idle group's clock becomes max(clock, arrival)" is evaluated
   per dispatched request with "idle" meaning not busy just before that request joins.
3. Dispatch (2). Loads ``(held + queued) / cap`` are recomputed after every dispatched
   request (each one adds its ``need`` to its group's ``queued``); ties: smallest gid.
   ``held`` = summed ``kv`` of status-2 requests + llumnix reservations into the group.
4. "Now" of the drop (3) is the step time ``t`` of step 1: a group is exchanging iff
   ``exchanging_until > t`` (strict); "restoring" is the group's flag. In 6b and 7g the
   group is exchanging iff ``exchanging_until > t0``.
5. Merges (3). ``t_merge`` = the merged group's clock = max of the two clocks. The plan's
   merges are applied in order; a group produced earlier in the same plan can be merged
   again (Fig. 6 pushes it back): its ``held`` is the summed ``kv`` of its running
   requests (unchanged by the plan), a member count ``a``/``b`` is the current group size,
   and the stalls never shorten: ``stall = max(stall, t_merge + x)`` for the running
   requests of A and B (a no-op except in chained merges), ``exchanging_until = t_merge
   + x``, or for a chained merge the max of that and the exchange end of the group(s)
   made earlier in this plan. ``bytes = 0`` gives ``x = 0`` (the group is then not
   exchanging). The plan's heap key is (size, 0 if throttled else 1, gid) with
   "throttled" the groups found throttled in this step; a merged group is throttled
   if either part was.
6. ``runnable`` (7) is a predicate evaluated where it is used: 7b and 7a count the
   runnable decodes before preemption (``growth``); 7e takes the runnable requests after
   a-d, so requests admitted (7d) or swapped in (7c) in this round compute in it.
   ``growth`` in 7c and 7d is 7a's count after preemption (a preempted runnable decode
   no longer grows); a swapped-in decode needs room for its next token and adds it to
   ``growth`` (doc 7c, amended after this reference showed the 1-token overshoot); no
   swap-in in a round that preempted (vLLM's scheduler).
7. 7b (llumnix): growth is 7a's pre-preemption count; HOL = smallest-index queued
   request of g; "in flight" = some request of g has an unlanded migration; the
   candidate is the highest-index status-2 request of g with ``stall <= t0``; the
   destination is the other group with the largest ``cap - held - queued`` (ties:
   smallest gid) and the migration starts iff that free memory ``>= kv`` (inclusive).
   ``mig_end = t0 + kv * kvb / bw``.
8. 5 (landing): every unlanded migration with ``mig_end <= t0`` lands in request-index
   order, whichever group was picked; the destination then holds the request's current
   ``kv`` (which may have grown during the copy) and the reservation is gone.
   A migration is cancelled when its request is preempted (7a) or finishes (7h) before
   it lands.
9. Restore end (6a): homes by integer arithmetic ``m = min(k - 1, (k * c_r) // K)``;
   ``stall = t0 + x`` (set); all members become singletons with ``exchanging_until = t0
   + x``, ``restoring = False``; the round (7) then proceeds for the singleton ``g``
   (k = 1) in the same step; the other new singletons are picked in later steps (their
   clocks are already t0). ``K`` and ``c_r`` count status-2 requests only. ``pull_end``
   is set on every member at restore start and never reset (meaningful only where
   ``restoring``). Restore-start byte volume: ``W * kvb * (1 - 1/k) / bw``.
10. Round time (7g). The stage roofline divides ``weight_bytes``, ``kv_bytes_per_token``,
   ``dense_flops_per_token`` and ``attn_flops_per_ctx_token`` by k and sets ``pp = 1``,
   ``step_overhead_s = 0``; every other field (``kv_bytes_per_token_layer``,
   ``token_overhead_s``, the tp terms) is kept. ``delay = chunk_bytes / bw`` iff (the
   group is exchanging and ``coordinated``) or the group is restoring (pulling), else 0.
   With ``coordinated=False`` a round with work that starts while the group exchanges
   gets ``T += exchanging_until - t0`` (only for k > 1: a singleton forwards no
   activations) after round_time; the
   wait is not counted in ``bubble``. k = 1: ``T = iteration_time`` of the round's sums
   (no delay), bubble 0. infercept: ``T = max(T, swap_bytes / host_bw)`` with the swap
   bytes of 7a (out) and 7c (in) of this round; bubble unchanged.
11. Lookahead (7f). Cumulative cost ``F`` at item starts = the float64 running sum of
   whole-item costs in item order; inside item i, ``F(s_i + u) = F(s_i) + cost(p_i,
   u)``. Targets ``y_j = Ctot * (j / 2**d)``; a cut is the smallest integer ``u`` in
   ``[0, n]`` with ``F(u) >= y`` (bisection inside the item); cuts are deduplicated and
   only those strictly inside ``(0, n)`` are kept. "First piece" = the first remaining
   cut (``n`` if none). ``n == 0`` gives ``(0, [])``. Decodes are items ``(kv, 1)``.
12. The round did nothing iff ``T == 0`` (no tokens and no swap bytes). Its clock then
   becomes the smallest of these times that is ``> t0``: ``stall`` of g's status-2
   requests, g's ``exchanging_until``, g's ``pull_end`` (if restoring), ``mig_end`` of
   any unlanded migration, the arrival of the next undispatched request; else ``t0 +
   step_overhead_s``.
13. A preempted request keeps its ``stall`` (not reset by preemption or readmission).
14. Initial values: clocks 0, ``stall`` 0, ``exchanging_until`` 0, ``pull_end`` 0,
   ``inst`` -1, ``t_first``/``t_finish`` nan. Per-instance arrays (``clock``,
   ``exchanging_until``, ``restoring``, ``pull_end``) hold the group's value on every
   member (read them at the gid rows).
15. Progress (7h): a request whose prefill completes produces its token and, if it then
   has ``gen >= output``, finishes in the same round (``output >= 1``). ``t_first`` is
   set at ``t0 + T`` when that token is its first (``gen`` was 0).
16. Queued requests' homes on a split: the sorted member list's index ``r mod k`` (r the
   request index). The watermark is scaled by k (``cap - k * watermark``: 1% of each
   member's blocks, as the lead aligned it).
17. ``simulate`` returns one snapshot per step that picked a group; it stops after the
   step in which the last request finished (or after ``max_steps`` steps). ``picked``
   is never -1 in practice (a step with a finite ``t`` always has a busy group).
18. Deployment numbers (doc "Units and the cluster", "Cost model fit"), one device per
   instance (tp = pp = 1): ``kvb`` = 2 (K and V) x layers x KV heads x head_dim x dtype
   bytes; W = parameters x dtype bytes / ``kvb`` (``kvb`` as the cluster counts it, so
   a scaled ``kvb`` scales W). The cost-model fit evaluates ``iteration_time_f64`` on
   the k = 2 stage of Interpretation 10 at the doc's points (prefill chunks c = 128,
   256, ..., 4096 at prefixes 0, 1024, 4096, KV read in blocks of 16; decode batches of
   8, 32, 128 sequences at contexts 512, 2048, each a row ``[n (ctx + 1), n, 1]``) and
   solves the 3 x 3 normal equations of the column-scaled design by Gaussian
   elimination; negative coefficients are then set to 0.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from hardware.roofline import RooflineParams

__all__ = ["SYSTEMS", "T_CHUNK_S", "Cluster", "drop_plan", "lookahead_cuts", "token_cuts",
           "round_time", "simulate", "iteration_time_f64", "chunk_cost",
           "build_pieces", "roofline_of", "kv_bytes_per_token", "weight_tokens",
           "fit_cost_model", "cost_fit_points", "stage_of"]

SYSTEMS = ("kunserve", "vllm-dp", "vllm-pp", "infercept", "llumnix")
NEW, QUEUED, RUNNING, FINISHED, SWAPPED = 0, 1, 2, 3, 4
INF = math.inf
T_CHUNK_S = 20e-6  # doc "Parameters": 20 us per exchanged chunk
STEP_OVERHEAD_S = 4e-3  # the roofline's default step overhead (hardware/roofline.py doc)


# ---- the device cost model (float64 transcription of hardware.roofline) ---------------
def iteration_time_f64(p: RooflineParams, prefill_tokens, decode_seqs, decode_ctx_tokens,
                       kv_chunk_tokens, prefill_ctx_tokens) -> float:
    """``hardware.roofline.iteration_time(p, ...)`` with ``copy_bytes = 0``, in float64."""
    prefill = float(prefill_tokens)
    decode = float(decode_seqs)
    ctx = float(decode_ctx_tokens)
    chunk = float(kv_chunk_tokens)
    pctx = float(prefill_ctx_tokens)
    new_tokens = prefill + decode
    flops = new_tokens * p.dense_flops_per_token + (ctx + pctx) * p.attn_flops_per_ctx_token
    compute_s = flops / (p.peak_flops * p.mfu)
    bw = p.stream_bw * p.bw_eff
    chunk_b = chunk * p.kv_bytes_per_token_layer
    kv_bw = bw * (p.alpha + (1.0 - p.alpha) * (chunk_b / (chunk_b + p.burst_bytes)))
    weights_s = p.weight_bytes / bw if new_tokens > 0 else 0.0
    memory_s = weights_s + ctx * p.kv_bytes_per_token / kv_bw
    if new_tokens > 0:
        ring = 2.0 * (p.tp - 1.0) / p.tp
        one = ring * new_tokens * p.activation_bytes_per_token / (p.tp_link_bw
                                                                  * p.tp_comm_eff)
        one += p.tp_allreduce_latency_s if p.tp > 1.0 else 0.0
        comm_s = p.allreduces_per_stage * one
    else:
        comm_s = 0.0
    stage_s = max(compute_s, memory_s) + comm_s
    return p.pp * stage_s + p.step_overhead_s + p.token_overhead_s * new_tokens


# ---- deployment numbers (Interpretation 18) ----------------------------------------------
def kv_bytes_per_token(model) -> float:
    """K and V of one token over all layers on one device (tp = pp = 1)."""
    return 2.0 * model.n_layers * model.n_kv_heads * model.head_dim * model.dtype_bytes


def weight_tokens(model, kvb: float) -> float:
    """W: one model copy's weight bytes (every parameter at ``dtype_bytes``) / ``kvb``."""
    return model.n_params * model.dtype_bytes / float(kvb)


def roofline_of(model, device, step_overhead_s: float = STEP_OVERHEAD_S) -> RooflineParams:
    """The roofline parameters of ``model`` on one ``device`` (tp = pp = 1), from the
    presets' fields: weights read once, 2 FLOPs per active parameter per token, 4 FLOPs
    per (query, key) pair per layer and query head-dim (QK^T and AV), the device's
    measured mfu / bw_eff, two all-reduces per layer (free at tp = 1)."""
    n_active = model.n_params if model.n_active_params is None else model.n_active_params
    return RooflineParams(
        weight_bytes=float(model.n_params * model.dtype_bytes),
        kv_bytes_per_token=kv_bytes_per_token(model),
        kv_bytes_per_token_layer=2.0 * model.n_kv_heads * model.head_dim * model.dtype_bytes,
        dense_flops_per_token=2.0 * n_active,
        attn_flops_per_ctx_token=4.0 * model.n_layers * model.n_heads * model.head_dim,
        stream_bw=float(device.stream_bw), alpha=float(device.alpha),
        burst_bytes=float(device.burst_bytes), peak_flops=float(device.peak_flops),
        host_link_bw=float(device.host_link_bw), network_bw=float(device.network_bw),
        mfu=float(device.mfu), bw_eff=float(device.bw_eff),
        step_overhead_s=float(step_overhead_s), pp=1.0, tp=1.0,
        allreduces_per_stage=2.0 * model.n_layers,
        activation_bytes_per_token=float(model.hidden_size * model.dtype_bytes),
        tp_link_bw=float(device.tp_link_bw),
        tp_allreduce_latency_s=float(device.tp_allreduce_latency_s))


def stage_of(hw: RooflineParams, k: int) -> RooflineParams:
    """One of k pipeline stages (Interpretation 10): weights, KV bytes, dense and
    attention FLOPs divided by k, ``pp = 1``, no step overhead."""
    return hw._replace(weight_bytes=hw.weight_bytes / k,
                       kv_bytes_per_token=hw.kv_bytes_per_token / k,
                       dense_flops_per_token=hw.dense_flops_per_token / k,
                       attn_flops_per_ctx_token=hw.attn_flops_per_ctx_token / k,
                       pp=1.0, step_overhead_s=0.0)


def _solve3(A, y):
    """Gaussian elimination with partial pivoting of a 3 x 3 system (plain floats)."""
    M = [list(map(float, A[i])) + [float(y[i])] for i in range(3)]
    for c in range(3):
        piv = max(range(c, 3), key=lambda i: abs(M[i][c]))
        M[c], M[piv] = M[piv], M[c]
        for i in range(c + 1, 3):
            f = M[i][c] / M[c][c]
            for j in range(c, 4):
                M[i][j] -= f * M[c][j]
    x = [0.0, 0.0, 0.0]
    for i in (2, 1, 0):
        x[i] = (M[i][3] - sum(M[i][j] * x[j] for j in range(i + 1, 3))) / M[i][i]
    return x


def cost_fit_points(hw: RooflineParams, k: int = 2):
    """The fit's design rows ``(pairs, tokens, 1)`` and stage times (Interpretation 18)."""
    stage = stage_of(hw, k)
    rows, ys = [], []
    for e in range(7, 13):
        c = float(2 ** e)
        for p in (0.0, 1024.0, 4096.0):
            pairs = p * c + (c * c + c) / 2.0
            rows.append((pairs, c, 1.0))
            ys.append(iteration_time_f64(stage, c, 0, 0.0, 16, pairs))
    for n in (8.0, 32.0, 128.0):
        for ctx in (512.0, 2048.0):
            rows.append((n * (ctx + 1.0), n, 1.0))
            ys.append(iteration_time_f64(stage, 0, n, n * ctx, 16, 0.0))
    return rows, ys


def fit_cost_model(hw: RooflineParams, k: int = 2):
    """(a, b, g) of the doc's "Cost model fit" (Interpretation 18): least squares of
    ``a * pairs + b * tokens + g`` to the k-stage roofline, by the normal equations of
    the column-scaled design, negative coefficients set to 0."""
    rows, ys = cost_fit_points(hw, k)
    scale = [max(abs(r[j]) for r in rows) for j in range(3)]
    X = [[r[j] / scale[j] for j in range(3)] for r in rows]
    XtX = [[sum(x[i] * x[j] for x in X) for j in range(3)] for i in range(3)]
    Xty = [sum(x[i] * yv for x, yv in zip(X, ys)) for i in range(3)]
    z = _solve3(XtX, Xty)
    return tuple(max(z[j] / scale[j], 0.0) for j in range(3))


# ---- Fig. 6: the drop plan --------------------------------------------------------------
def drop_plan(sizes: dict, eligible: set, R: float, W: float, throttled=()) -> list:
    """Fig. 6 (section 3 of "One step"): min-heap of the eligible groups keyed by
    (size, 0 if throttled else 1, gid); while at least two remain and freed < R: pop a,
    pop b, merge (gid = min, size a + b, throttled if either part was), freed += W,
    push. Returns the merges [(gid_a, gid_b)], gid_a the first popped."""
    heap = []
    for g in sorted(eligible):
        heap.append((int(sizes[g]), 0 if g in throttled else 1, int(g)))
    heapq.heapify(heap)
    freed = 0.0
    merges = []
    while len(heap) >= 2 and freed < R:
        sa, ta, ga = heapq.heappop(heap)
        sb, tb, gb = heapq.heappop(heap)
        merges.append((ga, gb))
        freed += W
        heapq.heappush(heap, (sa + sb, min(ta, tb), min(ga, gb)))
    return merges


# ---- 7f: microbatch boundaries --------------------------------------------------------
def chunk_cost(p: float, c: float, a: float, b: float) -> float:
    """Equation (1) without the per-batch term: a (p c + (c^2 + c) / 2) + b c."""
    return a * (p * c + (c * c + c) / 2.0) + b * c


def token_cuts(n: int, B: int) -> list:
    """7f token mode: boundaries at multiples of B strictly inside (0, n)."""
    return [u for u in range(B, n, B)] if B > 0 else []


def lookahead_cuts(items, a: float, b: float, min_tokens: float, max_depth: int):
    """7f lookahead (Fig. 11 as cuts of the cumulative cost curve; Interpretation 11).
    items: [(prefix p, tokens c)] in round order. Returns (d, sorted cuts)."""
    items = [(float(p), int(c)) for p, c in items]
    n = sum(c for _, c in items)
    if n == 0:
        return 0, []
    starts, base = [], []
    s, F = 0, 0.0
    for p, c in items:
        starts.append(s)
        base.append(F)
        F = F + chunk_cost(p, c, a, b)
        s += c
    total = F

    def cut_at(y: float) -> int:
        # smallest integer offset u in [0, n] with F(u) >= y
        if y <= 0.0:
            return 0
        for i, (p, c) in enumerate(items):
            if base[i] + chunk_cost(p, c, a, b) >= y:
                lo, hi = 1, c  # F(s_i + c) >= y; F(s_i) = end of item i-1 < y
                while lo < hi:
                    mid = (lo + hi) // 2
                    if base[i] + chunk_cost(p, mid, a, b) >= y:
                        hi = mid
                    else:
                        lo = mid + 1
                return starts[i] + lo
        return n

    def cuts_at_depth(d: int) -> list:
        m = 2 ** d
        cs = {cut_at(total * (j / m)) for j in range(1, m)}
        return sorted(u for u in cs if 0 < u < n)

    for d in range(0, int(max_depth) + 1):
        cs = cuts_at_depth(d)
        first = cs[0] if cs else n
        if first <= min_tokens:
            return d, cs
    return int(max_depth), cuts_at_depth(int(max_depth))


def build_pieces(items, cuts, n):
    """Split the round's items [(kind 'd' | 'p', prefix, tokens)] at ``cuts`` into
    microbatch dicts (7g: a chunk part [u0, u1) of an item with prefix p adds (u1 - u0)
    p + (u1 (u1 + 1) - u0 (u0 + 1)) / 2 pairs; a decode adds one sequence and its
    context ``p``)."""
    bounds = [0] + list(cuts) + [n]
    pieces = []
    for j in range(len(bounds) - 1):
        lo, hi = bounds[j], bounds[j + 1]
        pc = {"prefill_tokens": 0, "prefill_pairs": 0.0, "decode_seqs": 0,
              "decode_ctx": 0.0}
        s = 0
        for kind, p, c in items:
            u0 = max(lo, s) - s
            u1 = min(hi, s + c) - s
            if u1 > u0:
                if kind == "d":
                    pc["decode_seqs"] += 1
                    pc["decode_ctx"] += float(p)
                else:
                    pc["prefill_tokens"] += u1 - u0
                    pc["prefill_pairs"] += ((u1 - u0) * float(p)
                                            + (u1 * (u1 + 1) - u0 * (u0 + 1)) / 2.0)
            s += c
        pieces.append(pc)
    return pieces


# ---- 7g: round time ---------------------------------------------------------------------
def round_time(pieces, k: int, hw: RooflineParams, delay: float, *, act_bytes=None,
               bw=None, block=16):
    """7g. Returns (T, bubble GPU-seconds). ``act_bytes`` / ``bw`` default to the
    roofline's ``activation_bytes_per_token`` / ``network_bw``."""
    act = hw.activation_bytes_per_token if act_bytes is None else float(act_bytes)
    link = hw.network_bw if bw is None else float(bw)
    if k == 1:
        # k = 1: one batch, iteration_time of the sums (step overhead, pp of hw)
        P = sum(pc["prefill_tokens"] for pc in pieces)
        pairs = sum(pc["prefill_pairs"] for pc in pieces)
        D = sum(pc["decode_seqs"] for pc in pieces)
        ctx = sum(pc["decode_ctx"] for pc in pieces)
        return iteration_time_f64(hw, P, D, ctx, block, pairs), 0.0
    # k > 1: the stage roofline (Interpretation 10)
    stage = hw._replace(weight_bytes=hw.weight_bytes / k,
                        kv_bytes_per_token=hw.kv_bytes_per_token / k,
                        dense_flops_per_token=hw.dense_flops_per_token / k,
                        attn_flops_per_ctx_token=hw.attn_flops_per_ctx_token / k,
                        pp=1.0, step_overhead_s=0.0)
    s_list, a_list = [], []
    for pc in pieces:
        s_j = iteration_time_f64(stage, pc["prefill_tokens"], pc["decode_seqs"],
                                 pc["decode_ctx"], block, pc["prefill_pairs"])
        tokens_j = pc["prefill_tokens"] + pc["decode_seqs"]
        a_j = k * (tokens_j * act / link + delay)
        s_list.append(s_j)
        a_list.append(a_j)
    sum_s = sum(s_list)
    T_c = max(sum_s, max(k * s_j + a_j for s_j, a_j in zip(s_list, a_list)))
    T = T_c + hw.step_overhead_s
    bubble = k * T_c - k * sum_s
    return T, bubble


# ---- the cluster --------------------------------------------------------------------------
@dataclass
class Cluster:
    n_instances: int
    C: float
    W: float
    kvb: float
    bw: float
    host_bw: float
    act_bytes: float
    B: int
    max_batch: int
    watermark: float
    t_chunk: float
    block: int
    hw: RooflineParams
    a: float
    b: float
    max_depth: int = 4
    coordinated: bool = True
    microbatch: str = "lookahead"


def simulate(arrival, prompt, output, cluster: Cluster, system: str, params: dict,
             max_steps: int) -> list:
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}")
    arrival = [float(x) for x in np.asarray(arrival, dtype=np.float64)]
    prompt = [int(x) for x in np.asarray(prompt)]
    output = [int(x) for x in np.asarray(output)]
    Rn = len(arrival)
    if any(arrival[i + 1] < arrival[i] for i in range(Rn - 1)):
        raise ValueError("arrivals must be non-decreasing (Interpretation 2)")
    if any(o < 1 for o in output):
        raise ValueError("output lengths must be >= 1")
    params = dict(params or {})
    cl = cluster
    N = int(cl.n_instances)
    C, W, kvb, bw = float(cl.C), float(cl.W), float(cl.kvb), float(cl.bw)
    hw = cl.hw
    kun = system == "kunserve"
    chunk_bytes = float(params.get("chunk_mib", 32.0)) * 2.0 ** 20
    if kun:
        theta = float(params["theta"])
        margin = float(params["margin"])
        min_tokens = float(params["min_tokens"])
        mb_mode = cl.microbatch
    else:
        theta = margin = min_tokens = 0.0
        mb_mode = "token"  # vllm-pp; the other systems never have k > 1

    # ---- instance state (Interpretation 14) -------------------------------------------
    # initial groups: singletons; vllm-pp: pairs {0,1}, {2,3}, ... (odd last alone)
    gid = [2 * (i // 2) if system == "vllm-pp" else i for i in range(N)]
    clock = [0.0] * N
    xend = [0.0] * N          # exchanging_until
    restoring = [False] * N
    pull_end = [0.0] * N

    # ---- request state ------------------------------------------------------------------
    status = [NEW] * Rn
    inst = [-1] * Rn
    target = list(prompt)
    done = [0] * Rn
    gen = [0] * Rn
    kv = [0] * Rn
    host = [0] * Rn
    stall = [0.0] * Rn
    t_first = [math.nan] * Rn
    t_finish = [math.nan] * Rn
    mig_to = [-1] * Rn         # destination gid of an unlanded migration, -1 if none
    mig_end = [INF] * Rn
    mig_kv = [0] * Rn          # the destination's reservation
    next_new = 0               # the next undispatched request

    # ---- helpers (plain scans; obviously correct rather than fast) ---------------------
    def groups():
        return sorted(set(gid))

    def members(g):
        return [i for i in range(N) if gid[i] == g]

    def group_of(r):
        return gid[inst[r]]

    def reqs(g, st):
        return [r for r in range(Rn) if status[r] == st and group_of(r) == g]

    def held(g):
        h = 0
        for r in range(Rn):
            if status[r] == RUNNING and group_of(r) == g:
                h += kv[r]
            if mig_to[r] >= 0 and gid[mig_to[r]] == g:
                h += mig_kv[r]
        return h

    def queued(g):
        return sum(target[r] + 1 for r in reqs(g, QUEUED))

    def cap(g):
        k = len(members(g))
        if restoring[g]:
            return k * C
        return k * C + (k - 1) * W

    def busy(g):
        return any(status[r] in (QUEUED, RUNNING, SWAPPED) and group_of(r) == g
                   for r in range(Rn))

    def set_members(g, arr, value):
        for i in members(g):
            arr[i] = value

    def cancel_migration(r):
        mig_to[r] = -1
        mig_end[r] = INF
        mig_kv[r] = 0

    snaps = []
    for _step in range(int(max_steps)):
        if all(s == FINISHED for s in status):
            break
        # ---- 1. the step's time --------------------------------------------------------
        t_arr = arrival[next_new] if next_new < Rn else INF
        busy_now = [g for g in groups() if busy(g)]
        t_busy = min((clock[g] for g in busy_now), default=INF)
        t = min(t_arr, t_busy)
        if t == INF:
            break  # nothing left (cannot happen while a request is unfinished)

        # ---- 2. dispatch (least loaded; Interpretations 2, 3) ---------------------------
        while next_new < Rn and arrival[next_new] <= t:
            r = next_new
            best = min(groups(), key=lambda g: ((held(g) + queued(g)) / cap(g), g))
            was_idle = not busy(best)
            inst[r] = best
            status[r] = QUEUED
            if was_idle:
                set_members(best, clock, max(clock[best], arrival[r]))
            next_new += 1

        # ---- 3. drop (kunserve; Interpretations 4, 5) -----------------------------------
        merges = []
        if kun:
            def eligible_g(h):
                return not (xend[h] > t) and not restoring[h]

            throttled = []
            for h in groups():
                if not eligible_g(h):
                    continue
                q = reqs(h, QUEUED)
                if not q:
                    continue
                hol = q[0]
                if held(h) + (target[hol] + 1) > (1.0 - margin) * cap(h):
                    throttled.append(h)
            if throttled:
                need_R = 0.0
                for h in throttled:
                    need_R += held(h) + queued(h) - (1.0 - margin) * cap(h)
                sizes = {h: len(members(h)) for h in groups()}
                elig = {h for h in groups() if eligible_g(h)}
                plan = drop_plan(sizes, elig, need_R, W, set(throttled))
                made = set()  # gids produced by this plan's merges
                for ga, gb in plan:
                    a_sz, b_sz = len(members(ga)), len(members(gb))
                    hA, hB = held(ga), held(gb)
                    t_merge = max(clock[ga], clock[gb])
                    nbytes = max(hA * b_sz, hB * a_sz) / (a_sz + b_sz) * kvb
                    x = (nbytes / (min(a_sz, b_sz) * bw)
                         + math.ceil(nbytes / chunk_bytes) * float(cl.t_chunk))
                    for r in reqs(ga, RUNNING) + reqs(gb, RUNNING):
                        stall[r] = max(stall[r], t_merge + x)
                    new_x = t_merge + x
                    for h in (ga, gb):
                        if h in made:  # chained merge (Interpretation 5)
                            new_x = max(new_x, xend[h])
                    new_g = min(ga, gb)
                    for i in members(ga) + members(gb):
                        gid[i] = new_g
                        clock[i] = t_merge
                        xend[i] = new_x
                        restoring[i] = False
                    made.add(new_g)
                    merges.append((ga, gb))

        # ---- 4. pick ---------------------------------------------------------------------
        busy_now = [g for g in groups() if busy(g)]
        assert busy_now, "a step with a finite time always has a busy group"
        g = min(busy_now, key=lambda h: (clock[h], h))
        t0 = clock[g]

        # ---- 5. migrations land (llumnix; Interpretation 8) -----------------------------
        for r in range(Rn):
            if mig_to[r] >= 0 and mig_end[r] <= t0:
                inst[r] = mig_to[r]
                cancel_migration(r)

        # ---- 6. restore of g (kunserve; Interpretation 9) -------------------------------
        restore_start = restore_end = False
        if kun and restoring[g] and t0 >= pull_end[g]:
            # 6a restore ends: split into singletons, balanced homes, KV gather
            mem = members(g)
            k = len(mem)
            run = reqs(g, RUNNING)
            que = reqs(g, QUEUED)
            K = sum(kv[r] for r in run)
            homes = {}
            c_r = 0
            for r in run:
                homes[r] = mem[min(k - 1, (k * c_r) // K)]
                c_r += kv[r]
            for r in que:
                homes[r] = mem[r % k]
            share = K * (1.0 - 1.0 / k) / k  # tokens each home pulls
            x = share * kvb / bw + math.ceil(share * kvb / chunk_bytes) * float(cl.t_chunk)
            for r in run:
                stall[r] = t0 + x
            for r, home in homes.items():
                inst[r] = home
            for i in mem:
                gid[i] = i
                restoring[i] = False
                xend[i] = t0 + x
                clock[i] = t0
            restore_end = True
        if kun and len(members(g)) > 1 and not restoring[g] and not (xend[g] > t0):
            # 6b restore starts
            k = len(members(g))
            if held(g) + queued(g) <= theta * k * C:
                set_members(g, restoring, True)
                set_members(g, pull_end, t0 + W * kvb * (1.0 - 1.0 / k) / bw)
                restore_start = True

        # ---- 7. round of g ---------------------------------------------------------------
        mem = members(g)
        k = len(mem)
        cap_g = cap(g)

        def runnable(r):
            return status[r] == RUNNING and group_of(r) == g and stall[r] <= t0

        def decode_growth():
            return sum(1 for r in range(Rn) if runnable(r) and done[r] >= target[r])

        preempted = []
        migrations = []
        swap_bytes = 0.0

        # 7b llumnix migration (before a; Interpretation 7)
        if system == "llumnix":
            growth = decode_growth()
            q = reqs(g, QUEUED)
            in_flight = any(mig_to[r] >= 0 and status[r] == RUNNING and group_of(r) == g
                            for r in range(Rn))
            if q and held(g) + growth + (target[q[0]] + 1) > cap_g and not in_flight:
                cands = [r for r in reqs(g, RUNNING) if stall[r] <= t0]
                others = [h for h in groups() if h != g]
                if cands and others:
                    r = cands[-1]
                    dest = min(others, key=lambda h: (-(cap(h) - held(h) - queued(h)), h))
                    free = cap(dest) - held(dest) - queued(dest)
                    if free >= kv[r]:
                        mig_to[r] = dest
                        mig_kv[r] = kv[r]
                        mig_end[r] = t0 + kv[r] * kvb / bw
                        migrations.append((r, dest))

        # 7a growth and preemption (highest index first)
        growth = decode_growth()
        while held(g) + growth > cap_g:
            run = reqs(g, RUNNING)
            if not run:
                break
            r = run[-1]
            if runnable(r) and done[r] >= target[r]:
                growth -= 1
            if mig_to[r] >= 0:
                cancel_migration(r)
            if system == "infercept":
                status[r] = SWAPPED
                host[r] = kv[r]
                swap_bytes += kv[r] * kvb
                kv[r] = 0
            else:
                status[r] = QUEUED
                kv[r] = 0
                target[r] = prompt[r] + gen[r]
                done[r] = 0
            preempted.append(r)

        # 7c swap in (infercept; prefix rule; none in a round that preempted, as vLLM's
        # scheduler; a returning decode's next token counts)
        if system == "infercept" and not preempted:
            for r in reqs(g, SWAPPED):
                grows = 1 if done[r] >= target[r] else 0
                if held(g) + growth + host[r] + grows <= cap_g:
                    status[r] = RUNNING
                    kv[r] = host[r]
                    swap_bytes += host[r] * kvb
                    host[r] = 0
                    growth += grows
                else:
                    break

        # 7d admission (prefix rule; watermark; k * max_batch)
        n_running = len(reqs(g, RUNNING))
        h_g = held(g)
        cum = 0
        admitted = 0
        for r in reqs(g, QUEUED):
            need = target[r] + 1
            if not (h_g + growth + cum + need <= cap_g - k * float(cl.watermark)):
                break
            if not (n_running + admitted + 1 <= k * int(cl.max_batch)):
                break
            status[r] = RUNNING
            kv[r] = need
            done[r] = 0
            cum += need
            admitted += 1

        # 7e work: decodes first, then prefill chunks within k * B - decodes
        decodes = [r for r in range(Rn) if runnable(r) and done[r] >= target[r]]
        budget = k * int(cl.B) - len(decodes)
        chunks = []
        for r in range(Rn):
            if runnable(r) and done[r] < target[r]:
                if budget <= 0:
                    break
                c = min(target[r] - done[r], budget)
                chunks.append((r, c))
                budget -= c
        items = ([("d", kv[r], 1) for r in decodes]
                 + [("p", done[r], c) for r, c in chunks])
        n_tok = sum(c for _, _, c in items)

        # 7f microbatches
        cuts = []
        if n_tok > 0 and k > 1:
            if mb_mode == "token":
                cuts = token_cuts(n_tok, int(cl.B))
            else:
                _, cuts = lookahead_cuts([(p, c) for _, p, c in items], float(cl.a),
                                         float(cl.b), min_tokens, int(cl.max_depth))
        # 7g time
        exch = xend[g] > t0
        T, bubble = 0.0, 0.0
        if n_tok > 0:
            pieces = build_pieces(items, cuts, n_tok)
            delay = chunk_bytes / bw if ((cl.coordinated and exch) or restoring[g]) else 0.0
            T, bubble = round_time(pieces, k, hw, delay, act_bytes=cl.act_bytes, bw=bw,
                                   block=cl.block)
            if not cl.coordinated and exch and k > 1:
                T += xend[g] - t0
        if system == "infercept" and swap_bytes > 0:
            T = max(T, swap_bytes / float(cl.host_bw))

        # 7h progress at t0 + T
        if T > 0:
            t1 = t0 + T
            progressed = []
            for r in decodes:
                gen[r] += 1
                kv[r] += 1
                progressed.append(r)
            for r, c in chunks:
                done[r] += c
                if done[r] >= target[r]:
                    if gen[r] == 0:
                        t_first[r] = t1
                    gen[r] += 1
                progressed.append(r)
            for r in sorted(progressed):
                if gen[r] >= output[r]:
                    status[r] = FINISHED
                    kv[r] = 0
                    t_finish[r] = t1
                    if mig_to[r] >= 0:
                        cancel_migration(r)
            set_members(g, clock, t1)
        else:
            # the round did nothing: the next event later than t0 (Interpretation 12)
            events = [stall[r] for r in reqs(g, RUNNING) if stall[r] > t0]
            if xend[g] > t0:
                events.append(xend[g])
            if restoring[g] and pull_end[g] > t0:
                events.append(pull_end[g])
            events += [mig_end[r] for r in range(Rn) if mig_to[r] >= 0 and mig_end[r] > t0]
            if next_new < Rn and arrival[next_new] > t0:
                events.append(arrival[next_new])
            set_members(g, clock, min(events) if events else t0 + hw.step_overhead_s)

        snaps.append({
            "gid": np.array(gid, dtype=np.int64),
            "clock": np.array(clock, dtype=np.float64),
            "status": np.array(status, dtype=np.int64),
            "inst": np.array(inst, dtype=np.int64),
            "target": np.array(target, dtype=np.int64),
            "done": np.array(done, dtype=np.int64),
            "gen": np.array(gen, dtype=np.int64),
            "kv": np.array(kv, dtype=np.int64),
            "host": np.array(host, dtype=np.int64),
            "stall": np.array(stall, dtype=np.float64),
            "t_first": np.array(t_first, dtype=np.float64),
            "t_finish": np.array(t_finish, dtype=np.float64),
            "picked": int(g),
            "T": float(T),
            "bubble": float(bubble),
            "cuts": list(cuts),
            "merges": list(merges),
            "restore_start": bool(restore_start),
            "restore_end": bool(restore_end),
            "preempted": list(preempted),
            "migrations": list(migrations),
            "exchanging_until": np.array(xend, dtype=np.float64),
            "restoring": np.array(restoring, dtype=bool),
            "pull_end": np.array(pull_end, dtype=np.float64),
        })
        if all(s == FINISHED for s in status):
            break
    return snaps
