"""State of the priced-eviction server (Token-PD and its baselines): the scan carry, the
family inputs and options. Semantics: ``docs/tokenpd-semantics.md``."""

from __future__ import annotations

from dataclasses import dataclass

import jax
from flax import struct

from models.server import Record

__all__ = ["EvictAcc", "EvictInputs", "EvictOptions", "EvictPolicy", "EvictRecord",
           "EvictSlots", "EvictState", "K_CLASSES", "N_GROUPS", "N_TIERS", "TIER_BOUNDS"]

K_CLASSES = 4                 # heavy-hitter classes (models.eviction.attention.QUANTILES)
N_GROUPS = K_CLASSES ** 2     # (true class, predicted class) pairs
N_TIERS = 4                   # token-pd-tiers: priority tiers of streams
# token-pd-tiers' tier bounds (prompt tokens): the quartiles of the prompt lengths of the
# Azure LLM conversation trace (shared/traces/azure-llm-2023-conv.csv, all 19,366 rows,
# ContextTokens; np.quantile(..., [0.25, 0.5, 0.75]) = 396, 1020, 1189 with every method,
# read through tuner.workloads.presets.resolve_trace("azure-conv")); whole trace: 4,728 /
# 4,928 / 4,865 / 4,845 requests in tiers 0-3, its first 100: 52 / 17 / 14 / 17
TIER_BOUNDS = (396, 1020, 1189)


@dataclass(frozen=True)
class EvictOptions:
    """Static options: the attention model (``window`` recent tokens get ``recency`` of
    each query; heavy hitters calibrated so that 10% heavy + 10% recent tokens retain
    ``retained`` of the mass; the predictor's log-normal error ``predictor_sigma``) and
    ``price_grad`` ("full" or "stop": the price recursion's feedback in relaxed runs);
    ``tier_bounds``: three ascending prompt lengths (tokens) that split streams into
    ``token-pd-tiers``' four tiers (tier = the number of bounds <= the prompt length)."""

    window: int = 32
    recency: float = 0.3
    retained: float = 0.9
    predictor_sigma: float = 1.0
    price_grad: str = "full"
    tier_bounds: tuple[int, ...] = TIER_BOUNDS

    def __post_init__(self):
        if int(self.window) < 1 or int(self.window) != self.window:
            raise ValueError(f"eviction options: window must be a positive integer, got "
                             f"{self.window}")
        if not 0.0 < float(self.recency) < 1.0:
            raise ValueError(f"eviction options: recency must lie in (0, 1), got "
                             f"{self.recency}")
        if not 0.0 < float(self.retained) < 1.0:
            raise ValueError(f"eviction options: retained must lie in (0, 1), got "
                             f"{self.retained}")
        if not float(self.predictor_sigma) >= 0.0:
            raise ValueError(f"eviction options: predictor_sigma must be >= 0, got "
                             f"{self.predictor_sigma}")
        if self.price_grad not in ("full", "stop"):
            raise ValueError(f"eviction options: price_grad must be 'full' or 'stop', got "
                             f"{self.price_grad!r}")
        b = self.tier_bounds
        if (not isinstance(b, tuple) or len(b) != N_TIERS - 1
                or not all(isinstance(v, int) and v >= 0 for v in b)
                or any(lo >= hi for lo, hi in zip(b, b[1:]))):
            raise ValueError(f"eviction options: tier_bounds must be {N_TIERS - 1} strictly "
                             f"ascending non-negative integers (prompt tokens), got {b!r}")


@dataclass(frozen=True)
class EvictPolicy:
    """``kind``: "none" (no-evict: preempt), "fifo", "lru", "h2o" or "pd" (Token-PD);
    ``tiered``: Token-PD's parameters and price per priority tier (token-pd-tiers)."""

    kind: str
    tiered: bool = False


@struct.dataclass
class EvictInputs:
    """Per-run inputs: the attention model's tables and each request's prompt tokens as
    old-group counts and ring groups (``models.eviction.attention``)."""

    h: jax.Array         # [K] class weight (true)
    m: jax.Array         # [K] E[h | predicted class]
    v: jax.Array         # [K] Var[h | predicted class]
    cum_p: jax.Array     # [K-1] float32 class cuts
    cum_conf: jax.Array  # [K, K-1] float32 confusion cuts
    old0: jax.Array      # [N, G] float32 prompt positions older than the ring, per group
    ring0: jax.Array     # [N, W] int32 group of the prompt position in each ring entry (-1)
    recency: jax.Array   # [] w_r


@struct.dataclass
class EvictSlots:
    req: jax.Array       # [S] int32, -1 empty
    status: jax.Array    # [S] int32 0 empty, 1 running, 2 preempted (waiting)
    prompt: jax.Array    # [S] int32
    output: jax.Array    # [S] int32
    gen: jax.Array       # [S] int32 tokens generated
    order: jax.Array     # [S] int32 admission counter (age among streams)
    weight: jax.Array    # [S] float32 (1: admission is exact at every temperature)
    arrival: jax.Array   # [S] float32
    t_admit: jax.Array   # [S] float32
    t_first: jax.Array   # [S] float32
    old_n: jax.Array     # [S, G] float32 tokens older than the ring, per group
    old_x: jax.Array     # [S, G] float32 of which kept
    ring_g: jax.Array    # [S, W] int32 group of the ring entry's token, -1 empty
    ring_x: jax.Array    # [S, W] float32 kept (0/1 exact)


@struct.dataclass
class EvictAcc:
    """The shared accumulators (:class:`models.server.Acc`, same names) and the
    family's quality, price and recompute counters."""

    completed: jax.Array
    tokens: jax.Array
    actual_kv: jax.Array
    preemptions: jax.Array
    stalls: jax.Array
    dropped: jax.Array
    queue_s: jax.Array
    ttft_ok: jax.Array
    tpot_ok: jax.Array
    slo_ok: jax.Array
    ttft_hist: jax.Array
    tpot_hist: jax.Array
    peak_kv: jax.Array       # [] largest kept tokens after a pass plus the appends
    max_use: jax.Array
    busy_s: jax.Array
    iters: jax.Array
    res_token_s: jax.Array
    e2e_hist: jax.Array      # [141] end-to-end latency histogram
    lost: jax.Array          # [] attention share lost, summed over decode queries
    queries: jax.Array       # [] decode queries
    utility: jax.Array       # [] sum of kept * A over decode iterations
    oracle: jax.Array        # [] the clairvoyant's utility
    viol_pos: jax.Array      # [] sum of max(K - M, 0)
    viol_signed: jax.Array   # [] sum of (K - M)
    demand_signed: jax.Array  # [] sum of (D - M), D = Token-PD's price-rule demand (= K
    #                           for the baselines)
    peak_budget_use: jax.Array  # [] largest (kept + appends) / M
    evicted: jax.Array       # [] tokens evicted
    restored: jax.Array      # [] tokens recomputed (Token-PD restores)
    recompute_s: jax.Array   # [] iteration time spent on restores
    kept_token_s: jax.Array  # [] kept tokens x seconds


@struct.dataclass
class EvictRecord(Record):
    pass


@struct.dataclass
class EvictState:
    slots: EvictSlots
    head: jax.Array      # [] int32 first request not yet admitted
    clock: jax.Array     # [] float32
    it: jax.Array        # [] int32
    counter: jax.Array   # [] int32 admissions so far (the next order)
    mu: jax.Array        # [] float32 Token-PD's price (attention share per token);
    #                      [N_TIERS] one per tier for token-pd-tiers
    acc: EvictAcc
    rec: EvictRecord | None
