"""The bucketed family as a plug-in (``models.family``): options, inputs, initial state,
the step, ODMA's window sink and refresh, the run-until-done test and its metrics."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from models.bucketed import window
from models.bucketed.policies import get_policy
from models.bucketed.state import (BucketAcc, BucketOptions, BucketRecord, BucketSlots,
                                   SimState)
from models.bucketed.step import step as _step
from models.family import Inputs, Metric, SimOptions
from models.outcomes import CORE_METRICS, core_metrics
from models.server import init_acc, init_record, slot_fields

__all__ = ["BUCKETED"]


class _Bucketed:
    name = "bucketed"
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
    }

    def options(self, system, **settings):
        get_policy(system)
        unknown = set(settings) - {"window", "refresh_every"}
        if unknown:
            raise ValueError(f"{system}: unknown option(s) {sorted(unknown)}; the bucketed "
                             "family takes window, refresh_every")
        return BucketOptions(**settings)

    def extra(self, wl, cfg, opts: SimOptions, history=None):
        """ODMA: the window prior (``window`` lengths); None for fixed-bound systems."""
        if not get_policy(opts.system).adaptive_bounds:
            return None
        return jnp.asarray(window.prior(wl, opts.family.window, cfg.max_len, history))

    def init(self, inputs: Inputs, params, t, opts: SimOptions) -> SimState:
        wl, cfg, pol = inputs.wl, inputs.cfg, get_policy(opts.system)
        ring = inputs.extra
        if pol.adaptive_bounds:
            if ring is None:
                ring = window.prior(wl, opts.family.window, cfg.max_len)
            if jnp.shape(ring) != (opts.family.window,):
                raise ValueError(f"{opts.system}: window prior must have shape "
                                 f"({opts.family.window},), got {jnp.shape(ring)}")
        n_bounds = int(np.shape(params.get("levels", params.get("bounds", [0.0])))[0])
        win = window.init_window(ring, params, t, cfg, pol.adaptive_bounds, n_bounds)
        rec = init_record(wl.size, BucketRecord) if opts.record else None
        return SimState(slots=BucketSlots(**slot_fields(cfg.n_slots, BucketSlots)),
                        head=jnp.int32(0), clock=jnp.float32(0.0), it=jnp.int32(0),
                        win=win, acc=init_acc(BucketAcc), rec=rec)

    def step(self, state, inputs: Inputs, params, *, hw, t, opts: SimOptions):
        return _step(state, inputs.wl, inputs.cfg, hw, params, t, get_policy(opts.system))

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

    def metrics(self, state, inputs: Inputs) -> dict:
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
        }


BUCKETED = _Bucketed()
