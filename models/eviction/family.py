"""The priced-eviction family as a plug-in (``models.family``): options, the attention
model and the prompts' token classes as family inputs, the initial state, the step,
metrics and the derived deployment values."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from models.eviction.attention import attention_tables, token_groups_np
from models.eviction.state import (EvictAcc, EvictInputs, EvictOptions, EvictPolicy,
                                   EvictRecord, EvictSlots, EvictState, N_GROUPS)
from models.eviction.step import budget_tokens, step as _step
from models.family import HeadQueueFamily, Inputs, Metric, SimOptions
from models.outcomes import CORE_METRICS, core_metrics
from models.server import hist_quantile, init_acc, init_record

__all__ = ["EVICTION", "POLICIES", "prompt_tables"]

POLICIES = {"no-evict": EvictPolicy("none"), "fifo": EvictPolicy("fifo"),
            "lru": EvictPolicy("lru"), "h2o": EvictPolicy("h2o"),
            "token-pd": EvictPolicy("pd"), "token-pd-tiers": EvictPolicy("pd", tiered=True)}
GIB = 2.0 ** 30
_OPTIONS = ("window", "recency", "retained", "predictor_sigma", "price_grad",
            "tier_bounds")


def _policy(system: str) -> EvictPolicy:
    if system not in POLICIES:
        raise ValueError(f"no eviction policy for system {system!r}; known: "
                         f"{', '.join(sorted(POLICIES))}")
    return POLICIES[system]


def prompt_tables(prompt, cum_p, cum_conf, window: int):
    """Each request's prompt positions as old-group counts ``[N, G]`` (positions older
    than the last ``window``) and ring groups ``[N, W]`` (entry ``p mod W``, -1 empty)."""
    prompt = np.asarray(prompt, np.int64)
    n = prompt.shape[0]
    req = np.repeat(np.arange(n), prompt)
    start = np.repeat(np.cumsum(prompt) - prompt, prompt)
    pos = np.arange(req.shape[0]) - start
    gid = token_groups_np(req, pos, cum_p, cum_conf)
    old = pos < prompt[req] - window
    counts = np.bincount(req[old] * N_GROUPS + gid[old], minlength=n * N_GROUPS)
    ring = np.full((n, window), -1, np.int32)
    ring[req[~old], pos[~old] % window] = gid[~old]
    return counts.reshape(n, N_GROUPS).astype(np.float32), ring


def _int_tuple(name, v):
    """A sequence of integral numbers as a tuple of ints (hashable, static)."""
    vals = np.atleast_1d(np.asarray(v, np.float64))
    if vals.ndim != 1 or not np.all(np.isfinite(vals)) or np.any(vals != np.round(vals)):
        raise ValueError(f"eviction options: {name} must be a sequence of integers, got "
                         f"{v!r}")
    return tuple(int(x) for x in vals)


class _Eviction(HeadQueueFamily):
    name = "eviction"
    metrics_spec = {
        **CORE_METRICS,
        "attention_lost": Metric("share of attention", "share of the decode queries' "
                                 "attention (the model's realised shares) that fell on "
                                 "evicted tokens", share=True),
        "evicted_tokens": Metric("tokens", "tokens evicted"),
        "recompute_tokens": Metric("tokens", "evicted tokens recomputed (Token-PD "
                                   "restores)"),
        "recompute_s": Metric("s", "iteration time spent recomputing restored tokens"),
        "regret": Metric("attention share", "sum over decode iterations of the "
                         "clairvoyant's retained attention (budget M) minus the policy's"),
        "regret_per_query": Metric("share of attention", "regret / decode queries"),
        "violation": Metric("token-iterations", "sum of [kept - M]+ over iterations"),
        "violation_bracket": Metric("token-iterations", "[sum (kept - M)]+ (the paper's "
                                    "cumulative violation)"),
        "demand_violation_bracket": Metric(
            "token-iterations", "[sum (D - M)]+ with D the tokens Token-PD's price rule "
            "keeps or restores before the hard budget caps them (the quantity of the "
            "paper's O(sqrt T) bound; D = kept for the baselines)"),
        "peak_kv_budget_share": Metric("share of the budget", "peak_kv_tokens / M "
                                       "(Token-PD: <= 1, its hard budget)"),
        "peak_kv_gib": Metric("GiB", "largest KV held (kept tokens after the appends)"),
        "mean_kv_gib": Metric("GiB", "time-weighted mean KV held"),
        "e2e_p95_s": Metric("s", "95th-percentile end-to-end latency"),
        "e2e_p50_s": Metric("s", "median end-to-end latency"),
        "price": Metric("attention share per token", "Token-PD's price at the end "
                        "(token-pd-tiers: the mean of its tiers' prices)"),
    }

    def options(self, system, **settings):
        _policy(system)
        unknown = set(settings) - set(_OPTIONS)
        if unknown:
            raise ValueError(f"{system}: unknown option(s) {sorted(unknown)}; the eviction "
                             f"family takes {', '.join(_OPTIONS)}")
        conv = {k: (str(v) if k == "price_grad" else int(v) if k == "window"
                    else _int_tuple(k, v) if k == "tier_bounds" else float(v))
                for k, v in settings.items()}
        return EvictOptions(**conv)

    def extra(self, wl, cfg, opts: SimOptions, history=None, deployment=None):
        fo = opts.family
        tab = attention_tables(fo.recency, fo.retained, fo.predictor_sigma)
        prompt = np.asarray(wl.prompt_tokens)
        if np.any(prompt < 0):
            raise ValueError(f"{opts.system}: negative prompt length in the workload")
        old0, ring0 = prompt_tables(np.maximum(prompt, 0), tab.cum_p, tab.cum_conf,
                                    int(fo.window))
        return EvictInputs(h=jnp.asarray(tab.h), m=jnp.asarray(tab.m),
                           v=jnp.asarray(tab.v), cum_p=jnp.asarray(tab.cum_p),
                           cum_conf=jnp.asarray(tab.cum_conf), old0=jnp.asarray(old0),
                           ring0=jnp.asarray(ring0), recency=jnp.float32(fo.recency))

    def init(self, inputs: Inputs, params, t, opts: SimOptions) -> EvictState:
        wl, cfg = inputs.wl, inputs.cfg
        s, w = cfg.n_slots, int(opts.family.window)
        zi, zf = jnp.zeros(s, jnp.int32), jnp.zeros(s, jnp.float32)
        slots = EvictSlots(req=zi - 1, status=zi, prompt=zi, output=zi, gen=zi, order=zi,
                           weight=zf, arrival=zf, t_admit=zf, t_first=zf,
                           old_n=jnp.zeros((s, N_GROUPS), jnp.float32),
                           old_x=jnp.zeros((s, N_GROUPS), jnp.float32),
                           ring_g=jnp.full((s, w), -1, jnp.int32),
                           ring_x=jnp.zeros((s, w), jnp.float32))
        mu = params["mu_0"] if "mu_0" in params else 0.0
        rec = init_record(wl.size, EvictRecord) if opts.record else None
        return EvictState(slots=slots, head=jnp.int32(0), clock=jnp.float32(0.0),
                          it=jnp.int32(0), counter=jnp.int32(0),
                          mu=jnp.asarray(mu, jnp.float32), acc=init_acc(EvictAcc), rec=rec)

    def step(self, state, inputs: Inputs, params, *, hw, t, opts: SimOptions):
        return _step(state, inputs, hw, params, t, _policy(opts.system), opts.family,
                     log=opts.work_log)

    def metrics(self, state, inputs: Inputs) -> dict:
        acc, cfg = state.acc, inputs.cfg
        gib = cfg.kv_bytes_per_token / GIB
        span = jnp.maximum(state.clock - inputs.wl.arrival_s[0], 1e-9)
        q = jnp.maximum(acc.queries, 1.0)
        return {
            **core_metrics(state, inputs),
            "attention_lost": acc.lost / q,
            "evicted_tokens": acc.evicted,
            "recompute_tokens": acc.restored,
            "recompute_s": acc.recompute_s,
            "regret": acc.oracle - acc.utility,
            "regret_per_query": (acc.oracle - acc.utility) / q,
            "violation": acc.viol_pos,
            "violation_bracket": jnp.maximum(acc.viol_signed, 0.0),
            "demand_violation_bracket": jnp.maximum(acc.demand_signed, 0.0),
            "peak_kv_budget_share": acc.peak_budget_use,
            "peak_kv_gib": acc.peak_kv * gib,
            "mean_kv_gib": acc.kept_token_s / span * gib,
            "e2e_p95_s": hist_quantile(acc.e2e_hist, 0.95),
            "e2e_p50_s": hist_quantile(acc.e2e_hist, 0.50),
            "price": jnp.mean(state.mu),
        }

    def deployment(self, inputs: Inputs, params, opts: SimOptions) -> dict:
        """The budget, the attention model and the policy settings an engineer sets."""
        cfg, fo = inputs.cfg, opts.family
        kvb = float(cfg.kv_bytes_per_token)
        out = {"kv_capacity_tokens": int(cfg.capacity_tokens),
               "kv_bytes_per_token_per_device": kvb,
               "attention_model": {"window": int(fo.window), "recency": fo.recency,
                                   "retained": fo.retained,
                                   "predictor_sigma": fo.predictor_sigma}}
        pol = _policy(opts.system)
        if pol.kind == "pd":
            m = float(budget_tokens(params, cfg))
            out.update(budget_tokens=int(m), budget_gib=float(f"{m * kvb / GIB:.6g}"),
                       **{k: np.asarray(params[k], np.float64).tolist()
                          for k in ("eta", "lam", "mu_0", "delta")})
            if pol.tiered:
                out.update(tier_bounds=list(fo.tier_bounds))
        elif pol.kind == "h2o":
            out.update(heavy_tokens=int(params["k"]), recent_tokens=int(params["r"]))
        return out


EVICTION = _Eviction()
