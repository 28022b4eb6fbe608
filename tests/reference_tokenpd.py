"""Independent NumPy token-level reference of the priced-eviction family (``no-evict``,
``fifo``, ``lru``, ``h2o``, ``token-pd``, ``token-pd-tiers``).

This file implements ``docs/tokenpd-semantics.md`` (exact mode, T = 0) literally: every
token of every stream is kept individually (position, true class ``k``, predicted class
``k_hat``, kept flag), with plain Python loops over iterations, streams and candidates
(NumPy only inside one stream's token arrays). There are no histograms: an "old group"
of the spec is the set of a stream's tokens with age >= W sharing ``gid = k*4 + k_hat``.
It must not import anything from ``models/`` or ``tuner/`` except the attention model's
numbers (``models.eviction.attention.attention_tables``); the per-token class hash and
every policy rule are implemented here from the spec text (numpy + stdlib only).

Interpretations
---------------
Where the spec leaves a choice open, this reference does the following. The JAX side
should be aligned with these.

1. Numbers. The clock starts at ``np.float32(0)`` and adds
   ``np.float32(step_time(...))`` in float32 (``t = f32(t + dt)``); arrivals are
   float32 and compared as ``arrival[i] <= t`` in float32; the idle jump sets ``t =
   arrival[head]``. Token counts, kept amounts, attention shares, ``g``, ``U``,
   ``U*``, ``lost``, regret and violations are float64 (kept flags are exactly 0.0 /
   1.0 except in fifo / lru, 9). The price is float32: ``M32 = f32(f32(budget) *
   f32(C))``, ``z = f32(f32(eta) * f32(f32(D) - M32)) / M32`` (float32, ``D`` of 11),
   ``mu = f32(mu
   * f32(exp(z)))`` (``np.exp`` of a float32 scalar), starting from ``f32(mu_0)``.
   Everywhere else ``M = float(M32)`` (the knapsack's capacity and the violations),
   also for the baselines with ``budget = params.get("budget", 0.5)``.
2. Sums over a stream. ``H = sum_k n_k h_k`` and ``H_hat = sum_j n_j m_j`` are computed
   from the stream's per-class token counts (``n_k`` = tokens of true class k, ``n_j`` =
   tokens of predicted class j, over all L tokens, kept or not; float64, summed in class
   order), i.e. exactly the histogram form; ``h``, ``m``, ``v`` are the float32 tables
   widened to float64. ``A = w_r * [age < W] / min(L, W) + (1 - w_r) * h_k / H``,
   ``R_hat = w_r * [age < W] / min(L, W) + (1 - w_r) * m_{k_hat} / H_hat``, ``sigma2 =
   ((1 - w_r) / H_hat) ** 2 * v_{k_hat}``, ``g = R_hat - lam * sigma2 - mu`` with ``mu``
   the float32 price of the iteration's start widened to float64, all float64 in that
   order. Age 0 is the newest position ``L - 1``.
3. Token life cycle. A new stream admitted with prompt P gets positions ``0 .. P-1``,
   all kept, at admission (step 2); the prefill then only does ``gen += 1`` in step 6
   (growth 0). A preempted stream keeps its L tokens (positions and classes) with every
   kept flag 0 (its KV is freed) and keeps its slot. Its re-admission (``T = P + gen``
   tokens) sets every kept flag to 1 and adds position ``P + gen - 1`` (the token it had
   sampled but not stored), so it holds ``L = P + gen`` tokens at the policy pass, and
   step 6 does ``gen += 1``. A decoding stream appends position ``P + gen - 1 = L``
   (kept) in step 6, then ``gen += 1``.
4. Slots and order. A new request takes the lowest-numbered empty slot; a preempted
   stream keeps its slot while it waits. Every (re)admission takes ``order`` from a
   run-wide counter starting at 0 (walk order); preemption does not change it, so the
   waiting queue is the preempted streams by ascending ``order``, and a re-admitted
   stream becomes the youngest. "Oldest stream first" (fifo, lru) = ascending ``order``
   over the running streams (status 1, including those admitted this iteration); "the
   latest streams are preempted" = descending ``order``, one at a time, re-checking
   ``K + growth <= C`` after each (a preempted decoder no longer grows: ``growth -=
   1``). (The victims are always the youngest running streams and wait in their
   relative order, so renumbering at re-admission changes no outcome; stated for
   definiteness.)
5. Admission walk (step 2). ``head`` = the first valid request neither admitted nor
   dropped; invalid rows are skipped everywhere (never candidates, never dropped). The
   candidates are the preempted streams (ascending ``order``), then valid new requests
   in index order. A candidate with ``T = P + gen`` tokens is admitted iff all hold (any
   failure stops the walk): (new only) it has arrived and a slot is empty; ``running +
   admitted_so_far + 1 <= max_batch`` (``running`` = slots with status 1 at the walk's
   start); ``admitted_so_far == 0`` or ``T_cum + T <= max_prefill`` (``T_cum`` = the
   admitted candidates' ``P + gen``); ``protected + T_cum + T <= C - watermark``
   (float64; ``protected`` over the status-1 streams at the walk's start: all kept
   tokens for no-evict and h2o, kept tokens with age < W for fifo and lru (always
   ``min(L, W)`` there), 1 per running stream for token-pd (17); token-pd compares
   against ``limit - watermark`` instead of ``C - watermark``). ``admit_iter`` is the iteration of the first
   admission; ``first_s`` is set only once (the first prefill).
6. Drop rule. Right after the walk, if nothing was admitted and no slot has status 1:
   the first candidate (the first preempted stream by ``order``, else the head request
   if it has arrived) is dropped iff its ``P + gen > C - watermark`` (token-pd:
   ``limit - watermark``, 17). This also drops a
   preempted stream that grew past ``C - watermark`` (otherwise it would block the
   queue forever); its slot is freed. At most one drop per loop pass; that pass then
   has no work.
7. Iteration kinds. "prefill" if anyone was admitted (only the admitted streams
   compute; the others neither decode nor grow, growth = 0); else "decode" if a stream
   is still running after the policy pass (every running stream decodes, growth = their
   number); else "idle" (no work: e.g. an empty pass, a drop, or a no-evict pass that
   preempted every running stream). The policy pass (step 3) runs in every pass on all
   status-1 streams (the just-admitted ones included) with the iteration's growth.
   ``step_time`` is called only when ``prefill_tokens + decode_seqs > 0`` and such a
   pass counts in ``iterations`` (it is "an iteration that did work"); the loop counter
   ``it`` advances once per pass. A negative watermark is refused (it is what
   guarantees that the admitted streams of a prefill iteration are never preempted in
   it).
8. Capacity comparisons. no-evict, h2o and token-pd compare the exact integer ``K +
   growth > C``. fifo and lru (fractional kept amounts) start evicting iff ``over = K +
   growth - C > 1e-6`` tokens (absorbs float64 round-off of the fluid counts), evict
   ``over + fluid_extra[0] + fluid_extra[1] * C`` (default ``fluid_extra = (0, 0)``:
   exactly the excess), and preempt only if the old tokens of every running stream ran
   out and ``K + growth > C`` still holds (then ``K`` is the exact integer ring sum).
   The spec fixes only that ``K + growth <= C`` after the pass, not how much more may
   go: the JAX family (float32 counts) evicts ``over + 0.01 + 1e-5 C`` so that float32
   rounding cannot leave it above the capacity; ``fluid_extra=(0.01, 1e-5)`` is that
   choice.
9. fifo / lru fluid eviction. Per-token kept fractions (float64). Evicting ``e`` from a
   set of tokens of one stream (its old tokens, age >= W; for lru restricted to the
   used or unused classes) multiplies every token of the set by ``1 - e / X`` (``X`` =
   the set's kept sum), which is evicting from each old group in proportion to its
   kept amount; ``e = X`` sets them to exactly 0. lru: class k is used by stream s iff
   ``(1 - w_r) * h_k / H >= 1 / L`` (float64, true classes, L and H over all the
   stream's tokens before the appends; the same test in prefill iterations, where the
   stream has no query); phase 1 evicts the unused classes' old tokens stream by
   stream (oldest first), phase 2 the used classes' old tokens (oldest first).
10. h2o (every pass, every running stream, before its capacity rule). Eligible = kept
   tokens with age >= r. If more than k, the excess is evicted in the order: true class
   ascending; within a class old-group tokens (age >= W) before ring tokens; old groups
   in gid order (lowest positions first within a group); ring tokens oldest (lowest
   position) first. Kept flags stay 0/1.
11. token-pd pass. ``g`` for every token of every running stream with the iteration's
   starting price. (a) kept & ``g < 0`` -> evicted. The demand ``D`` = the kept tokens
   now plus the restore candidates of (c) (all of them, before any room is applied).
   (b) while ``K + growth > limit`` (17), the
   kept tokens are evicted in ascending ``(g, flat unit index, position)`` (flat index
   ``slot * (G + W) + u``, ``u = gid`` for age >= W, ``G + position mod W`` for age < W).
   (c) tokens that were not kept before the pass and have ``g >= delta * mu`` (float64
   product) are restored in descending ``g`` (ties: ascending flat unit index, then
   position) while ``K + growth <= limit`` stays true (the free room after (a) and
   (b)).
   ``restored`` counts them; each adds 1 prefill token and ``L`` pairs (``L`` = its
   stream's tokens at the pass). token-pd never preempts.
12. Work. ``prefill_tokens`` = sum of the admitted ``P + gen`` + restored tokens;
   ``prefill_pairs`` = sum ``T (T + 1) / 2`` over the admitted + sum ``L`` per restored
   token; ``decode_seqs`` = decoding streams; ``decode_ctx_tokens`` = sum ``(kept_s +
   1)`` over them (kept after the pass; a float for fifo / lru); ``kv_chunk_tokens`` =
   16. ``step_time`` gets Python ``int, int, float, int, float``.
13. Quality (decode iterations only, after the pass, before the appends): per decoding
   stream ``lost += sum (1 - kept) * A``, ``U += sum kept * A``; ``U*`` = fractional
   knapsack of all decoding streams' tokens (``x`` in [0, 1]) by ``A`` descending with
   ``sum x <= M``; ``regret += U* - U``; ``queries += decoding streams``. The budget
   violation is part of step 5, so it is accumulated in decode iterations only:
   ``violation_pos += max(K - M, 0)``, ``violation_signed += K - M`` with ``K`` the kept
   tokens after the pass (all running streams), and ``demand_signed += D - M`` (``D =
   K`` for the baselines). The price (token-pd) moves in every iteration with work
   (prefill ones too), after the appends, with ``D`` of 11 (the price rule's own
   decisions, before the hard budget caps them).
14. Appends and completion (step 6). Decoders append then ``gen += 1``; admitted
   streams ``gen += 1`` (first token: ``first_s = t``). Then every status-1 stream with
   ``gen >= O`` finishes in slot order (``finish_iter = it``, ``finish_s = t``, slot
   freed). ``peak_kept`` = max over passes of ``K + growth`` (after the pass, i.e. the
   memory the iteration holds after its appends). TTFT = ``f32(f32(first_s - arrival)
   + f32(request_overhead_s))``, TPOT = ``f32(finish_s - first_s) / f32(O - 1)`` (0 for
   ``O == 1``).
15. Termination. The loop ends when every valid request finished or was dropped, or
   after ``max_iters`` passes.
16. token-pd-tiers (the spec's section "Per-tier Token-PD"). ``params`` ``eta``, ``lam``,
   ``mu_0``, ``delta`` are sequences of 4 (``budget`` a scalar); ``tier_bounds`` (three
   ascending ints) is required. A stream's tier = ``#{b <= P}`` over the bounds (its
   request's prompt, so a preempted stream keeps it). Each tier has a float32 price
   ``mu_k`` (start ``f32(mu_0[k])``); everything in 1, 11 and 13 is done per token with
   its stream's tier's ``lam``, ``delta`` and ``mu_k`` (``thr = delta[k] * mu_k``
   float64), and the price update of 1 runs for each tier with its own ``eta[k]`` and
   the shared ``D``. token-pd is this with one tier.
17. token-pd's hard budget. ``limit = floor(min(M, C))`` (``M`` of 1, float64 min and
   floor) for token-pd and token-pd-tiers, ``C`` for the baselines: the heap (11 b) and
   the room (11 c) use it, so ``K + growth <= limit`` after every pass. Admission
   (5) protects one token per status-1 stream at the walk's start (its next append),
   so the running streams never outnumber ``limit - watermark`` and the heap can
   always meet the limit.

Result
------
A dict. Per request (arrays over the input rows): ``admit_iter``, ``finish_iter`` (int,
-1 if never), ``first_s``, ``finish_s``, ``ttft_s``, ``tpot_s`` (float32, nan),
``dropped`` (bool). Totals: ``completed``, ``n_dropped``, ``unserved``, ``preemptions``,
``restored``, ``lost``, ``queries``, ``regret``, ``violation_pos``,
``violation_signed``, ``demand_signed`` (11, 13), ``limit`` (17), ``peak_kept``, ``iterations`` (passes with work),
``loop_iterations``, ``clock``, ``fluid_evicted`` (fifo / lru: the kept amount evicted
by the fluid rule, ``[first phase, second phase]``: lru's unused classes, then its used
ones; fifo has one phase), ``mu`` (final, None unless token-pd; token-pd-tiers: a
list of the 4 tier prices, also in ``mu_trace`` and the snapshots), ``mu_trace`` (per
pass), ``M``, ``step_calls`` (the argument tuples passed to ``step_time``) and
``snapshots`` (None unless ``snapshots=True``): one dict per loop pass with ``it``,
``kind`` ("prefill" | "decode" | "idle"), ``clock`` (after the pass), ``mu`` (after the
update; None unless token-pd), ``K`` (kept after step 3), ``D`` (11; ``K`` for the
baselines), ``growth``, ``lost``, ``U``,
``U_star`` (this pass; 0 unless decode), ``restored`` (this pass), ``admitted``
(request indices), ``streams`` (after step 3, before step 6) and ``after`` (after step
6): ``{request: {"slot", "status" (1 running, 2 preempted), "gen", "old_n" (float [16]:
tokens per gid with age >= W), "old_x" (float [16]: kept per gid with age >= W), "ring"
([(position, gid, kept)] for age < W, ascending position)}}``.

Test hooks (not in the spec): ``tables`` replaces the attention tables (any object with
float arrays ``h``, ``m``, ``v`` [4] and ``cum_p`` [3], ``cum_conf`` [4, 3]);
``classes`` replaces the hash: ``classes(req, positions) -> (k, k_hat)`` integer arrays.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["simulate_reference", "fmix32", "token_classes", "attention_shares",
           "tokenpd_excess"]

EMPTY, RUNNING, PREEMPTED = 0, 1, 2
NK = 4             # classes
G = NK * NK        # groups gid = k * NK + k_hat
KV_CHUNK = 16
F32 = np.float32
FLUID_TOL = 1e-6   # Interpretation 8
SYSTEMS = ("no-evict", "fifo", "lru", "h2o", "token-pd", "token-pd-tiers")
N_TIERS = 4        # token-pd-tiers (Interpretation 16)


# ---- the attention model -------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _tables(recency: float, retained: float, predictor_sigma: float):
    try:
        from models.eviction.attention import attention_tables
    except Exception:  # the package's __init__ may be mid-edit: load the module alone
        import importlib.util
        import os
        import sys
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "models", "eviction", "attention.py")
        spec = importlib.util.spec_from_file_location("_tokenpd_ref_attention", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        attention_tables = mod.attention_tables
    return attention_tables(recency=recency, retained=retained,
                            predictor_sigma=predictor_sigma)


def fmix32(h):
    """MurmurHash3's 32-bit finaliser on uint32 arrays (wrapping)."""
    h = np.asarray(h, dtype=np.uint32)
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint32(16))
        h = (h * np.uint32(0x85EBCA6B)).astype(np.uint32)
        h = h ^ (h >> np.uint32(13))
        h = (h * np.uint32(0xC2B2AE35)).astype(np.uint32)
        h = h ^ (h >> np.uint32(16))
    return h


