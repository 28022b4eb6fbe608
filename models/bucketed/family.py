"""The bucketed family as a plug-in (``models.family``): options, inputs, initial state,
the step, ODMA's window sink and refresh, the run-until-done test, its metrics and the
derived deployment values (bucket bounds, pool sizes, reservation rules)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from models.bucketed import engine, memory, window
from models.bucketed.admission import start_queue
from models.bucketed.policies import get_policy
from models.bucketed.state import (BucketAcc, BucketOptions, BucketRecord, BucketSlots,
                                   SimState)
from models.bucketed.step import step as _step
from models.family import Inputs, Metric, SimOptions
from models.outcomes import CORE_METRICS, core_metrics
from models.server import init_acc, init_record, slot_fields

__all__ = ["BUCKETED"]

# the engine arguments' server config outside a run (``deployment``): one compiled
# program where its eager operations would compile one each
_engine_cfg = jax.jit(engine.engine_cfg)


class _Bucketed:
    name = "bucketed"
    reads_priority = True  # Workload.priority orders admission (models.bucketed.admission)
    metrics_spec = {
        **CORE_METRICS,
        "kv_utilization": Metric("share", "actual KV (prompt + output) / largest reserved, "
                                 "over finished requests", share=True),
        "migrations": Metric("events", "mid-decode migrations to a larger reservation"),
        "overflows": Metric("requests", "(soft) admissions whose output outgrows their "
                            "bucket"),
        "migration_rate": Metric("share of finished requests", "overflows / completed: "
                                 "the papers' migration rate", share=True),
        "accuracy": Metric("share of finished requests", "output fits the reservation at "
                           "first admission", share=True),
        "reserved_token_s": Metric("token-seconds", "KV tokens held x seconds, summed over "
                                   "iterations"),
        "token_s_utilization": Metric("share", "computed context token-seconds / reserved "
                                      "token-seconds: utilisation over time, not only at "
                                      "a request's fullest", share=True),
    }

    def options(self, system, **settings):
        get_policy(system)
        unknown = set(settings) - {"window", "refresh_every", "large_borrow"}
        if unknown:
            raise ValueError(f"{system}: unknown option(s) {sorted(unknown)}; the bucketed "
                             "family takes window, refresh_every, large_borrow")
        if "large_borrow" in settings:
            settings["large_borrow"] = bool(settings["large_borrow"])
        return BucketOptions(**settings)

    def extra(self, wl, cfg, opts: SimOptions, history=None, deployment=None):
        """ODMA: the window prior (``window`` lengths); an engine system: its memory
        profile's constants (``models.bucketed.engine``); None for the others."""
        if get_policy(opts.system).engine:
            if deployment is None:
                raise ValueError(f"{opts.system}: its KV capacity comes from vLLM's memory "
                                 "profile and needs the deployment (make_inputs(..., "
                                 "deployment=...))")
            if not cfg.chunked:
                raise ValueError(f"{opts.system}: vLLM V1 schedules with chunked prefill; "
                                 "build the scenario with scheduler 'chunked'")
            return engine.engine_inputs(deployment)
        if not get_policy(opts.system).adaptive_bounds:
            return None
        return jnp.asarray(window.prior(wl, opts.family.window, cfg.max_len, history))

    def init(self, inputs: Inputs, params, t, opts: SimOptions) -> SimState:
        wl, cfg, pol = inputs.wl, inputs.cfg, get_policy(opts.system)
        ring = _prior_ring(inputs, opts) if pol.adaptive_bounds else inputs.extra
        n_bounds = int(np.shape(params.get("levels", params.get("bounds", [0.0])))[0])
        win = window.init_window(ring, params, t, cfg, pol.adaptive_bounds, n_bounds)
        rec = init_record(wl.size, BucketRecord) if opts.record else None
        own = engine.engine_cfg(cfg, params, inputs.extra) if pol.engine else None
        q = start_queue(wl, cfg)
        return SimState(slots=BucketSlots(**slot_fields(cfg.n_slots, BucketSlots)),
                        head=q.head, clock=jnp.float32(0.0), it=jnp.int32(0),
                        win=win, acc=init_acc(BucketAcc), rec=rec, cfg=own, taken=q.taken)

    def step(self, state, inputs: Inputs, params, *, hw, t, opts: SimOptions):
        cfg = inputs.cfg if state.cfg is None else state.cfg
        return _step(state, inputs.wl, cfg, hw, params, t, _policy(opts),
                     log=opts.work_log)

    def sink(self, opts: SimOptions):
        return window.ring_sink if get_policy(opts.system).adaptive_bounds else None

    def end_block(self, state, inputs: Inputs, params, *, t, opts: SimOptions):
        if not get_policy(opts.system).adaptive_bounds:
            return state
        return state.replace(win=window.refresh(state.win, params, t,
                                                opts.family.refresh_every))

    def done(self, state, inputs: Inputs):
        n_valid = jnp.sum(inputs.wl.valid)
        return (state.head >= n_valid) & ~jnp.any(state.slots.status > 0)

    def memory_limit(self, inputs: Inputs, params, opts: SimOptions):
        """Tokens the KV may never exceed: the capacity (an engine system's own)."""
        if _policy(opts).engine:
            return engine.engine_cfg(inputs.cfg, params, inputs.extra).capacity_tokens
        return inputs.cfg.capacity_tokens

    def metrics(self, state, inputs: Inputs) -> dict:
        if state.cfg is not None:  # an engine system: its own capacity and limits
            inputs = dataclasses.replace(inputs, cfg=state.cfg)
        acc = state.acc
        done = jnp.maximum(acc.completed, 1e-9)
        return {
            "kv_utilization": acc.actual_kv / jnp.maximum(acc.reserved_kv, 1e-9),
            **core_metrics(state, inputs),
            "migrations": acc.migrations,
            "overflows": acc.overflows,
            # share of requests whose realised length outgrows the bucket they were
            # given (each must migrate or be preempted): the papers' "migration rate".
            # Smooth in relaxed mode (a soft indicator per admission), exact at T = 0.
            "migration_rate": acc.overflows / done,
            "accuracy": acc.fit / done,
            "reserved_token_s": acc.res_token_s,
            "token_s_utilization": acc.used_token_s / jnp.maximum(acc.res_token_s, 1e-9),
        }

    def deployment(self, inputs: Inputs, params, opts: SimOptions) -> dict:
        """What a real server of ``opts.system`` is configured with, at the start of a
        run (exact mode), in tokens and bytes per device (plain JSON values):

        ``max_len_tokens``, ``kv_bytes_per_token_per_device``; ``bucket_bounds_tokens``
        (adaptive systems: the window prior's quantiles at ``levels``; else the
        ``bounds`` parameter; paged: ``[block_size]``; otherwise ``[max_len]``);
        ``bucket_levels`` and ``window`` (adaptive systems); ``pools`` (``normal`` and,
        with a large pool, ``large``: ``tokens``, ``bytes_per_device``); ``reservation``:
        the admission/overflow/resume rules as formulas over ``prompt``, ``generated``,
        ``L_hat`` (the predicted output tokens), ``u`` (its uncertainty in [0, 1]) and
        the values above, with the numeric parameters they use.
        """
        cfg, pol = inputs.cfg, _policy(opts)
        if pol.engine:
            cfg = _engine_cfg(cfg, params, inputs.extra)
        max_len = int(cfg.max_len)
        kv_bytes = float(cfg.kv_bytes_per_token)
        out = {"max_len_tokens": max_len, "kv_bytes_per_token_per_device": _real(kv_bytes)}
        if pol.adaptive_bounds:
            win = window.init_window(_prior_ring(inputs, opts), params, jnp.float32(0.0),
                                     cfg, True, 0)
            out["bucket_bounds_tokens"] = _tokens(win.bounds)
            out["bucket_levels"] = _real(params["levels"])
            out["window"] = {"size": int(opts.family.window),
                             "refresh_every": int(opts.family.refresh_every)}
        elif "bounds" in params:
            out["bucket_bounds_tokens"] = _tokens(params["bounds"])
        elif "block_size" in params:
            out["bucket_bounds_tokens"] = [_tokens(params["block_size"])]
        else:
            out["bucket_bounds_tokens"] = [max_len]
        normal, large = memory.pool_sizes(cfg, params, pol)
        out["pools"] = {"normal": _pool(normal, kv_bytes)}
        if pol.large_pool:
            out["pools"]["large"] = {**_pool(large, kv_bytes),
                                     "share_of_capacity": _real(params["large_share"])}
        out["reservation"] = _rules(pol, params)
        if pol.engine:  # what the engine arguments set (0 tokens: vLLM would not start)
            out["engine"] = {"kv_capacity_tokens": _tokens(cfg.capacity_tokens),
                             "max_num_seqs": _tokens(cfg.max_batch),
                             "running_at_most": min(_tokens(cfg.max_batch), cfg.n_slots),
                             "max_num_batched_tokens": _tokens(cfg.max_prefill),
                             # None: the threshold is at or above the budget (never
                             # binds: vLLM's default 0)
                             "long_prefill_token_threshold": (
                                 None if cfg.prefill_cap is None
                                 or float(cfg.prefill_cap) >= float(cfg.max_prefill)
                                 else _tokens(cfg.prefill_cap)),
                             "starts": bool(float(cfg.capacity_tokens) > 0)}
        return out


