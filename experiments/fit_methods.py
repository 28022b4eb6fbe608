"""Which tuner should ``tuner.fit`` use by default? Every candidate on the built-in
deployment under several workload seeds, each run as the operator runs it.

``python3 -m experiments.fit_methods --out experiments/results/fit_methods`` runs

    python3 -m tuner.fit --export-anyway --seed S <METHOD ARGS> --out DIR/runs/...

for every method of :data:`METHODS` and every seed (``--seeds``; a seed draws the
Poisson arrivals of the whole slice, so the training and held-out windows differ from
seed to seed), as child processes sharing one JAX compilation cache (warmed by the
first run, so wall times after it are warm). Each fit validates its own tuned policy,
vLLM's defaults and the baselines on its held-out (window, seed) samples; those are
the same samples for every method under one seed, so methods are compared paired,
pooled over the seeds: each method minus the defaults and minus ``gradient`` (the
fit's tuner before this experiment; the built-in deployment's tuner is chosen from
this table: ``tuner.scenario.deployments`` records which, and why). It writes
``DIR/fit_methods.json`` and ``DIR/fit_methods.md`` (held-out goodput, paired
intervals, exact evaluations and wall time per method); the fits' own policy files and
logs stay under ``DIR/runs/`` (not committed: ``--keep-runs`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments.results_io import stamp_markdown, stamped
from tuner.common.atomic import unwritable_reason, write_json_atomic, write_text_atomic
from tuner.objective.validation import compare_paired, resolution

__all__ = ["METHODS", "run_one", "summarise", "render", "main"]

# method name -> tuner.fit arguments (the deployment's own scenario otherwise)
METHODS = {
    "gradient": ("--method", "gradient"),  # the fit's default before this experiment
    "hybrid": ("--method", "hybrid"),
    "explore16-descend4": ("--method", "hybrid", "--explore", "16", "--budget", "4"),
    "random16": ("--method", "random", "--evals", "16"),
    # its first generation vLLM's auto_tune grid (tuner.fit's default on vllm-v1) ...
    "cmaes24": ("--method", "cmaes", "--evals", "24"),
    # ... and without it (what the grid adds)
    "cmaes24-nogrid": ("--method", "cmaes", "--evals", "24", "--no-grid"),
    # 32 candidates (the grid and 24 uniform samples) screened by their SLO attainment
    # at the start's goodput, the start and the best 4 in full (tuner.search.screen)
    "screen32": ("--method", "screen", "--evals", "5", "--pool", "32"),
    # ... and half of it: 16 candidates, the start and the best 2 in full
    "screen16": ("--method", "screen", "--evals", "3", "--pool", "16"),
}
EVALS_RE = re.compile(r"(\d+) exact evaluations of the training problem")
# a screened search's line goes on: its screens and their cost with the evaluations
SCREENS_RE = re.compile(r"besides (\d+) screens \(all evaluations together cost "
                        r"([0-9.e+]+) exact evaluations\)")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_one(method: str, seed: int, runs: Path, cache: str) -> dict:
    """One fit as a child process; its held-out samples, verdict, cost and wall time."""
    d = runs / f"seed{seed}-{method}"
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tuner.fit", "--export-anyway", "--seed", str(seed),
           *METHODS[method], "--out", str(d / "policy.json"), "--log", str(d / "fit.log"),
           "--quiet"]
    env = dict(os.environ, KVTUNE_JAX_CACHE=cache)
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd[1:])} exited {p.returncode}: "
                         f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    pol = json.loads((d / "policy.json").read_text())
    text = (d / "fit.log").read_text()
    m, sc = EVALS_RE.search(text), SCREENS_RE.search(text)
    met = pol["metrics"]
    return {"method": method, "seed": seed, "wall_s": wall,
            "exact_evals": int(m.group(1)) if m else None,
            "screens": int(sc.group(1)) if sc else 0,
            "eval_equivalents": float(sc.group(2)) if sc else None,
            "tuned": [float(x) for x in met["tuned"]["objective_per_sample"]],
            "default": [float(x) for x in met["default"]["objective_per_sample"]],
            "baselines": {k: [float(x) for x in v["objective_per_sample"]]
                          for k, v in met["baselines"].items()},
            "outcome": pol["verdict"]["outcome"],
            "rel_tol": resolution(pol["objective"]),
            # what the child ran (tuner.fit's modules): part of this result's fingerprint
            "sources": sorted(pol["provenance"]["sources"]["files"]),
            "params": {k: float(v) for k, v in pol["params"].items()
                       if isinstance(v, (int, float))}}


def summarise(rows: list[dict]) -> dict:
    """Per method: held-out mean goodput, paired differences to the defaults and to
    ``gradient`` pooled over seeds, mean exact evaluations and wall time."""
    out = {}
    by = {}
    for r in rows:
        by.setdefault(r["method"], {})[r["seed"]] = r
    grad = by.get("gradient", {})
    for method, per in by.items():
        seeds = sorted(per)
        tuned = [x for s in seeds for x in per[s]["tuned"]]
        default = [x for s in seeds for x in per[s]["default"]]
        row = {"seeds": seeds, "held_out_mean": float(np.mean(tuned)),
               "default_mean": float(np.mean(default)), "samples": len(tuned),
               "vs_default": compare_paired(tuned, default, per[seeds[0]].get("rel_tol", 0.0)),
               "per_seed_mean": {str(s): float(np.mean(per[s]["tuned"])) for s in seeds},
               "exact_evals_mean": float(np.mean([per[s]["exact_evals"] or 0
                                                  for s in seeds])),
               "screens_mean": float(np.mean([per[s].get("screens", 0) for s in seeds])),
               "eval_equivalents_mean": (
                   float(np.mean([per[s]["eval_equivalents"] for s in seeds]))
                   if all(per[s].get("eval_equivalents") for s in seeds) else None),
               "wall_s_median": float(np.median([per[s]["wall_s"] for s in seeds])),
               "wins": sum(per[s]["outcome"] == "win" for s in seeds)}
        common = [s for s in seeds if s in grad]
        if method != "gradient" and common:
            row["vs_gradient"] = compare_paired(
                [x for s in common for x in per[s]["tuned"]],
                [x for s in common for x in grad[s]["tuned"]], per[common[0]].get("rel_tol", 0.0))
        out[method] = row
    return out


def _cmp(c: dict | None) -> str:
    if not c:
        return "-"
    if c.get("ci") is None:
        return f"{c['relative']:+.1%} undetermined"
    return f"{c['relative']:+.1%} [{c['ci'][0]:.3g}, {c['ci'][1]:.3g}] {c['status']}"


def _evals(row: dict) -> str:
    out = f"{row['exact_evals_mean']:.0f}"
    if row.get("screens_mean"):
        out += (f" + {row['screens_mean']:.0f} screens (cost "
                f"{row['eval_equivalents_mean']:.3g})")
    return out


def render(res: dict) -> str:
    L = ["# Which tuner should the fit use by default",
         "",
         f"`tuner.fit` on its built-in deployment ({res['deployment']}), seeds "
         f"{', '.join(map(str, res['seeds']))} (each seed draws the slice's Poisson "
         "arrivals, so every seed is a different workload); every method validated on "
         "the same held-out (window, seed) samples per seed, pooled over the seeds. "
         "Goodput in req/s; paired differences with 95% intervals.",
         "",
         "| method | tuner.fit arguments | held-out goodput | per seed | vs vLLM defaults "
         "| vs `gradient` | wins | exact evals (mean) | wall s (median) |",
         "|---|---|---:|---|---|---|---:|---:|---:|"]
    for m, row in res["summary"].items():
        args = " ".join(METHODS.get(m, ())) or "(defaults)"
        per = " / ".join(f"{v:.2f}" for v in row["per_seed_mean"].values())
        L.append(f"| {m} | `{args}` | {row['held_out_mean']:.3f} | {per} | "
                 f"{_cmp(row['vs_default'])} | {_cmp(row.get('vs_gradient'))} | "
                 f"{row['wins']}/{len(row['seeds'])} | {_evals(row)} | "
                 f"{row['wall_s_median']:.0f} |")
    first = next(iter(res["summary"].values()))
    L += ["", f"vLLM defaults' held-out goodput: {first['default_mean']:.3f} (the same "
          "samples for every method). Wins: the fit's own verdict "
          "(`win`: beats the defaults and every baseline on its held-out samples). "
          "Exact evals: exact evaluations of the training problem the fit reports (a "
          "screened search: besides its screens, with what all of them cost in exact "
          "evaluations). "
          "Wall: whole process, a shared warm compilation cache after the first run "
          "(the first run of the table compiles).", ""]
    L += ["Tuned parameters per run:", ""]
    for r in res["runs"]:
        ps = ", ".join(f"{k} {v:g}" for k, v in sorted(r["params"].items()))
        L.append(f"- seed {r['seed']}, {r['method']}: {ps}")
    return "\n".join(L) + "\n"


def _write(out: Path, res: dict) -> None:
    """``fit_methods.json`` / ``.md`` stamped with a provenance whose fingerprint also
    covers every source file the child fits loaded (``tuner.fit`` runs in a child
    process, so this process alone would leave its modules out)."""
    from tuner.common.provenance import provenance

    files = sorted({f for r in res["runs"] for f in r.get("sources", ())})
    doc = stamped(res, provenance(extra=tuple(files)))
    write_json_atomic(out / "fit_methods.json", doc, sort_keys=False)
    write_text_atomic(out / "fit_methods.md", stamp_markdown(render(res),
                                                             doc["provenance"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.fit_methods",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="result folder")
    ap.add_argument("--seeds", default="0,1,2", help="workload seeds (default 0,1,2)")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help=f"comma-separated subset of {', '.join(METHODS)}")
    ap.add_argument("--keep-runs", action="store_true",
                    help="keep the fits' policy files and logs under OUT/runs")
    args = ap.parse_args(argv)
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        print(f"error: --seeds {args.seeds!r}: needs distinct comma-separated integers "
              ">= 0", file=sys.stderr)
        return 2
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        print(f"error: --methods: unknown {bad or 'empty'}; methods: {', '.join(METHODS)}",
              file=sys.stderr)
        return 2
    why = unwritable_reason(args.out)
    if why:
        print(f"error: --out {args.out}: {why}", file=sys.stderr)
        return 2
    from tuner.scenario.deployments import DEFAULT

    runs_dir = Path(args.out) / "runs"
    cache = tempfile.mkdtemp(prefix="kvtune-fit-methods-")
    rows = []
    res = {"deployment": DEFAULT, "seeds": seeds, "methods": methods,
           "arguments": {m: list(METHODS[m]) for m in methods}}
    try:
        total = len(seeds) * len(methods)
        for s in seeds:
            for m in methods:
                _log(f"[{len(rows) + 1}/{total}] seed {s}, {m}: tuner.fit "
                     f"{' '.join(METHODS[m]) or '(defaults)'}")
                rows.append(run_one(m, s, runs_dir, cache))
                r = rows[-1]
                _log(f"  held-out {np.mean(r['tuned']):.3f} req/s (defaults "
                     f"{np.mean(r['default']):.3f}), {r['exact_evals']} exact evals, "
                     f"{r['wall_s']:.0f} s, verdict {r['outcome']}")
                res.update(runs=rows, summary=summarise(rows))
                _write(Path(args.out), res)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if not args.keep_runs:
            shutil.rmtree(runs_dir, ignore_errors=True)
    print((Path(args.out) / "fit_methods.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