def token_classes(req, pos, cum_p, cum_conf):
    """(k, k_hat) of the tokens at positions ``pos`` of request ``req`` (the spec's
    hash:
    ``x = req * 0x9E3779B1 + pos * 0x85EBCA77`` in uint32, ``U1 = (fmix32(x) >> 8) /
    2**24``, ``U2`` the same of ``x ^ 0x68E31DA4``; ``k = #{j: U1 >= P_j}``, ``k_hat =
    #{j: U2 >= P(.|k)_j}``, float32)."""
    pos = np.atleast_1d(np.asarray(pos, dtype=np.int64))
    with np.errstate(over="ignore"):
        r = np.full(pos.shape, int(req) & 0xFFFFFFFF, dtype=np.uint32)
        x = (r * np.uint32(0x9E3779B1)).astype(np.uint32)
        x = (x + (pos.astype(np.uint32) * np.uint32(0x85EBCA77)).astype(np.uint32)
             ).astype(np.uint32)
    two24 = F32(2 ** 24)
    u1 = (fmix32(x) >> np.uint32(8)).astype(F32) / two24
    u2 = (fmix32(x ^ np.uint32(0x68E31DA4)) >> np.uint32(8)).astype(F32) / two24
    cum_p = np.asarray(cum_p, dtype=F32)
    cum_conf = np.asarray(cum_conf, dtype=F32)
    k = np.zeros(pos.shape, dtype=np.int64)
    for j in range(NK - 1):
        k += (u1 >= cum_p[j])
    rows = cum_conf[k]  # [n, K-1]: the cumulative confusion row of each true class
    kh = np.zeros(pos.shape, dtype=np.int64)
    for j in range(NK - 1):
        kh += (u2 >= rows[:, j])
    return k, kh