def _policy(opts: SimOptions):
    """The system's policy with the family options that select among its rules."""
    pol = get_policy(opts.system)
    return dataclasses.replace(pol, borrow=pol.large_pool and opts.family.large_borrow)


def _prior_ring(inputs: Inputs, opts: SimOptions):
    """An adaptive system's window at the start: the family inputs' prior, else the
    prior from the workload's predictions."""
    ring = inputs.extra
    if ring is None:
        ring = window.prior(inputs.wl, opts.family.window, inputs.cfg.max_len)
    if jnp.shape(ring) != (opts.family.window,):
        raise ValueError(f"{opts.system}: window prior must have shape "
                         f"({opts.family.window},), got {jnp.shape(ring)}")
    return ring


def _tokens(x):
    """Token counts (scalar or array) as ints where integral, else floats."""
    v = np.asarray(x, np.float64)
    if v.ndim:
        return [_tokens(e) for e in v]
    f = float(v)
    return int(f) if f.is_integer() else float(f"{f:.8g}")


def _real(x):
    """Float32 values as plain floats without float32 noise (7 significant digits)."""
    v = np.asarray(x, np.float64)
    if v.ndim:
        return [_real(e) for e in v]
    return float(f"{float(v):.7g}")


def _pool(tokens, kv_bytes: float) -> dict:
    n = _tokens(tokens)
    return {"tokens": n, "bytes_per_device": _tokens(n * kv_bytes)}


