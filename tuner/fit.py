"""Tune a memory policy and export it: ``python -m tuner.fit``.

``--deployment`` names the system and scenario to start from
(``tuner.scenario.deployments``; default ``h100-interactive``: vLLM V1's engine
arguments for Qwen3-8B on one H100, ShareGPT lengths, TTFT 1 s / TPOT 20 ms, a
deployment where the policy decides goodput by issue 31's stakes criterion); ``--system``
and every scenario flag replace its fields one by one, and ``--trace`` also its slice.

``--method`` picks the tuner; without it, the deployment's (``h100-interactive``: the
screened search, ``screen``, 16 candidates screened and 3 exact evaluations, the best
held-out goodput of the tuners ``experiments/fit_methods`` measured over three workload
seeds at the least cost) unless ``--system`` names another system, and ``gradient``
otherwise. ``gradient`` for many interacting parameters;
``hybrid`` (the gradient tuner started from the best of ``--explore`` 8 random exact
samples) when the start point may sit on a plateau; ``tpe``, ``cmaes`` or ``random``
(black-box search, ``--evals`` exact evaluations, ``tuner.search.blackbox``) for a handful of
parameters or a flat or jagged exact objective; ``guided``: CMA-ES whose generations are
steered by the relaxed gradient (two of each generation's points along it). On a system
with vLLM's engine arguments (``vllm-v1``) a black-box search's first generation is
vLLM's own tuning grid (``benchmarks/auto_tune``: 8 settings, ``tuner.search.engine_grid``),
so what it finds on the training windows is at least the grid's best; ``--no-grid``
starts it without.

The slice of the trace (default: all of it) is split into ``2 * --windows`` windows
spread over it: the fit trains on every other one, then validates tuned, default and
every baseline of the system in exact mode on the windows in between under held-out
seeds (``--whole-slice``: on the whole slice too, in-sample). The default objective is
goodput (``tuner.objective.capacity``), or the family's own ``default_objective`` (the
dropping family: p99 TTFT under a TPOT SLO). The policy file is written only when no
baseline and not the default is better on held-out data (exit 3 otherwise, nothing
written; ``--export-anyway`` writes it and exits 0, the verdict recorded in the file).
A verdict the held-out data cannot decide (``undetermined``: fewer than two independent
held-out samples, e.g. held-out seeds that do not change a workload with its own arrival
times, or paired differences that are all equal) prints why, with no interval, and
exits 4 with nothing written (``--export-anyway`` writes it and exits 0).

Compiled programs are kept in JAX's persistent compilation cache
(``KVTUNE_JAX_CACHE``, default ``~/.cache/kvtune/jax-cache``; ``0``: off), so a second
run reads them instead of compiling; the last line says how many programs the run built
and how many came from the cache.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # progress from the first second: the imports take ~2 s
    print("tuner.fit: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import collections  # noqa: E402
import io  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from tqdm import tqdm  # noqa: E402

from tuner.cli import add_scenario_args, check_file, check_out, spec_from_args  # noqa: E402
from tuner.scenario.deployments import DEFAULT, DEPLOYMENTS, get_deployment  # noqa: E402
from tuner.common import compile_cache  # noqa: E402
from tuner.common.ahead import in_thread  # noqa: E402
from tuner.common.atomic import write_json_atomic, write_text_atomic  # noqa: E402
from tuner.search.fitting import AUTO_COORDS, CHECKS, FitSettings, fit  # noqa: E402
from tuner.objective.problem import FD_SCHEMES  # noqa: E402
from tuner.search.blackbox import SEARCH_METHODS, check_method, search_fit  # noqa: E402
from tuner.search.screen import POOL, SCREEN_EVALS, screen_fit  # noqa: E402

__all__ = ["METHODS", "EVALS", "EXIT_CODES", "main", "check_out", "tuner_of"]

METHODS = ("gradient", "hybrid", *SEARCH_METHODS, "screen")
HYBRID_EXPLORE = 8  # --explore of --method hybrid unless given
EVALS = 64  # --evals of a search method unless given (or the deployment's)
# verdicts that export nothing without --export-anyway, and the fit's exit code for each
EXIT_CODES = {"loss": 3, "undetermined": 4}
# a deployment's fields that describe its own trace: dropped when --trace names another
_OF_THE_TRACE = ("n_requests", "offset", "rate")


def _args(argv):
    d = FitSettings()
    ap = argparse.ArgumentParser(prog="python -m tuner.fit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployment", default=DEFAULT,
                    metavar="{" + ",".join(DEPLOYMENTS) + "}",
                    help=f"the system and scenario the fit starts from (default {DEFAULT}: "
                    f"{DEPLOYMENTS[DEFAULT].description}); --system and every scenario "
                    "flag given replace its fields one by one (--trace also its slice: "
                    "the whole of the trace given, unless --n-requests)")
    ap.add_argument("--system", default=None,
                    help="the system to tune (default: the deployment's)")
    # checked in main (one "error:" line, exit 2), not by argparse's choices
    ap.add_argument("--method", default=None,
                    metavar="{" + ",".join(METHODS) + "}",
                    help="default: the deployment's tuner (h100-interactive: screen, 5 "
                    "evaluations of 32 candidates, by experiments/fit_methods) unless "
                    "--system names "
                    "another system, else gradient; gradient: many interacting "
                    "parameters; hybrid: "
                    f"gradient from the best of --explore ({HYBRID_EXPLORE}) random "
                    "exact samples; tpe, cmaes, random: black-box search for a handful "
                    "of parameters or a flat/jagged exact objective; guided: CMA-ES "
                    "steered by the relaxed gradient; screen: --pool candidates "
                    "screened by their SLO attainment at the start's goodput (one "
                    "run to completion per window), the start and the best evaluated "
                    "exactly")
    ap.add_argument("--evals", type=int, default=None,
                    help="exact evaluations of a search method (tpe, cmaes, random, "
                    f"guided; default {EVALS}, or the deployment's with its tuner; "
                    f"screen: full evaluations, default {SCREEN_EVALS}: the start and "
                    "the screen's best)")
    ap.add_argument("--pool", type=int, default=None,
                    help=f"--method screen: candidates screened (default {POOL}, or the "
                    "deployment's with its tuner: vLLM's auto_tune grid on vllm-v1, the "
                    "rest uniform samples)")
    ap.add_argument("--no-grid", action="store_true",
                    help="on vllm-v1, do not make vLLM's auto_tune grid (8 settings) the "
                    "first generation of a black-box search")
    ap.add_argument("--objective", default=d.objective,
                    help="preset or spec (default: goodput_rps; e.g. 'tps_mig' = "
                    "'tps,migration_rate<=0.005')")
    ap.add_argument("--margin", type=float, default=d.margin,
                    help="train against constraint bounds tightened by this share of "
                    "their slack (0: the bounds as given); held-out validation and the "
                    "verdict use the real bounds")
    ap.add_argument("--budget", type=int, default=d.budget,
                    help="optimiser steps (gradient, hybrid)")
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--crn", type=int, default=d.crn,
                    help="common-random-number seeds per training window")
    ap.add_argument("--explore", type=int, default=None,
                    help="exact random samples that compete with the start point "
                    f"(default {d.explore}; {HYBRID_EXPLORE} with --method hybrid)")
    ap.add_argument("--check-every", type=int, default=d.check_every,
                    help="steps between exact-mode checks")
    ap.add_argument("--checks", choices=CHECKS, default=d.checks,
                    help="gradient checks at the start: per coordinate (2 exact "
                    "evaluations each, per-coordinate estimators), along --check-dirs "
                    f"random directions, or auto (coords up to {AUTO_COORDS} "
                    "parameters)")
    ap.add_argument("--check-dirs", type=int, default=d.check_dirs,
                    help="random directions of --checks directions")
    ap.add_argument("--fd-scheme", choices=FD_SCHEMES, default=d.fd_scheme,
                    help="exact finite differences: central (default) or forward (half "
                    "the evaluations, less robust on jagged objectives)")
    ap.add_argument("--windows", type=int, default=2,
                    help="training windows (as many held-out windows lie between them)")
    ap.add_argument("--window-requests", type=int, default=None,
                    help="requests per window (default: the slice / (2 x --windows))")
    ap.add_argument("--holdout-seeds", type=int, default=d.holdout_seeds)
    ap.add_argument("--whole-slice", action="store_true",
                    help="also evaluate every policy on the whole slice under each held-out "
                    "seed (in-sample: it holds the training windows; the verdict does not "
                    "read it; its runs take about twice as long as all held-out windows' "
                    "together)")
    ap.add_argument("--out", default="policy.json")
    ap.add_argument("--resume", action="store_true", help="continue from OUT.ckpt")
    ap.add_argument("--export-anyway", action="store_true",
                    help="write the policy even when a baseline or the default wins "
                    "(else exit 3) or the verdict is undetermined (else exit 4)")
    ap.add_argument("--log", default=None, metavar="FILE",
                    help="also write everything the fit prints to FILE (first line: the "
                    "command, commit and source fingerprint), at the end of the run")
    ap.add_argument("--quiet", action="store_true")
    from tuner.scenario import ScenarioSpec

    add_scenario_args(ap, ScenarioSpec(**DEPLOYMENTS[DEFAULT].spec_fields()),
                      title=f"scenario (defaults: the deployment {DEFAULT})")
    return ap.parse_args(argv)


class _Tee(io.TextIOBase):
    """A text stream that writes to ``stream`` and keeps a copy (for ``--log``)."""

    def __init__(self, stream, copy: io.StringIO):
        self._stream, self._copy = stream, copy

    def write(self, s):
        self._copy.write(s)
        return self._stream.write(s)

    def flush(self):
        self._stream.flush()

    def isatty(self):
        return self._stream.isatty()

    def fileno(self):
        return self._stream.fileno()


def _log_text(prov: dict, captured: str) -> str:
    """The log file: the provenance line, then what was printed (a progress bar's
    carriage-return redraws collapsed to their last state)."""
    lines = [ln.rsplit("\r", 1)[-1] for ln in captured.split("\n")]
    from tuner.common.provenance import stamp_text

    return stamp_text(prov) + "\n" + "\n".join(ln for ln in lines if ln.strip()) + "\n"


def _table(mets: dict, names: list[str], objective: str) -> list[str]:
    cols = ("objective", "goodput_rps", "saturation_tps", "slo_attainment", "ttft_p99_s",
            "tpot_p99_s")
    cols = [c for c in cols if c in mets["tuned"]]
    lines = [f"{'':>10} " + " ".join(f"{c:>24}" for c in cols)]
    for n in names:
        m = mets[n]

        def cell(c):
            lo, hi = m["ci"].get(c, [float("nan")] * 2)
            return f"{m[c]:.4g} [{lo:.3g}, {hi:.3g}]" if lo == lo else f"{m[c]:.4g}"
        lines.append(f"{n:>10} " + " ".join(f"{cell(c):>24}" for c in cols))
    return lines


def _hints(objective: str, res, baselines) -> dict:
    """Where each held-out goodput search starts (``validate``'s ``hints``): the tuned
    policy at its training value where the objective is goodput itself, the default
    and the baselines at the start policy's exact training goodput. Estimates only:
    a wrong one costs rounds, not accuracy; but a search's points depend on where it
    starts, so a tuned policy equal to the default starts where the default does
    (equal policies, equal runs: no difference made by the search's resolution)."""
    from tuner.objective.objectives import parse_objective

    obj = parse_objective(objective)
    out = {}
    if res.start_goodput_rps and res.start_goodput_rps > 0:
        out = {"default": res.start_goodput_rps,
               **{b: res.start_goodput_rps for b in baselines}}
    if dict(res.params) == dict(res.default_params):
        if "default" in out:
            out["tuned"] = out["default"]
    elif (obj.goal == ((1.0, "goodput_rps"),) and not obj.constraints
            and math.isfinite(res.best_exact) and res.best_exact > 0):
        out["tuned"] = float(res.best_exact)
    return out


def main(argv=None) -> int:
    """Check every argument and output path, run the fit, write the outputs (and
    ``--log``) at the end: a refused command creates nothing."""
    t0 = time.perf_counter()
    args = _args(argv)
    args._argv = argv
    args._cache = compile_cache.enable()
    from models.simulate import TRACES  # the simulator programs traced (each compiled)

    args._traces0 = collections.Counter(TRACES)
    with compile_cache.CompileCount() as args._compiles:
        return _logged(args, t0)


def _programs(args) -> str:
    """How many simulator programs the run traced, by entry point, and how many programs
    it built in all (the rest are small array operations)."""
    from models.simulate import TRACES

    new = collections.Counter()
    for key, n in TRACES.items():
        if n > args._traces0.get(key, 0):
            new[key[0]] += 1
    parts = ", ".join(f"{k} {v}" for k, v in sorted(new.items()))
    return (f"{sum(new.values())} simulator programs ({parts}); "
            f"{args._compiles.summary()}"
            + (f" ({args._cache})" if args._cache else " (persistent cache off)"))


def _logged(args, t0: float) -> int:
    argv = args._argv
    if args.log is None:
        return _main(args, t0)
    try:
        check_file(Path(args.log), "--log")
        if Path(args.log).resolve() == Path(args.out).resolve():
            raise ValueError(f"--log {args.log}: the same file as --out")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    copy = io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(sys.stdout, copy), _Tee(sys.stderr, copy)
    prov, state = {}, {}
    try:
        rc = _main(args, t0, provenance_out=prov, state=state)
    finally:
        sys.stdout, sys.stderr = old
    if state.get("started"):  # the checks passed and the work ran: its log
        if not prov:
            from tuner.common.provenance import provenance
            prov.update(provenance(_command(argv)))
        try:
            write_text_atomic(args.log, _log_text(prov, copy.getvalue()))
        except OSError as e:
            print(f"error: --log {args.log}: writing it failed ({e.strerror or e})"
                  + (f"; {args.out} was written" if rc == 0 else ""), file=sys.stderr)
            return 2
        print(f"wrote {args.log}", file=sys.stderr)
    return rc


def tuner_of(dep, system: str | None, method: str | None, evals: int | None,
             pool: int | None = None) -> tuple[str, int, int]:
    """The tuner, its exact evaluations and its screen's pool: those given, else the
    deployment's own (``dep.method``, ``dep.evals``, ``dep.pool``) when ``system`` is
    its system or not given and no method is, else ``gradient``; evaluations default
    to :data:`EVALS` (screen: :data:`tuner.search.screen.SCREEN_EVALS`), the pool to
    :data:`tuner.search.screen.POOL`."""
    own = system in (None, dep.system)
    if method is None:
        method = dep.method if own else "gradient"
        if own:
            evals = dep.evals if evals is None else evals
            pool = dep.pool if pool is None else pool
    if evals is None:
        evals = SCREEN_EVALS if method == "screen" else EVALS
    return method, evals, POOL if pool is None else pool


GROUPED_SHARE = 0.1  # shared_instants warns from this share of requests on


def shared_instants(whole) -> str | None:
    """A warning when at least 10% of the slice's requests arrive at an instant another
    request shares (Mooncake's conversation trace: 1,000 requests at 111 instants): a
    rescaled rate keeps each group together, so the later requests of a group may miss
    TTFT at every rate and goodput may rank nothing; else None."""
    import numpy as np

    wl = whole.workload
    t = np.asarray(wl.arrival_s)[np.asarray(wl.valid)]
    if t.size < 2:
        return None
    _, counts = np.unique(t, return_counts=True)
    grouped = int(counts[counts > 1].sum())
    if grouped < GROUPED_SHARE * t.size:
        return None
    return (f"{grouped} of the slice's {t.size} requests ({grouped / t.size:.0%}) share "
            f"their arrival instant with another ({counts.size} instants, up to "
            f"{counts.max()} requests at one): a rescaled rate keeps each group together, "
            "so the later requests of a group may miss their TTFT at every rate and the "
            "goodput rank no setting; an objective at the trace's own timing (e.g. "
            "--objective slo_attainment) does not rescale it")


def _grid(system: str, whole, room: int, log, what: str) -> list[dict] | None:
    """vLLM's auto_tune settings for a search of ``system`` on ``whole``'s deployment,
    when the system has its engine arguments (and a start-up check) and the search has
    ``room`` for the grid (``what``: the flag and value that set it); else None (said in
    the log when only the room is short)."""
    from models import get_system
    from tuner.search.engine_grid import auto_tune_grid, has_engine_args

    spec = get_system(system)
    if spec.refusal is None:
        return None
    default = spec.default_params(whole.cfg.max_len, whole.hw, whole.deployment)
    if not has_engine_args(default):
        return None
    grid = auto_tune_grid(spec, whole.deployment, default)[0]
    if not grid:
        log("vLLM's auto_tune grid not searched first: none of its settings starts on "
            "this deployment")
        return None
    if room < len(grid):
        log(f"vLLM's auto_tune grid not searched first: {what} leaves room for "
            f"{room} of its {len(grid)} settings")
        return None
    return grid


def _command(argv) -> list[str] | None:
    """The command line of a call through :func:`main` (None: ``sys.argv``)."""
    return None if argv is None else ["python3", "-m", "tuner.fit", *argv]


def _main(args, t0: float, provenance_out: dict | None = None,
          state: dict | None = None) -> int:
    argv = getattr(args, "_argv", None)
    out = Path(args.out)
    log = (lambda s: None) if args.quiet else (lambda s: tqdm.write(s, file=sys.stderr))

    def warn(s):
        print(f"warning: {s}", file=sys.stderr)
    d = FitSettings()
    try:
        dep = get_deployment(args.deployment)
        args.method, args.evals, args.pool = tuner_of(dep, args.system, args.method,
                                                      args.evals, args.pool)
        if args.method not in METHODS:
            raise ValueError(f"--method {args.method!r}: choose one of "
                             f"{', '.join(METHODS)}")
        if args.evals < 1:
            raise ValueError(f"--evals {args.evals}: must be >= 1")
        search = args.method in (*SEARCH_METHODS, "screen")
        if args.pool < 1:
            raise ValueError(f"--pool {args.pool}: must be >= 1")
        if search:
            if args.resume:
                raise ValueError(f"--resume: --method {args.method} keeps no "
                                 "checkpoint (only the gradient tuner does)")
            if args.method != "screen":
                check_method(args.method, args.evals)  # its package, before any work
            elif args.evals - 1 > args.pool:
                raise ValueError(f"--evals {args.evals} with --pool {args.pool}: the "
                                 "screen evaluates the start and at most --pool "
                                 f"candidates in full, so --evals <= {args.pool + 1}")
        if args.explore is None:
            args.explore = HYBRID_EXPLORE if args.method == "hybrid" else d.explore
        ckpt = check_out(out)
        from tuner.export.deployment import _stem
        from tuner.export.bench_dataset import FORMATS as DATASET_FORMATS

        check_file(out.with_name(_stem(out) + DATASET_FORMATS["custom"].suffix),
                   f"--out {out}: the dataset file beside it,")
        if args.budget < 1:
            raise ValueError("--budget must be >= 1")
        from models import get_system
        from tuner.objective.objectives import parse_objective
        from tuner.scenario import ScenarioSpec, build_scenario
        from tuner.objective.validation import plan_windows

        if args.system is None:
            args.system = dep.system
        fields = dep.spec_fields()
        if args.trace is not None:  # the deployment's slice and rate are of its trace
            for k in _OF_THE_TRACE:
                fields.pop(k, None)
        base = spec_from_args(args, ScenarioSpec(**fields))
        kept = [k for k, v in fields.items()  # the deployment's fields no flag replaced
                if getattr(args, k, None) is None and getattr(base, k) == v]
        if args.objective in (None, "default"):  # the family's own default, if any
            from models import family_of
            args.objective = getattr(family_of(args.system), "default_objective", "default")
        parse_objective(args.objective).check_metrics(args.system)
        if args.method == "screen" and not parse_objective(args.objective).capacity:
            raise ValueError(f"--method screen: the objective {args.objective!r} has no "
                             "rate ladder to screen on; give a capacity objective "
                             "(goodput_rps) or another --method")
        win = plan_windows(base, args.windows, args.window_requests)
        # the SLOs of the whole slice hold for every window and held-out seed
        whole = build_scenario(win.whole)
        if parse_objective(args.objective).capacity:
            whole.check_rate_ladder(parse_objective(args.objective).spec)
            grouped = shared_instants(whole)
            if grouped:
                warn(grouped)
        for w in whole.warnings:
            warn(w)
        slo = whole.slo
        # settings derived from the trace are derived once, for the whole slice: every
        # window and held-out seed runs with the SLOs and max_len of the whole
        pinned = {"ttft_slo_s": slo["ttft_s"], "tpot_slo_s": slo["tpot_s"]}
        if base.max_len is None:
            pinned["max_len"] = int(whole.cfg.max_len)
        win = win.replace_specs(**pinned)
        st = FitSettings(system=args.system, objective=args.objective, margin=args.margin,
                         budget=args.budget, lr=args.lr, crn=args.crn, explore=args.explore,
                         check_every=args.check_every, fd_scheme=args.fd_scheme,
                         checks=args.checks, check_dirs=args.check_dirs,
                         holdout_seeds=args.holdout_seeds, seed=base.seed)
        st.check()
        if state is not None:
            state["started"] = True  # every input and output path checked
        log(f"deployment {args.deployment}" + (f" (its {', '.join(kept)})" if kept else "")
            + ("" if args.system == dep.system else f", system {args.system} given"))
        # the held-out samples, and their batched programs compiled in a thread while
        # the search runs (shapes only: every policy at its system's defaults)
        from tuner.objective.validation import validation_jobs, validation_samples
        from tuner.objective.evaluate import compile_ahead

        baselines = tuple(get_system(args.system).baselines)
        held = validation_samples(win, args.holdout_seeds, args.whole_slice)
        ahead = in_thread(compile_ahead, validation_jobs(
            {"tuned": (args.system, {}), "default": (args.system, {}),
             **{b: (b, {}) for b in baselines}}, held)[1],
            objective=args.objective)
        log(f"fit {args.system} on {base.trace} ({args.method}): {win.note}; SLOs TTFT "
            f"{slo['ttft_s']:.3g} s, TPOT {slo['tpot_s']:.3g} s ({slo['ttft_source']})")
        bar = tqdm(total=args.evals if search else args.budget,
                   desc=args.method if search else "fit", file=sys.stderr,
                   disable=args.quiet)
        bar.refresh()  # shown now, before the problem compiles
        exact = []  # every exact evaluation of the training problem

        def count(cost, theta, v):
            exact.append(v)
        grid = None
        if search:
            def progress(n_done, best):
                bar.set_postfix({"best exact": f"{best:.4g}"})
                bar.n = n_done
                bar.refresh()

            from tuner.search.engine_grid import GRID_NOTE

            if args.method == "screen":  # the grid goes into the pool, not the budget
                grid = None if args.no_grid else _grid(
                    args.system, whole, args.pool, log, f"--pool {args.pool}")
                res = screen_fit(list(win.train), st, args.evals, pool=args.pool,
                                 log=log, progress=progress, listeners=[count],
                                 warn=warn, first=grid, first_note=GRID_NOTE)
            else:
                grid = None if args.no_grid else _grid(
                    args.system, whole, args.evals - 1, log,
                    f"--evals {args.evals} (the start point first)")
                res = search_fit(list(win.train), st, args.method, args.evals, log=log,
                                 progress=progress, listeners=[count], warn=warn,
                                 first=grid, first_note=GRID_NOTE)
        else:
            last = {}

            def progress(rec):
                last.update(rec)
                post = {"T": f"{rec['temperature']:.3g}",
                        "relaxed": f"{rec['relaxed']:.4g}"}
                if "exact" in last:
                    post["exact"] = f"{last['exact']:.4g}"
                bar.set_postfix(post)
                bar.n = rec["step"]
                bar.refresh()

            res = fit(list(win.train), st, checkpoint=ckpt, resume=args.resume, log=log,
                      progress=progress, listeners=[count], warn=warn)
        bar.close()
        from tuner.objective.validation import validate, verdict

        ahead.join()
        policies = {"tuned": (args.system, res.params),
                    "default": (args.system, res.default_params),
                    **{b: (b, {}) for b in baselines}}
        log(f"validating in exact mode: {len(win.holdout)} held-out window(s) x "
            f"{args.holdout_seeds} held-out seed(s)"
            + (", then the whole slice" if args.whole_slice else ""))
        mets = validate(args.system, policies, args.objective, win, args.holdout_seeds,
                        log=log, whole_slice=args.whole_slice,
                        hints=_hints(args.objective, res, baselines), prepared=held)
        ver = verdict(mets, args.objective, baselines)
    except (ValueError, OSError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"objective {parse_objective(args.objective).spec}, held-out mean [95% interval]:")
    print("\n".join(_table(mets, list(policies), args.objective)))
    if args.whole_slice:
        per = ", ".join(f"{n} {mets[n]['whole_trace']['objective']:.4g}" for n in policies)
        print(f"whole slice ({win.whole.n_requests} requests, in-sample): {per}")
    screens = sum(h.get("fidelity") == "screen" for h in res.history)
    print(f"tuner: {args.method}, {len(exact)} exact evaluations of the training "
          "problem in this run" + (
              f", besides {screens} screens (all evaluations together cost "
              f"{res.cost / max(res.unit, 1):.3g} exact evaluations)" if screens else ""))
    print("tuned params: " + ", ".join(f"{k}={v}" for k, v in res.params.items()))
    if mets["tuned"].get("sample_note"):
        print(f"held-out samples: {mets['tuned']['sample_note']}")
    print(f"verdict ({ver['outcome']}): {ver['sentence']}")
    if ver["outcome"] in EXIT_CODES and not args.export_anyway:
        return EXIT_CODES[ver["outcome"]]
    from tuner.export.deployment import describe, write_measure_kit
    from tuner.export.policy import make_policy

    sc = build_scenario(win.whole)  # its SLOs pinned: the scenario the policy names
    from tuner.common.provenance import provenance

    prov = provenance(_command(argv))
    if provenance_out is not None:
        provenance_out.update(prov)
    doc = make_policy(
        system=args.system, params=res.params, scenario=win.whole,
        workload={"fingerprint": sc.fingerprint, "summary": sc.summary,
                  "predictions": sc.prediction_source, "windows": win.note,
                  "train": [[w.offset, w.offset + w.n_requests] for w in win.train],
                  "holdout": [[w.offset, w.offset + w.n_requests] for w in win.holdout]},
        metrics={"tuned": mets["tuned"], "default": mets["default"],
                 "baselines": {b: mets[b] for b in baselines},
                 "baseline": mets[ver["best_baseline"]] if baselines else mets["default"]},
        objective=parse_objective(args.objective).spec,
        tuner={"method": args.method, "evals": args.evals if search else None,
               "pool": args.pool if args.method == "screen" else None,
               "first_generation": "auto_tune grid" if search and grid else None,
               "settings": st.to_dict(), "estimators": res.estimators,
               "temperature_floor": res.floor, "steps": res.steps,
               "train_objective": res.train_objective, "rates_rps": res.rates,
               "simulated_request_iterations": res.cost, "history": res.history,
               "best_exact_train": res.best_exact},
        seed=base.seed, slo=slo,
        deployment=describe(sc, args.system, res.params, policy_path=out),
        verdict=ver, provenance=prov, wall_s=round(time.perf_counter() - t0, 3))
    print(f"fit wall time {doc['wall_s']:.1f} s; {_programs(args)}")
    why = _write_outputs(sc, out, doc, write_measure_kit)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    ckpt.unlink(missing_ok=True)
    print(f"wrote {out}" + (" (--export-anyway: the verdict above stands)"
                            if ver["outcome"] in EXIT_CODES else ""))
    return 0


def _write_outputs(sc, out: Path, doc: dict, write_kit) -> str | None:
    """Write the measurement kit's dataset (what the printed bench command reads) and
    then the policy; None, or one line naming the file that could not be written (the
    kit is removed again then: all or nothing). The checks before the work make this
    rare (a full disk, a folder removed meanwhile)."""
    kit, what = {}, "the measurement kit's dataset beside it"
    try:
        kit = write_kit(sc, out, formats=("custom",))
        what = "the policy"
        write_json_atomic(out, doc)
    except OSError as e:
        for p in kit.values():
            Path(p).unlink(missing_ok=True)
        return f"--out {out}: writing {what} failed ({e.strerror or e}); nothing written"
    return None


if __name__ == "__main__":
    sys.exit(main())
