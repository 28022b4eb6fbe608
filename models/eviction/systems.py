"""The priced-eviction family's systems, registered by name: ``token-pd``,
``token-pd-tiers``, ``fifo``, ``lru``, ``h2o``, ``no-evict``."""

from __future__ import annotations

import math

from models.eviction.state import N_TIERS
from models.registry import ParamSpec, SystemSpec, register_system

__all__ = ["FIFO", "H2O", "LRU", "NO_EVICT", "TOKEN_PD", "TOKEN_PD_TIERS"]

TOKEN_PD_SRC = (
    "Token-PD (shared/seeds/token-pd.txt): keep iff R_hat - lambda sigma^2 - mu c >= 0 (eq. "
    "4), mu <- mu exp(eta (sum c x - M) / M) (eq. 5) with eta ~ 1/sqrt(T) (section 4; "
    "default T = max_len); lambda in [0, 0.5] in the ablation (default: its middle, "
    "0.25). mu_0, delta and M are not published: our choices mu_0 = 1/max_len (the "
    "uniform share of a full context), restore when g >= delta mu with delta = 1, "
    "M = 0.5 of the KV capacity.")
_BUDGET = ParamSpec("budget", "interval", "share of the KV capacity",
                    "Token-PD's memory budget M: a hard cap on its kept tokens "
                    "(floor(min(M, C))) and the target of its price", 0.05, 1.0,
                    tunable=False)

TOKEN_PD = register_system(SystemSpec(
    name="token-pd", family="eviction",
    doc="Token-PD: every cached token priced by its predicted attention return, risk and "
        "a dual memory price updated multiplicatively each step; tokens below the price "
        "are evicted (recomputed later if they become worth it), a shared heap enforces "
        "the budget M as a hard cap.",
    params=(
        ParamSpec("eta", "log_positive", "1", "dual learning rate of the price"),
        ParamSpec("lam", "interval", "1/share", "risk aversion lambda", 0.0, 100.0),
        ParamSpec("mu_0", "log_positive", "attention share per token", "initial price"),
        ParamSpec("delta", "interval", "prices", "restore (recompute) an evicted token "
                  "when its excess g >= delta * mu", 0.0, 10.0),
        _BUDGET,
    ),
    defaults=lambda max_len, hw=None: {"eta": 1.0 / math.sqrt(max_len), "lam": 0.25,
                                       "mu_0": 1.0 / max_len, "delta": 1.0,
                                       "budget": 0.5},
    baselines=("fifo", "lru", "h2o", "no-evict"), sources=(TOKEN_PD_SRC,)))

TOKEN_PD_TIERS_SRC = (
    "token-pd-tiers (ours, a tuning benchmark): Token-PD's eta, lam, mu_0 and delta per "
    "priority tier of streams (4 tiers by prompt length, the eviction family's "
    "tier_bounds option: quartiles of the Azure conversation trace's prompts), one price "
    "per tier driven by the shared memory signal; with equal entries it is token-pd. "
    "Defaults: token-pd's in every tier.")


def _token_pd_tiers_defaults(max_len, hw=None):
    scalar = TOKEN_PD.defaults(max_len, hw)
    out = {k: [float(scalar[k])] * N_TIERS for k in ("eta", "lam", "mu_0", "delta")}
    return {**out, "budget": scalar["budget"]}


TOKEN_PD_TIERS = register_system(SystemSpec(
    name="token-pd-tiers", family="eviction",
    doc="Token-PD with its four parameters per priority tier (K = 4 tiers of streams by "
        "prompt length): each tier has its own price, updated from the shared memory "
        "signal, its own risk aversion and restore threshold; one shared heap enforces "
        "the shared budget M as a hard cap. 16 tunable parameters.",
    params=(
        ParamSpec("eta", "log_positive", "1", "dual learning rate of each tier's price "
                  f"[{N_TIERS}]"),
        ParamSpec("lam", "interval", "1/share", f"risk aversion lambda per tier [{N_TIERS}]",
                  0.0, 100.0),
        ParamSpec("mu_0", "log_positive", "attention share per token",
                  f"initial price per tier [{N_TIERS}]"),
        ParamSpec("delta", "interval", "prices", "restore (recompute) an evicted token "
                  "when its excess g >= delta[tier] * mu[tier]", 0.0, 10.0),
        _BUDGET,
    ),
    defaults=_token_pd_tiers_defaults,
    baselines=("token-pd", "fifo", "lru", "h2o", "no-evict"),
    sources=(TOKEN_PD_SRC, TOKEN_PD_TIERS_SRC)))

H2O = register_system(SystemSpec(
    name="h2o", family="eviction",
    doc="H2O (Zhang et al., NeurIPS 2023): per stream, the r most recent tokens plus at "
        "most k heavy hitters (largest accumulated attention); evictions are permanent.",
    params=(
        ParamSpec("k", "integer", "tokens", "heavy hitters kept per stream"),
        ParamSpec("r", "integer", "tokens", "recent window kept per stream (capped "
                  "at the family's window option)"),
    ),
    defaults=lambda max_len, hw=None: {"k": 1024.0, "r": 32.0}, baselines=("no-evict",),
    sources=("Token-PD section 6: H2O with top-k = 1024; the recent window r = 32 is our "
             "choice (the attention model's recency window)",)))

FIFO = register_system(SystemSpec(
    name="fifo", family="eviction",
    doc="FIFO eviction under memory pressure: the oldest tokens (of the oldest stream) "
        "first; recent windows kept.",
    params=(), defaults=lambda max_len, hw=None: {}, baselines=("no-evict",),
    sources=("Token-PD section 6 baseline (a)",)))

LRU = register_system(SystemSpec(
    name="lru", family="eviction",
    doc="LRU eviction under memory pressure: tokens the current query does not use "
        "(below the uniform attention share) first, oldest stream first.",
    params=(), defaults=lambda max_len, hw=None: {}, baselines=("no-evict",),
    sources=("Token-PD section 6 baseline (b)",)))

NO_EVICT = register_system(SystemSpec(
    name="no-evict", family="eviction",
    doc="vLLM-style paged KV without eviction: the latest streams are preempted "
        "(recompute) when memory runs out.",
    params=(), defaults=lambda max_len, hw=None: {}, baselines=("no-evict",),
    sources=("vLLM v0 recompute preemption",)))