def _ages(L: int, W: int):
    age = (L - 1) - np.arange(L)
    return age, age < W


def attention_shares(k, W: int, w_r: float, h) -> np.ndarray:
    """Realised per-query share A of every token (positions 0 .. L-1, classes k)."""
    k = np.asarray(k)
    L = k.size
    if L == 0:
        return np.zeros(0)
    h = np.asarray(h, dtype=np.float64)
    counts = np.bincount(k, minlength=NK)
    H = 0.0
    for c in range(NK):
        H += counts[c] * h[c]
    _, ring = _ages(L, W)
    return w_r * ring / min(L, W) + (1.0 - w_r) * h[k] / H


def tokenpd_excess(kh, W: int, w_r: float, m, v, lam: float, mu: float) -> np.ndarray:
    """g = R_hat - lam * sigma^2 - mu of every token (predicted classes kh)."""
    kh = np.asarray(kh)
    L = kh.size
    if L == 0:
        return np.zeros(0)
    m = np.asarray(m, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    counts = np.bincount(kh, minlength=NK)
    Hh = 0.0
    for c in range(NK):
        Hh += counts[c] * m[c]
    _, ring = _ages(L, W)
    r_hat = w_r * ring / min(L, W) + (1.0 - w_r) * m[kh] / Hh
    sigma2 = ((1.0 - w_r) / Hh) ** 2 * v[kh]
    return r_hat - lam * sigma2 - mu


# ---- streams -------------------------------------------------------------------------
class _Stream:
    """One occupied slot: a request's tokens, positions 0 .. L-1 (index = position)."""

    def __init__(self, req: int, slot: int, order: int, k, kh):
        self.req = req
        self.slot = slot
        self.order = order
        self.status = RUNNING
        self.gen = 0
        self.k = np.asarray(k, dtype=np.int64)
        self.kh = np.asarray(kh, dtype=np.int64)
        self.kept = np.ones(self.k.size, dtype=np.float64)

    @property
    def L(self) -> int:
        return int(self.k.size)

    @property
    def gid(self):
        return self.k * NK + self.kh

    def append(self, k, kh, kept=1.0):
        self.k = np.append(self.k, np.int64(k))
        self.kh = np.append(self.kh, np.int64(kh))
        self.kept = np.append(self.kept, float(kept))

    def kept_sum(self) -> float:
        return float(np.sum(self.kept))

    def view(self, W: int) -> dict:
        age, ring = _ages(self.L, W)
        gid = self.gid
        old = ~ring
        old_n = np.bincount(gid[old], minlength=G).astype(np.float64)
        old_x = np.bincount(gid[old], weights=self.kept[old], minlength=G)
        return {"slot": self.slot, "status": self.status, "gen": self.gen,
                "old_n": old_n, "old_x": old_x,
                "ring": [(p, int(gid[p]), float(self.kept[p]))
                         for p in range(self.L) if ring[p]]}


def simulate_reference(arrival, prompt, output, valid, *, system, params, n_slots,
                       max_batch, max_prefill, capacity, watermark, step_time,
                       window=32, recency=0.3, retained=0.9, predictor_sigma=1.0,
                       max_iters=100000, request_overhead_s=0.0, snapshots=False,
                       tables=None, classes=None, tier_bounds=None,
                       fluid_extra=(0.0, 0.0)) -> dict:
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}")
    if float(watermark) < 0:
        raise ValueError("watermark must be >= 0 (Interpretation 7)")
    params = dict(params or {})
    arrival = np.asarray(arrival, dtype=np.float32)
    prompt = np.asarray(prompt).astype(np.int64)
    output = np.asarray(output).astype(np.int64)
    valid = np.asarray(valid, dtype=bool)
    n = arrival.shape[0]
    S = int(n_slots)
    W = int(window)
    w_r = float(recency)
    C = float(capacity)
    wm = float(watermark)
    max_batch = int(max_batch)
    max_prefill_f = float(max_prefill)
    tab = tables if tables is not None else _tables(float(recency), float(retained),
                                                    float(predictor_sigma))
    h_tab = np.asarray(tab.h, dtype=np.float64)
    m_tab = np.asarray(tab.m, dtype=np.float64)
    v_tab = np.asarray(tab.v, dtype=np.float64)

    def classes_of(req: int, pos):
        if classes is not None:
            k, kh = classes(req, np.asarray(pos))
            return np.asarray(k, dtype=np.int64), np.asarray(kh, dtype=np.int64)
        return token_classes(req, pos, tab.cum_p, tab.cum_conf)

    tiers = system == "token-pd-tiers"
    tpd = system in ("token-pd", "token-pd-tiers")
    budget = float(params["budget"]) if tpd else float(params.get("budget", 0.5))
    M32 = F32(F32(budget) * F32(C))
    M = float(M32)
    # the most tokens held after a pass (appends included): token-pd's hard budget, whole
    # tokens (Interpretation 17), the capacity for the baselines
    limit = float(math.floor(min(M, C))) if tpd else C
    # Token-PD's values per tier (Interpretation 16; token-pd: one tier)
    n_tiers = N_TIERS if tiers else 1
    if tpd:
        def per_tier(name):
            v = np.asarray(params[name], dtype=np.float64).reshape(-1)
            if v.size != n_tiers:
                raise ValueError(f"{system}: {name} needs {n_tiers} value(s), got {v.size}")
            return [float(x) for x in v]

        eta32 = [F32(x) for x in per_tier("eta")]
        lam = per_tier("lam")
        delta = per_tier("delta")
        mu = [F32(x) for x in per_tier("mu_0")]
    else:
        mu = None
    bounds: list[int] = []
    if tiers:
        if tier_bounds is None or len(tier_bounds) != N_TIERS - 1:
            raise ValueError("token-pd-tiers needs tier_bounds: 3 ascending prompt lengths")
        bounds = [int(b) for b in tier_bounds]

    def tier_of(st) -> int:
        return sum(1 for b in bounds if b <= int(prompt[st.req])) if tiers else 0

    def mu_out():
        if mu is None:
            return None
        return [float(x) for x in mu] if tiers else float(mu[0])
    if system == "h2o":
        h2o_k = int(params["k"])
        h2o_r = int(params["r"])

    # ---- outputs ---------------------------------------------------------------------
    admit_iter = np.full(n, -1, dtype=np.int64)
    finish_iter = np.full(n, -1, dtype=np.int64)
    first_s = np.full(n, np.nan, dtype=np.float32)
    finish_s = np.full(n, np.nan, dtype=np.float32)
    dropped = np.zeros(n, dtype=bool)
    preemptions = restored_total = queries = iterations = 0
    lost_total = regret = viol_pos = viol_signed = demand_signed = 0.0
    peak_kept = 0.0
    fluid_evicted = [0.0, 0.0]
    snaps: list[dict] = []
    mu_trace: list = []
    step_calls: list[tuple] = []

    slots: list[_Stream | None] = [None] * S
    t = F32(0.0)
    head = 0
    remaining = int(valid.sum())
    order_ctr = 0
    it = 0

    def status_slots(status: int) -> list[int]:
        return sorted((s for s in range(S) if slots[s] is not None
                       and slots[s].status == status), key=lambda s: slots[s].order)

    def kept_total() -> float:
        tot = 0.0
        for s in status_slots(RUNNING):
            tot += slots[s].kept_sum()
        return tot

    def protected_of(st: _Stream) -> float:
        if system in ("no-evict", "h2o"):
            return st.kept_sum()
        if system in ("fifo", "lru"):
            _, ring = _ages(st.L, W)
            return float(np.sum(st.kept[ring]))
        return 1.0  # token-pd: the stream's next token (Interpretation 17)

    def preempt(s: int):
        nonlocal preemptions
        st = slots[s]
        st.status = PREEMPTED
        st.kept[:] = 0.0
        preemptions += 1

    def preempt_latest_while_over(decoders: list[int]) -> int:
        """Interpretation 4: returns the growth left."""
        growth = len(decoders)
        while True:
            run = status_slots(RUNNING)
            if not run or not (kept_total() + growth > C):
                return growth
            s = run[-1]
            preempt(s)
            if s in decoders:
                decoders.remove(s)
                growth -= 1

    def streams_view() -> dict:
        return {slots[s].req: slots[s].view(W) for s in range(S)
                if slots[s] is not None}

    while it < max_iters and remaining > 0:
        while head < n and not valid[head]:
            head += 1

        # ---- 1. idle jump -----------------------------------------------------------
        if all(sl is None for sl in slots) and head < n and not (arrival[head] <= t):
            t = arrival[head]

        # ---- 2. admission ------------------------------------------------------------
        running = status_slots(RUNNING)
        protected = 0.0
        for s in running:
            protected += protected_of(slots[s])
        waiting = status_slots(PREEMPTED)
        admitted: list[tuple[int, int]] = []  # (slot, T)
        T_cum = 0

        def fits(T: int) -> bool:
            if not (len(running) + len(admitted) + 1 <= max_batch):
                return False
            if admitted and not (T_cum + T <= max_prefill_f):
                return False
            return protected + T_cum + T <= limit - wm

        stopped = False
        for s in waiting:
            st = slots[s]
            T = int(prompt[st.req]) + st.gen
            if not fits(T):
                stopped = True
                break
            k, kh = classes_of(st.req, [st.L])
            assert st.L == T - 1
            st.append(k[0], kh[0])
            st.kept[:] = 1.0
            st.status = RUNNING
            st.order = order_ctr
            order_ctr += 1
            admitted.append((s, T))
            T_cum += T
        if not stopped:
            j = head
            while j < n:
                if not valid[j]:
                    j += 1
                    continue
                if not (arrival[j] <= t):
                    break
                free = [s for s in range(S) if slots[s] is None]
                if not free:
                    break
                T = int(prompt[j])
                if not fits(T):
                    break
                k, kh = classes_of(j, np.arange(T))
                slots[free[0]] = _Stream(j, free[0], order_ctr, k, kh)
                order_ctr += 1
                admit_iter[j] = it
                admitted.append((free[0], T))
                T_cum += T
                j += 1
            head = j

        # drop rule (Interpretation 6)
        if not admitted and not running:
            while head < n and not valid[head]:
                head += 1
            if waiting:
                st = slots[waiting[0]]
                if int(prompt[st.req]) + st.gen > limit - wm:
                    dropped[st.req] = True
                    slots[waiting[0]] = None
                    remaining -= 1
            elif head < n and arrival[head] <= t and int(prompt[head]) > limit - wm:
                dropped[head] = True
                remaining -= 1
                head += 1

        # ---- 3. policy pass ----------------------------------------------------------
        decoders = list(running) if not admitted else []
        growth = len(decoders)
        restored_now = 0
        restored_pairs = 0
        active = status_slots(RUNNING)  # oldest first

        if system == "no-evict":
            growth = preempt_latest_while_over(decoders)

        elif system in ("fifo", "lru"):
            need = kept_total() + growth - C
            if need > FLUID_TOL:
                need += float(fluid_extra[0]) + float(fluid_extra[1]) * C
                phases = []
                for s in active:
                    st = slots[s]
                    _, ring = _ages(st.L, W)
                    old = ~ring
                    if system == "fifo":
                        phases.append((0, s, old))
                    else:
                        H = 0.0
                        counts = np.bincount(st.k, minlength=NK)
                        for c in range(NK):
                            H += counts[c] * h_tab[c]
                        used = np.array([(1.0 - w_r) * h_tab[c] / H >= 1.0 / st.L
                                         for c in range(NK)])
                        phases.append((0, s, old & ~used[st.k]))
                        phases.append((1, s, old & used[st.k]))
                phases.sort(key=lambda x: (x[0], slots[x[1]].order))
                for phase, s, mask in phases:
                    if need <= 0.0:
                        break
                    st = slots[s]
                    X = float(np.sum(st.kept[mask]))
                    if X <= 0.0:
                        continue
                    if need >= X:
                        st.kept[mask] = 0.0
                        fluid_evicted[phase] += X
                        need -= X
                    else:
                        st.kept[mask] *= 1.0 - need / X
                        fluid_evicted[phase] += need
                        need = 0.0
                if need > 0.0:  # every old token gone: preempt the latest
                    growth = preempt_latest_while_over(decoders)

        elif system == "h2o":
            for s in active:
                st = slots[s]
                age, ring = _ages(st.L, W)
                elig = np.nonzero((age >= h2o_r) & (st.kept > 0.0))[0]
                excess = elig.size - h2o_k
                if excess > 0:
                    region = ring[elig].astype(np.int64)  # 0 old, 1 ring
                    gkey = np.where(ring[elig], 0, st.gid[elig])
                    order_idx = np.lexsort((elig, gkey, region, st.k[elig]))
                    st.kept[elig[order_idx[:excess]]] = 0.0
            growth = preempt_latest_while_over(decoders)

        else:  # token-pd, token-pd-tiers
            heap_g, heap_flat, heap_pos, heap_slot = [], [], [], []
            g_of = {}
            was = {}
            thr = {}
            for s in active:  # (a) evict every kept token with g < 0
                st = slots[s]
                k_t = tier_of(st)
                mu64 = float(mu[k_t])
                thr[s] = delta[k_t] * mu64
                g = tokenpd_excess(st.kh, W, w_r, m_tab, v_tab, lam[k_t], mu64)
                g_of[s] = g
                was[s] = st.kept > 0.0
                st.kept[was[s] & (g < 0.0)] = 0.0

            def units(s):
                st = slots[s]
                _, ring = _ages(st.L, W)
                pos = np.arange(st.L)
                return pos, s * (G + W) + np.where(ring, G + pos % W, st.gid)

            # the price rule's demand D: kept after (a) plus the restores it wants
            demand = float(int(round(kept_total())))
            for s in active:
                st = slots[s]
                demand += float(np.sum((~was[s]) & (g_of[s] >= thr[s])))
            need = int(round(kept_total())) + growth - limit
            if need > 0:  # (b) the shared heap: ascending (g, flat unit, position)
                for s in active:
                    st = slots[s]
                    pos, flat = units(s)
                    sel = st.kept > 0.0
                    heap_g.append(g_of[s][sel])
                    heap_flat.append(flat[sel])
                    heap_pos.append(pos[sel])
                    heap_slot.append(np.full(int(sel.sum()), s))
                hg = np.concatenate(heap_g)
                hf = np.concatenate(heap_flat)
                hp = np.concatenate(heap_pos)
                hs = np.concatenate(heap_slot)
                idx = np.lexsort((hp, hf, hg))
                for i in idx[:int(math.ceil(need))]:
                    slots[int(hs[i])].kept[int(hp[i])] = 0.0
            # (c) restores: tokens evicted before this pass with g >= delta * mu, the
            # largest g first (ties: flat unit index, position), into the free room
            room = int(limit) - growth - int(round(kept_total()))
            cg, cf, cp, cs = [], [], [], []
            for s in active:
                st = slots[s]
                pos, flat = units(s)
                sel = (~was[s]) & (g_of[s] >= thr[s]) & (st.kept == 0.0)
                cg.append(g_of[s][sel])
                cf.append(flat[sel])
                cp.append(pos[sel])
                cs.append(np.full(int(sel.sum()), s))
            if room > 0 and cg:
                rg = np.concatenate(cg)
                rf = np.concatenate(cf)
                rp = np.concatenate(cp)
                rs = np.concatenate(cs)
                for i in np.lexsort((rp, rf, -rg))[:room]:
                    st = slots[int(rs[i])]
                    st.kept[int(rp[i])] = 1.0
                    restored_now += 1
                    restored_pairs += st.L

        decoders = [s for s in decoders if slots[s].status == RUNNING]
        growth = len(decoders)
        K = kept_total()
        if not tpd:
            demand = K
        peak_kept = max(peak_kept, K + growth)
        if admitted:
            kind = "prefill"
        elif decoders:
            kind = "decode"
        else:
            kind = "idle"
        view3 = streams_view() if snapshots else None
        admitted_reqs = [slots[s].req for s, _ in admitted]

        # ---- 4. work and time --------------------------------------------------------
        prefill_tokens = T_cum + restored_now
        pairs = (float(sum(T * (T + 1) / 2.0 for _, T in admitted))
                 + float(restored_pairs))
        decode_ctx = 0.0
        for s in decoders:
            decode_ctx += slots[s].kept_sum() + 1.0
        work = prefill_tokens + len(decoders) > 0
        if work:
            args = (int(prefill_tokens), int(len(decoders)), float(decode_ctx),
                    KV_CHUNK, float(pairs))
            step_calls.append(args)
            dt = F32(float(step_time(*args)))
            t = F32(t + dt)
            iterations += 1
        restored_total += restored_now

        # ---- 5. quality (decode iterations) ------------------------------------------
        lost_it = U_it = Ustar_it = 0.0
        if decoders:
            all_A = []
            for s in decoders:
                st = slots[s]
                A = attention_shares(st.k, W, w_r, h_tab)
                lost_it += float(np.sum((1.0 - st.kept) * A))
                U_it += float(np.sum(st.kept * A))
                all_A.append(A)
            a = np.sort(np.concatenate(all_A))[::-1]
            cap = M
            for val in a:
                if cap <= 0.0:
                    break
                x = min(1.0, cap)
                Ustar_it += x * float(val)
                cap -= x
            lost_total += lost_it
            regret += Ustar_it - U_it
            queries += len(decoders)
            viol_pos += max(K - M, 0.0)
            viol_signed += K - M
            demand_signed += demand - M

        # ---- 6. appends and completion -----------------------------------------------
        for s in decoders:
            st = slots[s]
            p = int(prompt[st.req]) + st.gen - 1
            assert p == st.L
            k, kh = classes_of(st.req, [p])
            st.append(k[0], kh[0])
            st.gen += 1
        for s, _ in admitted:
            st = slots[s]
            st.gen += 1
            if np.isnan(first_s[st.req]):
                first_s[st.req] = t
        for s in range(S):
            st = slots[s]
            if st is None or st.status != RUNNING:
                continue
            if st.gen >= int(output[st.req]):
                finish_iter[st.req] = it
                finish_s[st.req] = t
                slots[s] = None
                remaining -= 1

        # ---- 7. price ----------------------------------------------------------------
        if tpd and work:
            for k_t in range(n_tiers):
                z = F32(F32(eta32[k_t] * F32(F32(demand) - M32)) / M32)
                mu[k_t] = F32(mu[k_t] * F32(np.exp(z)))
        mu_trace.append(mu_out())

        if snapshots:
            snaps.append({"it": it, "kind": kind, "clock": float(t),
                          "mu": mu_out(), "K": K, "D": demand,
                          "growth": growth, "lost": lost_it, "U": U_it,
                          "U_star": Ustar_it, "restored": restored_now,
                          "admitted": admitted_reqs,
                          "streams": view3, "after": streams_view()})
        it += 1

    # ---- per-request metrics ---------------------------------------------------------
    done = finish_iter >= 0
    overhead = F32(request_overhead_s)
    ttft_s = np.full(n, np.nan, dtype=np.float32)
    tpot_s = np.full(n, np.nan, dtype=np.float32)
    for i in range(n):
        if not done[i]:
            continue
        ttft_s[i] = F32(F32(first_s[i] - arrival[i]) + overhead)
        o = int(output[i])
        tpot_s[i] = (F32(F32(finish_s[i] - first_s[i]) / F32(o - 1)) if o > 1
                     else F32(0.0))
    return {
        "admit_iter": admit_iter,
        "finish_iter": finish_iter,
        "first_s": first_s,
        "finish_s": finish_s,
        "dropped": dropped,
        "ttft_s": ttft_s,
        "tpot_s": tpot_s,
        "completed": int(done.sum()),
        "n_dropped": int(dropped.sum()),
        "unserved": int((valid & ~done & ~dropped).sum()),
        "preemptions": int(preemptions),
        "restored": int(restored_total),
        "lost": float(lost_total),
        "queries": int(queries),
        "regret": float(regret),
        "violation_pos": float(viol_pos),
        "violation_signed": float(viol_signed),
        "demand_signed": float(demand_signed),
        "limit": limit,
        "peak_kept": float(peak_kept),
        "iterations": int(iterations),
        "loop_iterations": int(it),
        "clock": float(t),
        "fluid_evicted": [float(x) for x in fluid_evicted],
        "mu": mu_out(),
        "mu_trace": mu_trace,
        "M": M,
        "step_calls": step_calls,
        "snapshots": snaps if snapshots else None,
    }
