"""Metrics every family reports, computed from the shared accumulators and record.

A family's ``metrics`` returns :func:`core_metrics` plus its own; its ``metrics_spec``
declares :data:`CORE_METRICS` plus its own (units and meaning), which is what objectives
accept.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax.scipy.stats import norm

from models.family import Inputs, Metric
from models.server import hist_quantile

__all__ = ["CORE_METRICS", "SLO_NOISE", "core_metrics", "expected_slo_attainment"]

# The scale of the latency noise behind ``slo_attainment_expected``: each request's TTFT
# and TPOT carry an independent lognormal error of this standard deviation (in log). The
# size of the held-out latency errors the calibration to real vLLM runs leaves
# (experiments/results/calibrate_check: 0.1% to 8.6% on TTFT/TPOT percentiles).
SLO_NOISE = 0.05

CORE_METRICS = {
    "tps": Metric("tokens/s", "output tokens of finished requests per second of makespan"),
    "requests_per_s": Metric("requests/s", "finished requests per second of makespan"),
    "completed": Metric("requests", "requests finished"),
    "unserved": Metric("requests", "valid requests not finished (dropped or not reached)"),
    "dropped": Metric("requests", "requests dropped as unservable"),
    "preemptions": Metric("events", "running requests preempted"),
    "stalls": Metric("slot-iterations", "slot-iterations without progress"),
    "peak_kv_tokens": Metric("tokens", "largest KV tokens held in an iteration"),
    "peak_kv_share": Metric("share of capacity", "peak_kv_tokens / KV capacity",
                            share=True),
    "max_pool_use": Metric("share of a pool", "largest used/size over pools, iterations"),
    "queue_delay_mean_s": Metric("s", "mean admission - arrival of finished requests"),
    "ttft_slo_attainment": Metric("share of requests", "finished within the TTFT SLO",
                                  share=True),
    "tpot_slo_attainment": Metric("share of requests", "finished within the TPOT SLO",
                                  share=True),
    "slo_attainment": Metric("share of requests", "finished within both the TTFT and "
                             "the TPOT SLO (DistServe's and eLLM's SLO attainment)",
                             share=True),
    "slo_attainment_expected": Metric(
        "share of requests", "expected share of requests within both SLOs when each "
        "request's TTFT and TPOT carry an independent lognormal error of scale "
        "SLO_NOISE (0.05): a smooth function of the exact run's latencies; reported by "
        "runs that keep the per-request record (every exact evaluation does); the "
        "client-side overhead of a calibrated profile is not added", share=True),
    "makespan_s": Metric("s", "first arrival to the last iteration's end"),
    "iterations": Metric("iterations", "iterations with work"),
    "kv_occupancy": Metric("share of capacity", "time-weighted mean KV tokens held / "
                           "capacity over the makespan (Vidur's mean KV memory use)",
                           share=True),
    "ttft_p50_s": Metric("s", "median time to first token"),
    "ttft_p90_s": Metric("s", "90th-percentile time to first token"),
    "ttft_p99_s": Metric("s", "99th-percentile time to first token"),
    "tpot_p50_s": Metric("s", "median time per output token"),
    "tpot_p90_s": Metric("s", "90th-percentile time per output token"),
    "tpot_p99_s": Metric("s", "99th-percentile time per output token"),
}


def core_metrics(state, inputs: Inputs) -> dict:
    """The :data:`CORE_METRICS` of a finished (or truncated) run, as float32 scalars
    (differentiable; percentiles from the record when kept, else the histograms)."""
    wl, cfg, acc = inputs.wl, inputs.cfg, state.acc
    n_valid = jnp.sum(wl.valid)
    span = jnp.maximum(state.clock - wl.arrival_s[0], 1e-9)
    done = jnp.maximum(acc.completed, 1e-9)
    # attainment counts every request that is finished, dropped or overdue: a run cut short
    # (fixed horizon) is judged on the requests whose deadline (arrival + TTFT SLO +
    # TPOT SLO per later token) has passed; an unfinished overdue one missed an SLO.
    # Run to completion, the denominator is every valid request.
    deadline = (wl.arrival_s + cfg.ttft_slo_s
                + cfg.tpot_slo_s * jnp.maximum(wl.output_tokens - 1, 0))
    due = jnp.sum(wl.valid & (deadline <= state.clock))
    judged = jax.lax.stop_gradient(jnp.maximum(acc.completed + acc.dropped, due))

    def attained(ok):  # nothing judged yet: no miss seen
        return jnp.where(judged > 0, ok / jnp.maximum(judged, 1.0), 1.0)

    out = {
        "tps": acc.tokens / span,
        "requests_per_s": acc.completed / span,
        "preemptions": acc.preemptions,
        "stalls": acc.stalls,
        "dropped": acc.dropped,
        "unserved": n_valid - acc.completed,
        "completed": acc.completed,
        "peak_kv_tokens": acc.peak_kv,
        "peak_kv_share": acc.peak_kv / cfg.capacity_tokens,
        "max_pool_use": acc.max_use,
        "queue_delay_mean_s": acc.queue_s / done,
        "ttft_slo_attainment": attained(acc.ttft_ok),
        "tpot_slo_attainment": attained(acc.tpot_ok),
        "slo_attainment": attained(acc.slo_ok),
        "makespan_s": span,
        "iterations": acc.iters,
        "kv_occupancy": acc.res_token_s / (span * cfg.capacity_tokens),
    }
    if state.rec is not None:
        p = expected_slo_attainment(state, inputs, SLO_NOISE)
        out["slo_attainment_expected"] = jnp.where(
            judged > 0, jnp.sum(p) / jnp.maximum(judged, 1.0), 1.0)
        rec = state.rec
        fin = rec.finish_iter >= 0
        ttft = jnp.where(fin, rec.first_s - wl.arrival_s, jnp.nan)
        tpot = jnp.where(fin & (wl.output_tokens > 1),
                         (rec.finish_s - rec.first_s) / jnp.maximum(wl.output_tokens - 1, 1),
                         jnp.nan)
        for name, v in (("ttft", ttft), ("tpot", tpot)):
            for q in (50, 90, 99):
                out[f"{name}_p{q}_s"] = jnp.nanpercentile(v, float(q))
    else:
        for name, h in (("ttft", acc.ttft_hist), ("tpot", acc.tpot_hist)):
            for q in (50, 90, 99):
                out[f"{name}_p{q}_s"] = hist_quantile(h, q / 100.0)
    return out


def expected_slo_attainment(state, inputs: Inputs, noise: float = SLO_NOISE):
    """Each request's probability of meeting both SLOs, ``[N]`` (0 for a request not
    finished or not valid), when its TTFT and TPOT (from the run's record) are each
    multiplied by an independent lognormal error ``exp(noise * Z)``:
    ``Phi(log(ttft_slo / ttft) / noise) * Phi(log(tpot_slo / tpot) / noise)``. A
    one-token output has no TPOT and meets that SLO. As ``noise`` falls to 0 each
    factor tends to the SLO's indicator (the count behind ``slo_attainment``)."""
    wl, cfg, rec = inputs.wl, inputs.cfg, state.rec
    fin = wl.valid & (rec.finish_iter >= 0)
    tiny = jnp.float32(1e-12)
    # a request not finished has no (or a NaN) time: a placeholder before the log, so
    # that neither the value nor its gradient reads it (the masked branch of a where
    # still carries its NaN gradient)
    first = jnp.where(fin, rec.first_s, wl.arrival_s + 1.0)
    last = jnp.where(fin, rec.finish_s, first + 1.0)
    ttft = jnp.maximum(first - wl.arrival_s, tiny)
    many = wl.output_tokens > 1
    tpot = jnp.maximum((last - first)
                       / jnp.maximum(wl.output_tokens - 1, 1).astype(jnp.float32), tiny)

    def meet(slo, x):
        return norm.cdf(jnp.log(slo / x) / noise)

    p = meet(cfg.ttft_slo_s, ttft) * jnp.where(many, meet(cfg.tpot_slo_s, tpot), 1.0)
    return jnp.where(fin, p, 0.0)