# Operational meaning of each rule (formulas, no prose): the admission rule by the
# policy's ``reserve`` function, the overflow rule by its ``on_overflow``, resume by
# ``need_resume``. ``reservation_tokens`` are output tokens; a slot holds
# ``prompt + reservation_tokens`` KV tokens.
_BUCKET = "min{b in bucket_bounds_tokens : b >= ceil(estimate_tokens)}, else max_len"
_RESERVE = {
    memory.reserve_max_len: {"reservation_tokens": "max_len"},
    memory.reserve_block: {
        "reservation_tokens": "ceil((prompt + 1) / block_size) * block_size - prompt"},
    memory.reserve_bucket: {"estimate_tokens": "L_hat", "reservation_tokens": _BUCKET},
    memory.reserve_routed: {
        "estimate_tokens": "L_hat * (1 + gamma * u)", "reservation_tokens": _BUCKET,
        "large_pool_if": "u > tau or ceil(estimate_tokens) > max(bucket_bounds_tokens)",
        "large_pool_reservation_tokens": "max_len"},
    memory.reserve_routed_per_bucket: {
        "estimate_tokens": "L_hat * (1 + gamma[k] * u), k = index of min{b in "
                           "bucket_bounds_tokens : b >= L_hat} (else the last)",
        "reservation_tokens": _BUCKET,
        "large_pool_if": "u > tau or ceil(estimate_tokens) > max(bucket_bounds_tokens)",
        "large_pool_reservation_tokens": "max_len"},
}
_OVERFLOW = {
    memory.grow_block: {"on_overflow": "grow by block_size tokens; pool full: preempt "
                                       "the most recently admitted running request "
                                       "(recompute) until the block fits (vLLM)"},
    memory.migrate: {"on_overflow": "migrate to prompt + max_len (copy the context); "
                                    "pool full: preempt"},
}
_RESUME = {
    memory.resume_block: "ceil((prompt + generated + 1) / block_size) * block_size",
    memory.resume_max_len: "prompt + max_len",
}


def _rules(pol, params) -> dict:
    rules = {"kv_held_tokens": "prompt + reservation_tokens",
             **_RESERVE.get(pol.reserve, {})}
    if pol.on_overflow is not None:
        rules.update(_OVERFLOW.get(pol.on_overflow, {}))
        if pol.on_overflow is memory.migrate and pol.large_pool:
            rules["on_overflow"] = ("migrate to prompt + max_len in the large pool (copy "
                                    "the context); large pool full: stall while another "
                                    "request holds large-pool memory, else preempt")
    if pol.borrow:
        rules["large_pool_borrows"] = ("large-pool reservations may use free normal-pool "
                                       "tokens; normal admissions see normal free minus "
                                       "the large pool's overspill")
    else:
        rules["on_overflow"] = None
    if pol.preempts and pol.need_resume in _RESUME:
        rules["resume_kv_tokens"] = _RESUME[pol.need_resume]
    if pol.adaptive_bounds:
        rules["bucket_bounds_refresh"] = ("min{x : share of window <= x >= level} for "
                                          "each level in bucket_levels, every "
                                          "refresh_every completions")
    for name in ("gamma", "tau"):
        if name in params:
            rules[name] = _real(params[name])
    if "block_size" in params:
        rules["block_size"] = _tokens(params["block_size"])
    if "gamma" in params:  # u is in [0, 1]: the largest inflation of a prediction
        rules["max_inflation"] = _real(1.0 + np.asarray(params["gamma"], np.float64))
    return rules


BUCKETED = _Bucketed()
