"""Where a fit trains and how its result is judged: stratified windows, exact-mode
validation with confidence intervals, and the verdict.

A fit on a slice of ``N`` requests splits it into ``2W`` contiguous windows spread over
the whole slice; it trains on the even ones and validates on the odd ones (disjoint from
training), under held-out seeds (prediction errors, and arrivals where they are drawn),
then evaluates every policy on the whole slice too. Every exact metric is reported as a
mean over the held-out (window, seed) samples with a Student-t 95% interval; the verdict
compares the tuned policy with the default and each baseline on paired differences of
the objective (same window, same seed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from tuner.evaluate import evaluate
from tuner.scenario import ScenarioSpec, build_scenario
from tuner.workloads.presets import resolve_trace

__all__ = ["Windows", "plan_windows", "validate", "interval", "verdict", "MIN_WINDOW",
           "HOLDOUT_SEED"]

MIN_WINDOW = 64       # requests in a window, at least
HOLDOUT_SEED = 1000   # held-out seeds are seed + 1000 + k
LEVEL = 0.95


@dataclass(frozen=True)
class Windows:
    train: tuple      # ScenarioSpecs of the training windows
    holdout: tuple    # ScenarioSpecs of the held-out windows (disjoint from training)
    whole: ScenarioSpec
    share: float      # share of the slice's requests in training windows
    note: str

    def replace_specs(self, **kw) -> "Windows":
        """Every window (and the whole slice) with the scenario fields ``kw`` set."""
        return Windows(train=tuple(s.replace(**kw) for s in self.train),
                       holdout=tuple(s.replace(**kw) for s in self.holdout),
                       whole=self.whole.replace(**kw), share=self.share, note=self.note)


def trace_length(spec: ScenarioSpec) -> int:
    return len(resolve_trace(spec.trace, seed=spec.seed).output_tokens)


def plan_windows(base: ScenarioSpec, windows: int, window_requests: int | None = None,
                 n_total: int | None = None) -> Windows:
    """``windows`` training and as many held-out windows over the slice ``base``
    (``base.n_requests`` None: to the end of the trace); each window has
    ``window_requests`` requests (default, and at most, ``N // (2 * windows)``)."""
    if windows < 1:
        raise ValueError(f"--windows must be >= 1, got {windows}")
    total = trace_length(base) if n_total is None else n_total
    n = total - base.offset if base.n_requests is None else base.n_requests
    if base.offset < 0 or n < 1 or base.offset + n > total:
        raise ValueError(f"trace {base.trace}: slice [{base.offset}, {base.offset + n}) is "
                         f"outside its {total} requests")
    k = 2 * windows
    length = n // k if window_requests is None else min(int(window_requests), n // k)
    if window_requests is not None and window_requests < MIN_WINDOW:
        raise ValueError(f"--window-requests must be >= {MIN_WINDOW}, got {window_requests}")
    if length < MIN_WINDOW:
        raise ValueError(f"trace {base.trace}: {n} requests are too few for {windows} "
                         f"training + {windows} held-out windows of >= {MIN_WINDOW} "
                         "requests; give fewer --windows or a longer slice")
    starts = [base.offset + (j * n) // k for j in range(k)]
    specs = [base.replace(offset=s, n_requests=length) for s in starts]
    share = windows * length / n
    note = (f"{windows} training window(s) of {length} requests ({share:.0%} of the "
            f"{n} requests, spread over all of them); held out: the {windows} window(s) "
            "between them")
    return Windows(train=tuple(specs[0::2]), holdout=tuple(specs[1::2]),
                   whole=base.replace(n_requests=n), share=share, note=note)


def interval(xs, level: float = LEVEL) -> list:
    """Student-t interval of the mean of ``xs`` ([nan, nan] below two samples)."""
    x = np.asarray(xs, np.float64)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return [math.nan, math.nan]
    m, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))
    h = float(stats.t.ppf(0.5 + level / 2, x.size - 1)) * se
    return [m - h, m + h]


def _summary(ms: list[dict]) -> dict:
    keys = [k for k, v in ms[0].items() if isinstance(v, (int, float))]
    from tuner.objectives import is_share

    out = {k: float(np.mean([m[k] for m in ms])) for k in keys}
    out["ci"] = {k: interval([m[k] for m in ms]) for k in keys}
    for k in keys:  # a share's interval stays within [0, 1]
        if is_share(k) and all(np.isfinite(out["ci"][k])):
            out["ci"][k] = [max(out["ci"][k][0], 0.0), min(out["ci"][k][1], 1.0)]
    out["samples"] = len(ms)
    return out


