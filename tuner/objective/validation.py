"""Where a fit trains and how its result is judged: stratified windows, exact-mode
validation with confidence intervals, and the verdict.

A fit on a slice of ``N`` requests splits it into ``2W`` contiguous windows spread over
the whole slice; it trains on the even ones and validates on the odd ones (disjoint from
training), under held-out seeds (prediction errors, and arrivals where they are drawn),
and, when asked, evaluates every policy on the whole slice too (in-sample: it holds the
training windows; ``tuner.fit --whole-slice``). Every exact metric is reported as a
mean over the held-out (window, seed) samples with a Student-t 95% interval; the verdict
compares the tuned policy with the default and each baseline on paired differences of
the objective (same window, same seed).

Seeds that cannot change a workload (a trace's own arrival times with predictions that
do not depend on the seed, or a simulator that reads no predictions) give the same
sample twice; it is counted once. Two (window, seed) samples are one when the simulator
inputs are equal (:func:`sample_key`: every workload array and the server config), or
when every policy's every metric is equal on both (a simulator that ignores what
differs). Intervals, means and the verdict use the independent samples only; with fewer
than two of them, or paired differences that are all equal, the verdict is
``undetermined``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtrit

from tuner.objective.evaluate import evaluate_many
from tuner.scenario import ScenarioSpec, build_scenario
from tuner.workloads.presets import resolve_trace

__all__ = ["Windows", "plan_windows", "validate", "interval", "compare_paired", "verdict",
           "MIN_WINDOW", "HOLDOUT_SEED", "OUTCOMES", "sample_key", "fit_slots",
           "held_out_windows", "resolution", "validation_jobs", "validation_samples"]

MIN_WINDOW = 64       # requests in a window, at least
HOLDOUT_SEED = 1000   # held-out seeds are seed + 1000 + k
LEVEL = 0.95
# verdict outcomes; tuner.fit exports the policy on win and tie only (undetermined: exit
# 4, loss: exit 3, unless --export-anyway)
OUTCOMES = ("win", "tie", "loss", "undetermined")


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


def fit_slots(scs: list) -> list:
    """``scs`` with the slot table cut to the most requests any of them holds, rounded
    up to 16, where that is smaller than the table: a run never holds more requests than
    its workload has, so every run is the same (bit for bit in exact mode) while each
    iteration touches fewer slots. A deployment's table is sized for its whole trace
    (512 slots for the default's 1,000 requests); a training window of 250 requests
    needs 256 (held-out windows: :func:`validate`). The configured ``max_batch`` may then exceed the table: it binds as the
    table does, never (a window's requests all fit)."""
    held = max(int(np.sum(np.asarray(sc.workload.valid))) for sc in scs)
    k = max(16, -(-held // 16) * 16)
    if all(k >= sc.cfg.n_slots for sc in scs):
        return scs
    return [dataclasses.replace(sc, cfg=sc.cfg.replace(n_slots=min(k, sc.cfg.n_slots)))
            for sc in scs]


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


def interval(xs, level: float = LEVEL, spread: bool = False) -> list:
    """Student-t interval of the mean of ``xs`` ([nan, nan] below two finite samples;
    with ``spread``, also when they are all equal: no spread to estimate, and a
    zero-width interval would claim a certainty the samples do not have)."""
    x = np.asarray(xs, np.float64)
    x = x[np.isfinite(x)]
    if x.size < 2 or (spread and np.all(x == x[0])):
        return [math.nan, math.nan]
    m, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))
    # Student's t quantile (scipy.special's stdtrit: scipy.stats.t.ppf's values, without
    # the half second scipy.stats takes to import)
    h = float(stdtrit(x.size - 1, 0.5 + level / 2)) * se
    return [m - h, m + h]


def _summary(ms: list[dict]) -> dict:
    keys = [k for k, v in ms[0].items() if isinstance(v, (int, float))]
    from tuner.objective.objectives import is_share

    out = {k: float(np.mean([m[k] for m in ms])) for k in keys}
    out["ci"] = {k: interval([m[k] for m in ms]) for k in keys}
    for k in keys:  # a share's interval stays within [0, 1]
        if is_share(k) and all(np.isfinite(out["ci"][k])):
            out["ci"][k] = [max(out["ci"][k][0], 0.0), min(out["ci"][k][1], 1.0)]
    out["samples"] = len(ms)
    return out


def sample_key(sc) -> str:
    """A digest of what the simulator reads of scenario ``sc``: every workload array
    (padding rows included) and the server config, values and shapes. Equal keys: the
    same sample, whatever seed or spec made it."""
    h = hashlib.sha256()
    for obj in (sc.workload, sc.cfg):
        for f in dataclasses.fields(obj):
            a = np.asarray(getattr(obj, f.name))
            h.update(f"{f.name}:{a.dtype}:{a.shape}:".encode())
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def _same_results(a: dict, b: dict) -> bool:
    """Every policy's every numeric metric equal on two samples."""
    for name in a:
        ma, mb = a[name], b[name]
        keys = [k for k, v in ma.items() if isinstance(v, (int, float))]
        if set(keys) != {k for k, v in mb.items() if isinstance(v, (int, float))}:
            return False
        if any(not (ma[k] == mb[k] or (ma[k] != ma[k] and mb[k] != mb[k])) for k in keys):
            return False
    return True


def _independent(keys: list, results: list) -> list[int]:
    """Indices of the first of each group of equal samples: equal input keys, or
    (inputs differing only where the simulator does not look) equal results of every
    policy."""
    keep = []
    for i, k in enumerate(keys):
        if not any(keys[j] == k or _same_results(results[j], results[i]) for j in keep):
            keep.append(i)
    return keep


def _dedup_note(n: int, k: int) -> str:
    what = f"held-out (window, seed) sample{'s' if n != 1 else ''}"
    if n == k:
        return f"{n} {what}, {'all' if n != 1 else 'one'} independent"
    return (f"{n} {what}, {k} independent: the held-out seeds do not change this "
            "workload (the trace's own arrival times and seed-independent predictions, "
            "or a simulator that reads none), so equal samples count once")


def held_out_windows(wins: list, wholes: list) -> list:
    """The held-out windows as they run: padded to one shape. Where their requests fit
    a smaller slot table than the whole slice's (:func:`fit_slots`), they run apart from
    it on that table, padded to the largest window (a second shape: each lockstep batch
    runs until its last lane is done, and a window's runs end long before the whole
    slice's); else padded to the whole slice, one compiled program per system."""
    if not wins:
        return []
    m = max(sc.workload.size for sc in wins)
    cut = fit_slots([sc.padded(m) for sc in wins])
    if cut[0].cfg.n_slots < wholes[0].cfg.n_slots:
        return cut
    n = max(sc.workload.size for sc in wholes)
    return [sc.padded(n) for sc in wins]


def validation_samples(win: Windows, seeds: int, whole_slice: bool = True) -> tuple:
    """The held-out samples :func:`validate` runs: ``(samples, keys)``, ``samples`` a
    list of (``"runs"`` or ``"whole"``, scenario, index of the earlier sample of that
    group with equal inputs or None), ``keys`` each group's input keys in order."""
    if seeds < 1:
        raise ValueError(f"--holdout-seeds must be >= 1, got {seeds}")
    keys = {"runs": [], "whole": []}
    jobs = [(w, k) for w in win.holdout for k in range(seeds)]
    wholes = [build_scenario(win.whole.replace(seed=win.whole.seed + HOLDOUT_SEED + k))
              for k in range(seeds)]
    held = held_out_windows(
        [build_scenario(w.replace(seed=w.seed + HOLDOUT_SEED + k)) for w, k in jobs],
        wholes)
    samples = []
    if whole_slice:
        jobs += [(win.whole, k) for k in range(seeds)]
    for j, (w, k) in enumerate(jobs):
        sc = wholes[k] if w is win.whole else held[j]
        group = "whole" if w is win.whole else "runs"
        key = sample_key(sc)
        same = keys[group].index(key) if key in keys[group] else None
        keys[group].append(key)
        samples.append((group, sc, same))
    return samples, keys


def validation_jobs(policies: dict, prepared: tuple) -> tuple[list, list]:
    """``(todo, jobs)``: the (sample index, policy name) pairs :func:`validate` runs
    (each independent sample of :func:`validation_samples` ``prepared`` x each policy)
    and their :func:`tuner.objective.evaluate.evaluate_many` jobs."""
    samples = prepared[0]
    todo = [(i, name) for i, (_, _, same) in enumerate(samples) if same is None
            for name in policies]
    return todo, [(samples[i][1], *policies[name]) for i, name in todo]


def validate(system: str, policies: dict, objective: str, win: Windows, seeds: int,
             log=lambda s: None, whole_slice: bool = True,
             hints: dict | None = None, prepared: tuple | None = None) -> dict:
    """Exact evaluation of ``policies`` ({name: (system, params)}) on the held-out
    windows x ``seeds`` held-out seeds, and (``whole_slice``) on the whole slice per
    seed. Returns, per
    name, the mean of every metric with its interval (``ci``) over the independent
    samples, the per-sample objective of those (``objective_per_sample``), how many
    (window, seed) samples were run (``n_samples``) and how many were independent
    (``n_independent``, also ``samples``; ``sample_note`` says why they differ), and
    the whole-slice means (``whole_trace``, deduplicated the same way; absent without
    ``whole_slice``: the whole slice's runs are as long as all held-out windows' together
    twice over, and the verdict never reads them). ``hints`` ({name: req/s}): an
    estimate of a policy's goodput (its goodput on the training windows) from which its
    held-out goodput searches start (:func:`tuner.objective.capacity.capacity_search`:
    fewer rounds, no runs at the ladder's low rates). ``prepared``: its
    :func:`validation_samples`, where the caller built them already."""
    samples, keys = prepared or validation_samples(win, seeds, whole_slice)
    runs = {name: [] for name in policies}
    whole = {name: [] for name in policies}
    todo, jobs = validation_jobs(policies, (samples, keys))
    repeats = sum(same is not None for _, _, same in samples)
    log(f"validating: {len(samples)} (window, seed) sample(s) x {len(policies)} "
        f"policies, exact goodput searches in lockstep, each round's runs batched per "
        "system" + (f" ({repeats} sample(s) with the inputs of an earlier seed: not "
                    "simulated again)" if repeats else ""))
    hints = hints or {}
    got = evaluate_many(jobs, objective=objective,
                        hints=[hints.get(name) for _, name in todo], log=log)
    result = dict(zip(todo, got))
    for i, (group, _, same) in enumerate(samples):
        res = whole if group == "whole" else runs
        for name in policies:
            res[name].append(result[(i, name)] if same is None else res[name][same])
    names = list(policies)
    keep = {}
    for where, res in (("runs", runs), ("whole", whole)):
        per = [{n: res[n][i] for n in names} for i in range(len(keys[where]))]
        keep[where] = _independent(keys[where], per)
    note = _dedup_note(len(keys["runs"]), len(keep["runs"]))
    if len(keep["runs"]) < len(keys["runs"]):
        log(f"validation: {note}")
    out = {}
    for name, (sys_name, _) in policies.items():
        ind = [runs[name][i] for i in keep["runs"]]
        s = _summary(ind)
        s["system"] = sys_name
        s["objective_per_sample"] = [m["objective"] for m in ind]
        s.update(n_samples=len(runs[name]), n_independent=len(ind), sample_note=note)
        if not whole_slice:
            out[name] = s
            continue
        wi = [whole[name][i] for i in keep["whole"]]
        s["whole_trace"] = _summary(wi)
        s["whole_trace"]["objective_per_seed"] = [m["objective"] for m in wi]
        s["whole_trace"].update(n_samples=len(whole[name]), n_independent=len(wi))
        out[name] = s
    return out


def resolution(objective: str) -> float:
    """The relative resolution of an exact evaluation of ``objective``: a goodput is
    found to the bisection's bracket width (:func:`tuner.objective.capacity.
    capacity_search`: 2% for ``goodput_rps``, 0.5% for ``goodput_expected_rps``), and
    two policies measured through different rates can differ by up to that much with
    no difference between them; 0 for objectives read from one run."""
    from tuner.objective.capacity import RTOL, RTOL_EXPECTED
    from tuner.objective.objectives import parse_objective

    names = {n for _, n in parse_objective(objective).goal}
    if names & {"goodput_rps", "goodput_scale"}:
        return RTOL
    if "goodput_expected_rps" in names:
        return RTOL_EXPECTED
    return 0.0


def compare_paired(tuned: list, other: list, rel_tol: float = 0.0) -> dict:
    """Tuned minus ``other`` on paired samples: the mean difference, its interval and
    ``better``/``worse`` (the interval clear of +-``rel_tol`` x the mean of ``other``:
    the measurement's resolution, :func:`resolution`) or ``indistinguishable``, or
    ``undetermined`` (``ci`` None and ``why``) below two samples or when every paired
    difference is equal."""
    d = np.asarray(tuned, np.float64) - np.asarray(other, np.float64)
    d = d[np.isfinite(d)]
    base = float(np.mean(other))
    diff = float(d.mean()) if d.size else math.nan
    rel = diff / abs(base) if base else math.inf
    row = {"diff": diff, "relative": rel, "n": int(d.size)}
    lo, hi = interval(d, spread=True)
    if not np.isfinite(lo):
        if d.size < 2:
            why = f"{d.size} independent held-out sample{'s' if d.size != 1 else ''}"
        elif diff == 0.0:
            why = (f"the same objective on each of the {d.size} independent held-out "
                   "samples (every paired difference 0)")
        else:
            why = (f"the same paired difference ({diff:.4g}) on each of the {d.size} "
                   "independent held-out samples")
        return {**row, "ci": None, "status": "undetermined", "why": why}
    tol = abs(rel_tol * base)
    status = "better" if lo > tol else "worse" if hi < -tol else "indistinguishable"
    out = {**row, "ci": [lo, hi], "status": status, "tolerance": tol}
    if status == "indistinguishable" and (lo > 0 or hi < 0):
        out["why"] = (f"the interval [{lo:.4g}, {hi:.4g}] excludes 0 but not the "
                      f"evaluation's resolution (+-{tol:.4g}: {rel_tol:.1%} of the "
                      "reference)")
    return out


SLO_METRICS = ("slo_attainment", "ttft_p99_s", "tpot_p99_s")


def verdict(mets: dict, objective: str, baselines: tuple[str, ...]) -> dict:
    """Tuned against the default and each baseline, on paired held-out samples (the
    independent ones: see the module docstring).

    ``loss``: the default or a baseline is better with the interval of the paired
    difference below zero (the policy is not exported); otherwise ``undetermined`` when
    there are fewer than two independent samples or a comparison's paired differences
    are all equal (no interval can be drawn: not exported either); ``win``: the tuned
    policy is better than every baseline and not worse than the default; ``tie``
    otherwise. The result carries ``n_samples`` ((window, seed) samples run) and
    ``n_independent``; an undetermined one its ``reason``."""
    from tuner.objective.objectives import parse_objective

    objective = parse_objective(objective).spec
    tol = resolution(objective)
    t = mets["tuned"]
    rows = {}
    for name in ("default", *baselines):
        rows[name] = compare_paired(t["objective_per_sample"],
                                    mets[name]["objective_per_sample"], tol)
        for m in SLO_METRICS:
            if m in t and m in mets[name]:
                rows[name][m] = [t[m], mets[name][m]]
    n_ind = int(t.get("n_independent", len(t["objective_per_sample"])))
    n_run = int(t.get("n_samples", n_ind))
    worse = [n for n, r in rows.items() if r["status"] == "worse"]
    unknown = [n for n, r in rows.items() if r["status"] == "undetermined"]
    best = max(baselines, key=lambda b: mets[b]["objective"]) if baselines else "default"
    b = rows[best]
    pct = f"{b['relative']:+.1%}"
    reason = None
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
    elif n_ind < 2 or unknown:
        if n_ind < 2:
            dup = (f" of {n_run} (window, seed) samples: the held-out seeds do not change "
                   "this workload" if n_run > n_ind else "")
            reason = (f"only {n_ind} independent held-out sample{'s' if n_ind != 1 else ''}"
                      f"{dup}, and a paired interval needs two; give more --windows or "
                      "--holdout-seeds (seeds help only where they change the workload)")
        else:
            u = unknown[0]
            reason = (f"the tuned policy and {u if u != 'default' else 'the default'} "
                      f"have {rows[u]['why']}, so no interval can be drawn"
                      + (f" (also: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""))
        sentence = (f"undetermined on held-out data: {reason}; no policy exported "
                    "(--export-anyway writes it)")
        outcome = "undetermined"
    elif all(r["status"] == "better" for n, r in rows.items() if n != "default"):
        span = (f"paired 95% interval of tuned - {best}: [{b['ci'][0]:.4g}, "
                f"{b['ci'][1]:.4g}]")
        sentence = (f"the tuned policy beats every baseline on held-out data: {pct} over "
                    f"{best} ({span}) and {rows['default']['relative']:+.1%} over the "
                    "default")
        outcome = "win"
    else:
        span = (f"paired 95% interval of tuned - {best}: [{b['ci'][0]:.4g}, "
                f"{b['ci'][1]:.4g}]")
        d = rows["default"]
        vs_default = (f"on this workload the memory policy does not decide {objective}"
                      if d["status"] == "indistinguishable" else
                      f"{d['relative']:+.1%} over the default (paired 95% interval "
                      f"[{d['ci'][0]:.4g}, {d['ci'][1]:.4g}])")
        sentence = (f"the tuned policy and {best} are indistinguishable on held-out data "
                    f"({pct}; {span}); {vs_default}; the tuned policy is exported, "
                    f"{best} serves as well")
        outcome = "tie"
    out = {"outcome": outcome, "sentence": sentence, "best_baseline": best,
           "n_samples": n_run, "n_independent": n_ind, "comparisons": rows}
    if reason is not None:
        out["reason"] = reason
    return out
