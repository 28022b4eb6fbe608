"""Tune vLLM's engine arguments: vLLM's defaults, vLLM's auto_tune grid, CMA-ES, TPE and
the screened search.

``python -m experiments.engine_tune --out DIR [--cases a,b] [--evals 24] [--windows 2]
[--holdout-seeds 2] [--quick]``

Issue 34's comparison on the ``vllm-v1`` system (``models.bucketed.engine``: the engine
arguments ``max_num_seqs``, ``max_num_batched_tokens``, ``gpu_memory_utilization`` and
``long_prefill_token_threshold`` are its parameters, the KV capacity vLLM's memory
profile gives at them), on the calibrated
deployments of ``../shared/reference/vllm-bench/`` (the device profiles
``experiments.calibrate_check`` fitted to them) and two traces, ShareGPT lengths
(Poisson arrivals) and Mooncake's bursty conversation arrivals. Every method tunes the
same objective (``goodput_rps``: the largest arrival rate at which 90% of requests meet
both SLOs) on the same training windows (:func:`tuner.objective.validation.plan_windows`,
as ``tuner.fit`` splits a slice):

- ``default``: vLLM V1's own defaults for the device (the system's default; ``vllm
  serve``), nothing tuned;
- ``auto_tune``: vLLM's ``benchmarks/auto_tune`` with its own grid (``max_num_seqs`` 128,
  256 x ``max_num_batched_tokens`` 512, 1024, 2048, 4096) and its own rule for the
  memory utilisation (from 0.98 down by 0.01 until the server starts: here until the
  system's ``refusal`` predicts no start-up failure) and its own rule for the request
  rate (:mod:`tuner.search.auto_tune_rate`: every request at once, then from
  int(throughput) + 1 req/s down by 1 req/s until the target attainment is met; the
  setting with the highest throughput there kept);
- ``grid``: the same settings, each scored by the exact goodput search on the training
  windows, the best kept: what the grid holds at the objective's resolution (the
  comparison this script made of auto_tune before it followed auto_tune's rate rule);
- ``gradient``: ``tuner.search.fitting.fit``, tuner.fit's default tuner (its own budget
  of relaxed gradient steps, exact checks and exact finite differences where the
  relaxed gradient is flat), started from vLLM's defaults;
- ``guided``, ``cmaes`` and ``tpe``: ``tuner.search.blackbox.search_fit`` (what
  ``tuner.fit --method`` runs) with ``--evals`` exact evaluations each, started from
  vLLM's defaults, their first generation auto_tune's grid as ``tuner.fit`` does
  (``tuner.search.engine_grid``; its 8 settings are 8 of the ``--evals``);
  ``cmaes-nogrid``: CMA-ES without it (``tuner.fit --no-grid``), what the grid adds;
- ``screen``: ``tuner.search.screen.screen_fit`` (``tuner.fit --method screen``, its
  defaults): auto_tune's grid and uniform samples, 32 candidates, screened by their
  SLO attainment at the start's goodput (one run per training window), the start and
  the screen's best 4 evaluated in full (5 exact
  evaluations; the screen's cost, in exact-evaluation equivalents, is reported beside);
  ``screen16``: the same with 16 candidates and the best 2 (3 exact evaluations).

Each method's policy is then validated in exact mode on the held-out windows x held-out
seeds (:func:`tuner.objective.validation.validate`): the mean goodput with its 95%
interval, and paired differences (same window, same seed) against the default,
auto_tune and the grid, with intervals. Costs: exact evaluations (a goodput search
each), simulator runs to completion (auto_tune's, the grid's) or simulated ladders (the
searches'), the slot-iterations they simulated (the work and runs ratios: each
baseline's over each search's), and the search's wall time on this machine.

Then the operator's map (:mod:`experiments.engine_map`, unless ``--no-map``) around
the better search's policy: each argument's influence (its goodput spread alone across
its range) and, over the two most influential, the goodput and the TTFT / TPOT p99 at
the load vLLM's default sustains, the default and the tuned point marked.

Writes ``engine_tune.json``, ``engine_tune.md`` and ``engine_tune_<case>.png``
(atomically, again after every case) to ``--out``; progress goes to stderr. Exit 0:
every case ran; 2: bad arguments.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # progress from the first second: the imports take ~2 s
    print("experiments.engine_tune: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from experiments import engine_map  # noqa: E402
from tuner.search.engine_grid import (AUTO_TUNE_SEQS, AUTO_TUNE_TOKENS,  # noqa: E402
                                      AUTO_TUNE_UTIL, GRID_NOTE, auto_tune_grid)
from experiments.results_io import pick_cases, png_metadata, write_result  # noqa: E402
from tuner.common import compile_cache  # noqa: E402
from tuner.common.atomic import unwritable_reason  # noqa: E402

__all__ = ["CASES", "main", "render", "run_case"]

SYSTEM = "vllm-v1"
OBJECTIVE = "goodput_rps"
N = 1000
SLOTS = 512
PROFILES = Path(__file__).resolve().parent / "results" / "calibrate_check"
# (name, ScenarioSpec fields, description)
CASES = (
    ("h100-sharegpt-tpot20", dict(trace="sharegpt", hardware="h100.profile.json",
                                  model="qwen3-8b", ttft_slo_s=1.0, tpot_slo_s=0.02),
     "Qwen3-8B on the calibrated H100, ShareGPT lengths (Poisson arrivals); TTFT 1 s, "
     "TPOT 20 ms"),
    ("h100-azure-conv-tpot20", dict(trace="azure-conv", hardware="h100.profile.json",
                                    model="qwen3-8b", ttft_slo_s=1.0, tpot_slo_s=0.02),
     "Qwen3-8B on the calibrated H100, Azure LLM 2023 conversation trace (its real "
     "arrivals: inter-arrival CV 1.25 over the first 1,000 requests); TTFT 1 s, TPOT "
     "20 ms"),
    # Mooncake's conversation trace gives its requests in groups that share one
    # timestamp (111 instants for the first 1,000 requests, up to 17 per instant): a
    # rescaled rate keeps each group together, so with prompts of 14k tokens on average
    # the later requests of a group miss a TTFT of 5x the uncontended one at every rate:
    # the exact goodput of vLLM's defaults and of the gradient's setting on the training
    # windows is ~0 (a run of this case, stopped), so these cases rank no setting
    ("h100-mooncake", dict(trace="mooncake", hardware="h100.profile.json", model="qwen3-8b",
                           slo_scale=5.0),
     "Qwen3-8B on the calibrated H100, Mooncake conversation (bursty arrivals, long "
     "prompts); SLOs 5x the uncontended TTFT / TPOT"),
    ("a100-sharegpt", dict(trace="sharegpt", hardware="a100.profile.json", model="qwen3-8b",
                           slo_scale=5.0),
     "Qwen3-8B on the calibrated A100 80GB, ShareGPT lengths; SLOs 5x the uncontended "
     "TTFT / TPOT"),
    ("a100-mooncake", dict(trace="mooncake", hardware="a100.profile.json", model="qwen3-8b",
                           slo_scale=5.0),
     "Qwen3-8B on the calibrated A100 80GB, Mooncake conversation; SLOs 5x the "
     "uncontended TTFT / TPOT"),
)
METHODS = ("default", "auto_tune", "grid", "gradient", "guided", "cmaes", "cmaes-nogrid", "tpe",
           "screen", "screen16")
# started from vLLM's defaults; the black-box ones (but cmaes-nogrid) with auto_tune's
# grid as their first generation (the screens: in their pools)
# auto_tune as it runs, and its grid scored by the exact goodput
BASELINES = ("auto_tune", "grid")
SEARCHES = ("gradient", "guided", "cmaes", "cmaes-nogrid", "tpe", "screen", "screen16")
# the screened searches: (pool, full evaluations); screen16 is fit_methods' cheaper row
SCREENS = {"screen": (None, None), "screen16": (16, 3)}
QUICK = dict(n_requests=300)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_case(name: str, fields: dict, evals: int, windows: int, seeds: int,
             quick: bool, do_map: bool = True) -> dict:
    from models import get_system
    from tuner.objective.evaluate import evaluate_many, mean_metrics, run
    from tuner.objective.validation import (compare_paired, plan_windows, resolution,
                                            validate)
    from tuner.scenario import ScenarioSpec, build_scenario
    from tuner.search.auto_tune_rate import auto_tune_pick, auto_tune_rates
    from tuner.search.blackbox import search_fit
    from tuner.search.screen import POOL, SCREEN_EVALS, screen_fit
    from tuner.search.fitting import FitSettings
    from tuner.search.fitting import fit as gradient_fit

    fields = {**fields, "hardware": str(PROFILES / fields["hardware"])}
    base = ScenarioSpec(**{"n_requests": N, "scheduler": "chunked", "n_slots": SLOTS,
                           "max_batch": SLOTS, **fields, **(QUICK if quick else {})})
    win = plan_windows(base, windows)
    whole = build_scenario(win.whole)
    pinned = {"ttft_slo_s": whole.slo["ttft_s"], "tpot_slo_s": whole.slo["tpot_s"],
              "max_len": int(whole.cfg.max_len)}
    win = win.replace_specs(**pinned)
    system = get_system(SYSTEM)
    default = {k: float(v) for k, v in system.default_params(
        whole.cfg.max_len, whole.hw, whole.deployment).items()}
    _log(f"{name}: {win.note}; SLOs TTFT {pinned['ttft_slo_s']:.3g} s, TPOT "
         f"{pinned['tpot_slo_s']:.3g} s; vLLM default {default}")
    methods = {"default": {"params": default, "exact_evaluations": 0, "runs": 0,
                           "search_wall_s": 0.0}}

    # auto_tune sets three arguments; every other one (block size, the long-prefill
    # threshold: vLLM's 0, off) stays at the system's default
    grid, stepped = auto_tune_grid(system, whole.deployment, default)
    if not grid:
        raise SystemExit(f"{name}: no auto_tune setting starts: {stepped}")
    train = [build_scenario(w) for w in win.train]
    slots = train[0].cfg.n_slots

    # auto_tune as it runs: its grid, its utilisation rule, its rate rule (every request
    # at once, then int(throughput) + 1 req/s down by 1 until the target is met), the
    # setting with the highest throughput there kept
    t0 = time.perf_counter()

    def at_rates(p, rates):  # each rate on every training window, their mean metrics
        out = []
        for r in rates:
            out.append(mean_metrics([run(sc.at_rate(r), SYSTEM, p) for sc in train]))
        return out

    rules = auto_tune_rates(grid, at_rates)
    pick = auto_tune_pick(rules)
    methods["auto_tune"] = {
        "params": grid[pick] if pick is not None else default,
        "none_met": pick is None, "exact_evaluations": 0,
        "runs": sum(r["runs"] for r in rules) * len(train),
        "simulated_request_iterations": sum(r["iterations"] for r in rules)
        * len(train) * slots,
        "search_wall_s": time.perf_counter() - t0,
        "grid": [{**g, **{k: r[k] for k in ("request_rate", "throughput_rps", "met",
                                            "runs")}} for g, r in zip(grid, rules)],
        "util_stepped": stepped}
    _log(f"{name}: auto_tune keeps "
         + (f"{grid[pick]} (rate {rules[pick]['request_rate']:g} req/s, throughput "
            f"{rules[pick]['throughput_rps']:.4g})" if pick is not None
            else "nothing (no setting met the target): vLLM's defaults stay")
         + f", {methods['auto_tune']['runs']} runs, {time.perf_counter() - t0:.0f} s")

    # auto_tune's grid, each setting scored by the exact goodput on the training
    # windows (the goodput search every method here is scored by), the best kept: what
    # the grid holds, found at the objective's resolution
    t0 = time.perf_counter()
    res = evaluate_many([(tuple(train), SYSTEM, p) for p in grid], objective=OBJECTIVE,
                        log=_log)
    scores = [float(m["objective"]) for m in res]
    best = int(np.argmax(scores))
    methods["grid"] = {
        "params": grid[best], "exact_evaluations": len(grid),
        "runs": sum(int(m["capacity"]["runs"]) for m in res) * len(train),
        # what its runs to completion simulated, on the searches' scale (slot-iterations:
        # every iteration with work steps the whole slot table); in exact-evaluation
        # equivalents once a search has given its unit
        "simulated_request_iterations": sum(float(m["capacity"]["iterations"])
                                            for m in res) * len(train) * slots,
        "search_wall_s": time.perf_counter() - t0,
        "grid": [{**g, "train_goodput_rps": v} for g, v in zip(grid, scores)]}
    _log(f"{name}: the grid's best by exact goodput {grid[best]} ({scores[best]:.4g} "
         f"req/s on the training windows), {time.perf_counter() - t0:.0f} s")

    st = FitSettings(system=SYSTEM, objective=OBJECTIVE, seed=base.seed,
                     holdout_seeds=seeds)
    for method in SEARCHES:
        t0 = time.perf_counter()
        exact = []  # every exact evaluation of the training problem
        screened = 0
        if method == "gradient":  # tuner.fit's default: FitSettings' budget of steps
            fit = gradient_fit(list(win.train), st, log=_log,
                               listeners=[lambda c, th, v: exact.append(v)])
            n_exact = len(exact)
        elif method in SCREENS:
            pool, n_full = SCREENS[method]
            fit = screen_fit(list(win.train), st, n_full or SCREEN_EVALS,
                             pool=pool or POOL, log=_log, first=grid,
                             first_note=GRID_NOTE)
            n_exact = sum(h["fidelity"] == "full" for h in fit.history)
            screened = len(fit.history) - n_exact
        else:  # guided: its gradients charged to fit.steps at their measured cost
            plain = method.removesuffix("-nogrid")
            fit = search_fit(list(win.train), st, plain, evals, log=_log,
                             first=None if plain != method else grid,
                             first_note=GRID_NOTE)
            n_exact = fit.steps
        # cost: exact evaluations of the training problem (each a fixed-horizon rate
        # ladder on every training window) and the slot-iterations they simulated
        # cost, and the runs to completion that measured the start policy's goodput
        # (the ladder is planned from it; auto_tune needs no such step)
        rungs = 1 if fit.rates is None else int(np.shape(fit.rates)[-1]) + 1
        work = float(fit.cost) + float(fit.start_work or 0.0)
        methods[method] = {"params": {k: float(v) for k, v in fit.params.items()},
                           "exact_evaluations": n_exact,
                           # fixed-horizon runs: a rate ladder per window per evaluation
                           # (the screened search: its runs to completion), and the
                           # start's runs to completion
                           "runs": (n_exact * len(win.train) * rungs
                                    + screened * len(win.train) if fit.runs is None
                                    else int(fit.runs)) + int(fit.start_runs or 0),
                           "start_runs": int(fit.start_runs or 0),
                           "screened": screened,
                           "eval_equivalents": work / max(fit.unit, 1),
                           "simulated_request_iterations": work,
                           "unit": int(fit.unit),
                           "search_wall_s": time.perf_counter() - t0,
                           "train_best": fit.best_exact,
                           "start_goodput_rps": fit.start_goodput_rps}
        if method == "gradient":
            methods[method].update(gradient_steps=fit.steps, estimators=fit.estimators)
        _log(f"{name}: {method} {methods[method]['params']} "
             f"({fit.best_exact:.4g} on training), "
             f"{methods[method]['search_wall_s']:.0f} s")

    for ref in BASELINES:  # in the screened search's unit (the searches share it)
        methods[ref]["eval_equivalents"] = methods[ref]["simulated_request_iterations"] \
            / max(methods["screen"]["unit"], 1)
    for m in SEARCHES:  # simulated work and runs, the baseline's over the search's
        for ref in BASELINES:
            methods[m][f"{ref}_work_ratio"] = methods[ref][
                "simulated_request_iterations"] / max(
                methods[m]["simulated_request_iterations"], 1.0)
            methods[m][f"{ref}_runs_ratio"] = methods[ref]["runs"] / max(
                methods[m]["runs"], 1)
    t0 = time.perf_counter()
    # each held-out goodput search starts from the policy's training goodput; methods
    # that found the same setting start where the first of them does (equal policies,
    # equal runs: no difference made by the search's resolution)
    hints = {"default": methods[SEARCHES[0]]["start_goodput_rps"],
             "auto_tune": (rules[pick]["request_rate"] if pick is not None
                           and math.isfinite(rules[pick]["request_rate"]) else None),
             "grid": max(scores), **{m: methods[m]["train_best"] for m in SEARCHES}}
    first = {}  # each setting's hint: the first method's with one
    for m in METHODS:
        key = json.dumps(methods[m]["params"], sort_keys=True)
        if first.get(key) is None:
            first[key] = hints[m]
        hints[m] = first[key]
    mets = validate(SYSTEM, {m: (SYSTEM, methods[m]["params"]) for m in METHODS},
                    OBJECTIVE, win, seeds, log=_log,
                    hints={m: h for m, h in hints.items() if h and h > 0})
    val_wall = time.perf_counter() - t0
    for m in METHODS:
        v = mets[m]
        methods[m]["held_out"] = {"mean": v["objective"], "ci": v["ci"]["objective"],
                                  "per_sample": v["objective_per_sample"],
                                  "n_independent": v["n_independent"],
                                  "ttft_p99_s": v["ttft_p99_s"],
                                  "tpot_p99_s": v["tpot_p99_s"],
                                  "whole_slice": v["whole_trace"]["objective"]}
        for ref in ("default", *BASELINES):
            if m != ref:
                methods[m][f"vs_{ref}"] = compare_paired(
                    v["objective_per_sample"], mets[ref]["objective_per_sample"],
                    resolution(OBJECTIVE))
    out = {"spec": base.to_dict(), "windows": win.note, "slo_s": [pinned["ttft_slo_s"],
                                                                  pinned["tpot_slo_s"]],
           "map": _map(name, win, train, st, methods, default) if do_map else None,
           "evals": evals, "holdout_seeds": seeds, "methods": methods,
           "validation_wall_s": val_wall, "sample_note": mets["default"]["sample_note"]}
    _log(f"{name}: held out " + ", ".join(
        f"{m} {methods[m]['held_out']['mean']:.4g}" for m in METHODS))
    return out


def _map(name: str, win, train: list, st, methods: dict, default: dict) -> dict:
    """The operator's map (:mod:`experiments.engine_map`) around the better search's
    policy (by held-out mean): the arguments ranked by influence, and the grid over the
    two that matter most, scored by the searches' own training problem (``st``: the
    same settings, so the same compiled program), with the latencies at the load vLLM's
    default sustains on the training windows (``train``: their scenarios, built once by
    :func:`run_case`)."""
    import jax.numpy as jnp

    from experiments import engine_map
    from tuner.objective.evaluate import evaluate_many
    from tuner.search.fitting import build_problem

    t0 = time.perf_counter()
    by = max(SEARCHES, key=lambda m: methods[m]["held_out"]["mean"])
    tuned = methods[by]["params"]
    prob, _ = build_problem(list(win.train), st)
    width = 2 * len(prob.space.coords())  # the CMA-ES population: its compiled batch

    def score(settings):
        thetas = [prob.space.to_theta({k: jnp.float32(v) for k, v in p.items()})
                  for p in settings]
        out = []
        for i in range(0, len(thetas), width):
            part = thetas[i:i + width]
            vals = prob.batch(part + [part[-1]] * (width - len(part)))
            out.extend(float(v) for v in vals[:len(part)])
        return out

    load = float(evaluate_many([(tuple(train), SYSTEM, default)], objective=OBJECTIVE)[0][
        "objective"])
    if not load > 0:
        _log(f"{name}: map: vLLM's default sustains no load on the training windows; "
             "no map")
        return {"tuned_by": by, "skipped": "the default's training goodput is 0"}
    inf = engine_map.influence(score, SYSTEM, train[0].deployment, tuned, default,
                               slots=SLOTS)
    axes = tuple(list(inf)[:2])
    grid = engine_map.grid_map(score, train, SYSTEM, tuned, default, axes,
                               load_rps=load, slots=SLOTS, log=_log)
    _log(f"{name}: map over {axes[0]} x {axes[1]} (tuned by {by}), "
         f"{time.perf_counter() - t0:.0f} s")
    return {"tuned_by": by, "influence": inf, "grid": grid,
            "score": "the searches' training objective (fixed-horizon goodput ladder)",
            "wall_s": time.perf_counter() - t0}


def _thr(p: dict) -> str:
    t = p.get("long_prefill_token_threshold")
    return "off" if t is None or t >= p["max_num_batched_tokens"] else f"{t:.0f}"


def _vs(c: dict) -> str:
    """A paired comparison: relative difference, interval and status; an undetermined
    one says why (no interval can be drawn)."""
    if c["ci"] is None:
        return f"{c['relative'] * 100:+.1f}%, undetermined ({c.get('why', '')})"
    return f"{c['relative'] * 100:+.1f}% {_ci(c['ci'])} {c['status']}"


def _ci(ci) -> str:
    if ci is None or not all(np.isfinite(ci)):
        return "undetermined"
    return f"[{ci[0]:.3g}, {ci[1]:.3g}]"


def _cost(r: dict) -> str:
    c = r.get("eval_equivalents")
    return "-" if c is None else f"{c:.3g}"


def _ratio(r: dict, ref: str) -> str:
    """The baseline's work and runs over the method's (``-`` for a baseline)."""
    w, n = r.get(f"{ref}_work_ratio"), r.get(f"{ref}_runs_ratio")
    return "-" if w is None else f"{w:.3g}x / {n:.2g}x"


def _rate(g: dict) -> str:
    r = g["request_rate"]
    return "none met" if r is None else ("inf" if not math.isfinite(r) else f"{r:g}")


def render(res: dict) -> str:
    L = ["# Tuning vLLM's engine arguments: defaults, auto_tune, its grid, gradient, "
         "guided, CMA-ES, TPE, screened search", "",
         "System `vllm-v1` (max_num_seqs, max_num_batched_tokens, gpu_memory_utilization "
         "and long_prefill_token_threshold as parameters, KV capacity from vLLM's memory "
         "profile), objective goodput_rps, "
         f"{res['evals']} exact evaluations per search, exact validation on held-out "
         "windows x seeds" + (" (quick run: small slices)" if res["quick"] else "") + ".",
         "", "| case | method | max_num_seqs / batched tokens / util / long-prefill "
         "threshold | held-out goodput [95% CI] | vs default [paired CI] | vs auto_tune "
         "[paired CI] | vs grid [paired CI] | exact evals | cost (evals) | auto_tune's "
         "work / runs over its | grid's work / runs over its | runs | search s |",
         "|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, c in res["cases"].items():
        for m, r in c["methods"].items():
            p, h = r["params"], r["held_out"]
            vs = {ref: _vs(r[f"vs_{ref}"]) if f"vs_{ref}" in r else "-"
                  for ref in ("default", *BASELINES)}
            L.append(f"| {name} | {m} | {p['max_num_seqs']:.0f} / "
                     f"{p['max_num_batched_tokens']:.0f} / "
                     f"{p['gpu_memory_utilization']:.3g} / {_thr(p)} | "
                     f"{h['mean']:.3f} {_ci(h['ci'])} | "
                     f"{vs['default']} | {vs['auto_tune']} | {vs['grid']} | "
                     f"{r['exact_evaluations']} | {_cost(r)} | {_ratio(r, 'auto_tune')} | "
                     f"{_ratio(r, 'grid')} | {r.get('runs', 0)} | "
                     f"{r['search_wall_s']:.0f} |")
    L += ["", "Goodput in req/s. Paired differences: the method minus the reference on "
          "the same held-out (window, seed) samples; `better` / `worse` where the 95% "
          "interval excludes 0. `auto_tune`: vLLM's benchmarks/auto_tune as it runs "
          "(`tuner/search/auto_tune_rate.py`): its 8 settings, each run with every "
          "request at once, then from int(throughput) + 1 req/s down by 1 req/s until "
          "90% of requests meet both SLOs (auto_tune's own requirement is a p99 "
          "end-to-end latency bound), the setting with the highest throughput there "
          "kept. `grid`: the same 8 settings, each scored by the exact goodput search "
          "every method here is scored by (to 2%), the best kept: what the grid holds. "
          "Runs: simulator runs to completion or fixed-horizon runs a method spent, per "
          "training window (auto_tune: its rate rule's; grid: its goodput searches'; "
          "the searches: the rate ladder per exact evaluation, the screens' runs, plus "
          "the runs to completion that measured the start policy's goodput, from which "
          "the ladder is planned; cost and work count them too). `gradient` is "
          "tuner.fit's default tuner (relaxed gradient steps besides its exact "
          "evaluations: its search seconds count them); `guided` is CMA-ES steered by "
          "the relaxed gradient, each gradient charged as exact evaluations at its "
          "measured cost. `guided`, `cmaes` and `tpe` evaluate auto_tune's grid as "
          "their first generation (8 of their exact evaluations), as tuner.fit does; "
          "`cmaes-nogrid` is CMA-ES without it. `screen` screens 32 candidates (the grid "
          "and 24 uniform samples) by their SLO attainment at the start's goodput, one "
          "run per window on a shorter horizon, then "
          "evaluates the start and the screen's best 4 in full; `screen16` the same with "
          "16 candidates (the grid and 8 samples) and the best 2. Cost: simulated "
          "slot-iterations (every iteration with work steps the whole slot table) in "
          "exact evaluations of the training problem (screens and gradients included; "
          "runs to completion counted by the iterations they simulated). Work / runs "
          "over its: the baseline's simulated slot-iterations and runs over the "
          "method's. Threshold `off`: at or above the token budget, vLLM's default.",
          ""]
    for name, c in res["cases"].items():
        L += [f"## {name}", "", f"{c['description']}; {c['windows']}; SLOs TTFT "
              f"{c['slo_s'][0]:.3g} s, TPOT {c['slo_s'][1] * 1e3:.3g} ms; validation "
              f"{c['validation_wall_s']:.0f} s; {c['sample_note'] or ''}", ""]
        at, gr = c["methods"]["auto_tune"], c["methods"]["grid"]
        L.append("auto_tune on the training windows (rate req/s, throughput there, runs "
                 "per window): " + ", ".join(
                     f"{g['max_num_seqs']:.0f}/{g['max_num_batched_tokens']:.0f}/"
                     f"{g['gpu_memory_utilization']:g}: {_rate(g)}, "
                     f"{g['throughput_rps']:.3g}, {g['runs']}" for g in at["grid"])
                 + (" (none met the target: vLLM's defaults stay)" if at["none_met"]
                    else "") + ".")
        L.append("The grid's exact goodput on the training windows: " + ", ".join(
            f"{g['max_num_seqs']:.0f}/{g['max_num_batched_tokens']:.0f}/"
            f"{g['gpu_memory_utilization']:g}: {g['train_goodput_rps']:.3g}"
            for g in gr["grid"]) + ".")
        if at["util_stepped"]:
            first = next(iter(at["util_stepped"].values()))
            L.append(f"Utilisation stepped down from 0.98 for "
                     f"{len(at['util_stepped'])} setting(s), e.g. to {first['util']:g}: "
                     f"{first['first']}")
        mp = c.get("map")
        if mp and "grid" in mp:
            g = mp["grid"]
            L.append(f"Influence around the {mp['tuned_by']} policy (goodput spread on "
                     "the training windows, each argument alone across its range): "
                     + ", ".join(f"{k} {v['spread']:.3g}" for k, v in
                                 mp["influence"].items())
                     + f". Map `engine_tune_{name}.png`: {g['axes'][0]} x {g['axes'][1]}; "
                     f"TTFT / TPOT p99 at {g['load_rps']:.3g} req/s (vLLM's default's "
                     "training goodput).")
        elif mp:
            L.append(f"No map: {mp['skipped']}.")
        L.append("")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.engine_tune",
                                 description=__doc__.split("\n\n")[1])
    ap.add_argument("--out", type=Path, required=True, help="result folder")
    ap.add_argument("--cases", default=",".join(c[0] for c in CASES),
                    help="comma-separated case names (default: all)")
    ap.add_argument("--evals", type=int, default=24, help="exact evaluations per search")
    ap.add_argument("--windows", type=int, default=2, help="training (= held-out) windows")
    ap.add_argument("--holdout-seeds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small slices (a test)")
    ap.add_argument("--no-map", dest="map", action="store_false",
                    help="leave out the operator's map (influence sweeps and the grid)")
    args = ap.parse_args(argv)
    known = {c[0]: c for c in CASES}
    try:
        names = pick_cases(args.cases, known)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for flag, v, lo in (("--evals", args.evals, 2), ("--windows", args.windows, 1),
                        ("--holdout-seeds", args.holdout_seeds, 1)):
        if v < lo:
            print(f"error: {flag} {v}: must be >= {lo}", file=sys.stderr)
            return 2
    for name in names:
        f = PROFILES / known[name][1]["hardware"]
        if not f.is_file():
            print(f"error: case {name}: device profile {f} is missing (python -m "
                  "experiments.calibrate_check writes it)", file=sys.stderr)
            return 2
    from tuner.search.blackbox import check_method

    try:
        for m in SEARCHES[1:]:
            if m not in SCREENS:  # their own evaluations, no package
                check_method(m.removesuffix("-nogrid"), args.evals)
    except (ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    why = unwritable_reason(args.out)
    if why:
        print(f"error: --out {args.out}: {why}", file=sys.stderr)
        return 2
    compile_cache.enable()
    res = {"system": SYSTEM, "objective": OBJECTIVE, "evals": args.evals,
           "windows": args.windows, "holdout_seeds": args.holdout_seeds,
           "quick": args.quick, "auto_tune": {"seqs": list(AUTO_TUNE_SEQS),
                                               "tokens": list(AUTO_TUNE_TOKENS),
                                               "util_start_step": list(AUTO_TUNE_UTIL)},
           "cases": {}}
    for name in names:
        _, fields, desc = known[name]
        t = time.perf_counter()
        c = run_case(name, fields, args.evals, args.windows, args.holdout_seeds,
                     args.quick, args.map)
        c["description"] = desc
        c["wall_s"] = time.perf_counter() - t
        res["cases"][name] = c
        doc = write_result(args.out, "engine_tune", res, render)
        if c["map"] and "grid" in c["map"]:
            engine_map.plot(name, c["map"]["grid"], tuple(c["slo_s"]),
                            args.out / f"engine_tune_{name}.png",
                            png_metadata(doc["provenance"]))
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