def validate(system: str, policies: dict, objective: str, win: Windows, seeds: int,
             log=lambda s: None) -> dict:
    """Exact evaluation of ``policies`` ({name: (system, params)}) on the held-out
    windows x ``seeds`` held-out seeds, and on the whole slice per seed. Returns, per
    name, the mean of every metric with its interval (``ci``), the per-sample objective
    (``objective_per_sample``) and the whole-slice means (``whole_trace``)."""
    if seeds < 1:
        raise ValueError(f"--holdout-seeds must be >= 1, got {seeds}")
    runs = {name: [] for name in policies}
    whole = {name: [] for name in policies}
    jobs = [(w, k) for w in win.holdout for k in range(seeds)]
    wholes = [build_scenario(win.whole.replace(seed=win.whole.seed + HOLDOUT_SEED + k))
              for k in range(seeds)]
    n = max(sc.workload.size for sc in wholes)
    for i, (w, k) in enumerate(jobs + [(win.whole, k) for k in range(seeds)]):
        # windows padded to the whole slice: one compiled program per system
        sc = (wholes[k] if w is win.whole
              else build_scenario(w.replace(seed=w.seed + HOLDOUT_SEED + k)).padded(n))
        where = "whole slice" if w is win.whole else f"window at request {w.offset}"
        log(f"validating ({i + 1}/{len(jobs) + seeds}): {where}, held-out seed {k}")
        for name, (sys_name, params) in policies.items():
            m = evaluate(sc, sys_name, params, objective=objective)
            (whole if w is win.whole else runs)[name].append(m)
    out = {}
    for name, (sys_name, _) in policies.items():
        s = _summary(runs[name])
        s["system"] = sys_name
        s["objective_per_sample"] = [m["objective"] for m in runs[name]]
        s["whole_trace"] = _summary(whole[name])
        s["whole_trace"]["objective_per_seed"] = [m["objective"] for m in whole[name]]
        out[name] = s
    return out


def _compare(tuned: list, other: list) -> dict:
    d = np.asarray(tuned, np.float64) - np.asarray(other, np.float64)
    base = float(np.mean(other))
    lo, hi = interval(d)
    if not np.isfinite(lo):  # one sample: no interval, the sign decides
        lo = hi = float(d.mean())
    rel = float(d.mean()) / abs(base) if base else math.inf
    status = "better" if lo > 0 else "worse" if hi < 0 else "indistinguishable"
    return {"diff": float(d.mean()), "ci": [lo, hi], "relative": rel, "status": status}


SLO_METRICS = ("slo_attainment", "ttft_p99_s", "tpot_p99_s")


def verdict(mets: dict, objective: str, baselines: tuple[str, ...]) -> dict:
    """Tuned against the default and each baseline, on paired held-out samples.

    ``loss``: the default or a baseline is better with the interval of the paired
    difference below zero (the policy is not exported); ``win``: the tuned policy is
    better than every baseline and not worse than the default; ``tie`` otherwise."""
    from tuner.objectives import parse_objective

    objective = parse_objective(objective).spec
    t = mets["tuned"]
    rows = {}
    for name in ("default", *baselines):
        rows[name] = _compare(t["objective_per_sample"], mets[name]["objective_per_sample"])
        for m in SLO_METRICS:
            if m in t and m in mets[name]:
                rows[name][m] = [t[m], mets[name][m]]
    worse = [n for n, r in rows.items() if r["status"] == "worse"]
    best = max(baselines, key=lambda b: mets[b]["objective"]) if baselines else "default"
    b = rows[best]
    pct = f"{b['relative']:+.1%}"
    span = f"paired 95% interval of tuned - {best}: [{b['ci'][0]:.4g}, {b['ci'][1]:.4g}]"
    if worse:
        w = max(worse, key=lambda n: mets[n]["objective"])
        what = ("the system's default parameters serve" if w == "default"
                else "static allocation serves" if w == "static"
                else f"the {w} baseline serves")
        r = rows[w]
        sentence = (f"{what} this workload better: {objective} {mets[w]['objective']:.4g} "
                    f"vs tuned {t['objective']:.4g} on held-out data ({r['relative']:+.1%}, "
                    f"paired 95% interval [{r['ci'][0]:.4g}, {r['ci'][1]:.4g}]); "
                    "no policy exported (--export-anyway writes it)")
        outcome = "loss"
    elif all(r["status"] == "better" for n, r in rows.items() if n != "default"):
        sentence = (f"the tuned policy beats every baseline on held-out data: {pct} over "
                    f"{best} ({span}) and {rows['default']['relative']:+.1%} over the "
                    "default")
        outcome = "win"
    else:
        d = rows["default"]
        vs_default = (f"on this workload the memory policy does not decide {objective}"
                      if d["status"] == "indistinguishable" else
                      f"{d['relative']:+.1%} over the default (paired 95% interval "
                      f"[{d['ci'][0]:.4g}, {d['ci'][1]:.4g}])")
        sentence = (f"the tuned policy and {best} are indistinguishable on held-out data "
                    f"({pct}; {span}); {vs_default}; the tuned policy is exported, "
                    f"{best} serves as well")
        outcome = "tie"
    return {"outcome": outcome, "sentence": sentence, "best_baseline": best,
            "comparisons": rows}
