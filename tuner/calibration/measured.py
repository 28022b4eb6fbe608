"""A measured benchmark run as a calibration target: the scenario that replays it, its
measured latencies, and the comparison of a simulated run with them
(``python -m tuner.calibrate`` is the command line).
"""

from __future__ import annotations

import math

import numpy as np

from tuner.calibration import roofline_fit as cal
from tuner.scenario import ScenarioSpec
from tuner.workloads.bench_results import load_bench_result

__all__ = ["SYSTEM", "compare", "spec_for", "measured_target"]

SYSTEM = "paged"  # vLLM's memory manager


def _engine_spec(base: ScenarioSpec, engine: dict, given: set) -> ScenarioSpec:
    """``base`` with the manifest's engine settings where the flags left them unset."""
    over = {}
    if "max_num_batched_tokens" in engine and "max_prefill" not in given:
        over["max_prefill"] = int(engine["max_num_batched_tokens"])
    if "max_num_seqs" in engine and "max_batch" not in given:
        over["max_batch"] = int(engine["max_num_seqs"])
        over["n_slots"] = max(base.n_slots, over["max_batch"])
    if engine.get("enable_chunked_prefill") and "scheduler" not in given:
        over["scheduler"] = "chunked"
    if "tp" in engine and "tp" not in given:
        over["tp"] = int(engine["tp"])
    return base.replace(**over)


def spec_for(path: str, base: ScenarioSpec, given: set):
    """The scenario replaying measured file ``path`` and its measurements."""
    meas = load_bench_result(path)
    spec = _engine_spec(base.replace(trace=str(path)), meas.engine, given)
    if "model" not in given and meas.model_id:
        spec = spec.replace(model=meas.model_id)
    return spec, meas


def measured_target(meas, holdout: float, fit: bool) -> cal.Target:
    n = len(meas.ttft_s)
    fit_mask = np.arange(n) < (n - int(round(holdout * n))) if fit else np.zeros(n, bool)
    return cal.Target(ttft_s=np.asarray(meas.ttft_s), tpot_s=meas.tpot_s,
                      summary=dict(meas.summary), fit_mask=fit_mask)


def _measured_metrics(meas, mask) -> dict:
    out = cal.summarise(meas.ttft_s, meas.tpot_s if meas.tpot_s is not None
                        else np.full(len(meas.ttft_s), np.nan), mask)
    if meas.tpot_s is None:  # only the file's aggregates, over all requests
        for name in ("tpot_p50_s", "tpot_p99_s"):
            out[name] = meas.summary.get(name, float("nan")) if mask.all() else float("nan")
    return out


def compare(sc, meas, values: dict, mask=None) -> dict:
    """``<metric>_measured``, ``_predicted`` and ``_rel_error`` of an exact run with the
    roofline fields ``values`` (over the requests in ``mask``, default all)."""
    ttft, tpot = cal.exact_latencies(sc, cal.apply(sc.hw, values), SYSTEM)
    mask = np.ones(len(ttft), bool) if mask is None else np.asarray(mask, bool)
    pred = cal.summarise(ttft, tpot, mask)
    got = _measured_metrics(meas, mask)
    out = {}
    for k in cal.METRICS:
        m, p = got[k], pred[k]
        out[f"{k}_measured"] = m
        out[f"{k}_predicted"] = p
        out[f"{k}_rel_error"] = (p - m) / m if m and math.isfinite(m) else float("nan")
    return out

