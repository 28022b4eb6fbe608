"""Calibration against real vLLM benchmark runs, by gradient and by CMA-ES.

``python -m experiments.calibrate_check --out DIR [--files a100,h100] [--budget 200]
[--model M]``

The runs are ``../shared/reference/vllm-bench/`` (vLLM 0.10.1.1, Qwen/Qwen3-8B on one
GPU, 200 ShareGPT prompts, chunked prefill, 8,192 batched tokens, 256 sequences): A100
at 2.5 req/s, H100 at 4 req/s. Each is replayed at its own send times on the paged
server with the engine settings of its manifest; the step-time model
(``tuner.calibration.DEFAULT_FIT``) is fitted to the first 70% of its requests' TTFTs
and the file's TPOT p50/p99 (the copies carry no per-request ``itls``), and the last
30% of the TTFTs are predicted, not fitted. Reported per file: TTFT p50/p90/p99 and
TPOT p50/p99 measured, before (the device preset) and after (its own profile), each
marked within 10% or not; the fit's cost (exact simulations, seconds) beside CMA-ES on
the same loss (evaluations and seconds to reach the gradient fit's loss within 1%).

Writes ``DIR/calibrate_check.json``, ``DIR/calibrate_check.md`` and the two profiles
``DIR/<name>.profile.json`` atomically; progress on stderr; exit 2 on bad arguments.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # progress from the first second (JAX loads below)
    print("experiments.calibrate_check: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from tuner.calibration import roofline_fit as cal  # noqa: E402
from tuner.common.atomic import plain, write_json_atomic, write_text_atomic  # noqa: E402
from experiments.results_io import provenance, stamp_markdown, stamped  # noqa: E402
from tuner.calibration.measured import SYSTEM, compare, measured_target, spec_for  # noqa: E402
from tuner.scenario import ScenarioSpec, build_scenario  # noqa: E402
from tuner.workloads.presets import traces_dir  # noqa: E402

__all__ = ["FILES", "TOLERANCE", "HOLDOUT", "run_file", "render", "main"]

TOLERANCE = 0.10  # the target: each metric within 10% after calibration
HOLDOUT = 0.3
# name -> (file under ../shared/reference/vllm-bench, device preset)
FILES = {"a100": ("a100-qwen3-8b-r2.5.json", "a100-80gb"),
         "h100": ("h100-qwen3-8b-r4.json", "h100-80gb")}


def bench_dir() -> Path:
    return traces_dir().parent / "reference" / "vllm-bench"


def _reach(history, target):
    """(exact runs, seconds) at which a fit's best loss first fell to ``target``."""
    for runs, secs, loss in history:
        if loss <= target:
            return runs, secs
    return None, None


def run_file(name: str, *, model: str | None = None, budget: int = 200,
             starts: int = 8, cma: bool = True) -> dict:
    fname, device = FILES[name]
    path = bench_dir() / fname
    given = {"model"} if model else set()
    base = ScenarioSpec(hardware=device, model=model or ScenarioSpec().model)
    spec, meas = spec_for(str(path), base, given)
    sc = build_scenario(spec)
    target = measured_target(meas, HOLDOUT, True)
    pairs = [(sc, target)]
    print(f"experiments.calibrate_check: {name}: gradient fit", file=sys.stderr, flush=True)
    res = cal.fit(pairs, system=SYSTEM, starts=starts)
    before = cal.current(sc.hw)
    parts = {"all": np.ones(sc.workload.size, bool), "fit": target.fit_mask,
             "heldout": ~target.fit_mask}
    out = {"file": fname, "device": device, "model": sc.deployment.model.name,
           "n_requests": int(sc.workload.size), "engine": meas.engine,
           "scheduler": spec.scheduler, "max_num_batched_tokens": spec.max_prefill,
           "max_num_seqs": spec.max_batch, "capacity_tokens": float(sc.cfg.capacity_tokens),
           "params_before": before, "params_after": res.params, "fitted": list(res.fitted),
           "metrics": {p: {"before": compare(sc, meas, before, m),
                           "after": compare(sc, meas, res.params, m)}
                       for p, m in parts.items()},
           "gradient": {"loss_start": res.loss_start, "loss": res.loss,
                        "exact_runs": res.exact_runs, "gradient_steps": res.gradient_steps,
                        "seconds": res.seconds, "rounds": res.rounds}}
    if cma:
        print(f"experiments.calibrate_check: {name}: CMA-ES, up to {budget} evaluations",
              file=sys.stderr, flush=True)
        bb = cal.fit_cma(pairs, system=SYSTEM, budget=budget, seed=0)
        goal = res.loss * 1.01
        runs, secs = _reach(bb.history, goal)
        out["cma"] = {"loss": bb.loss, "evaluations": bb.exact_runs, "seconds": bb.seconds,
                      "evaluations_to_gradient_loss": runs,
                      "seconds_to_gradient_loss": secs, "params": bb.params}
    return out


def _ok(err):
    return math.isfinite(err) and abs(err) <= TOLERANCE


def render(res: dict) -> str:
    lines = ["# Calibration against real vLLM benchmark runs", "",
             "Step-time model fitted by gradient to each run (first 70% of the TTFTs, "
             "the file's TPOT p50/p99), the last 30% of the TTFTs predicted. Errors are "
             "(simulated - measured) / measured; ✓ within 10%.", ""]
    for name, r in res["files"].items():
        lines += [f"## {name}: {r['file']} on {r['device']} (model preset {r['model']})",
                  "", f"{r['n_requests']} requests, scheduler {r['scheduler']}, "
                  f"{r['max_num_batched_tokens']} batched tokens, {r['max_num_seqs']} "
                  f"sequences, KV capacity {r['capacity_tokens']:,.0f} tokens.", "",
                  "| requests | metric | measured | before | after | error before | "
                  "error after |", "|---|---|---|---|---|---|---|"]
        for part in ("all", "fit", "heldout"):
            b, a = r["metrics"][part]["before"], r["metrics"][part]["after"]
            for k in cal.METRICS:
                m = a[f"{k}_measured"]
                if not math.isfinite(m):
                    continue
                eb, ea = b[f"{k}_rel_error"], a[f"{k}_rel_error"]
                lines.append(f"| {part} | {k} | {1e3 * m:.2f} ms | "
                             f"{1e3 * b[k + '_predicted']:.2f} ms | "
                             f"{1e3 * a[k + '_predicted']:.2f} ms | {100 * eb:+.1f}% | "
                             f"{100 * ea:+.1f}% {'✓' if _ok(ea) else '✗'} |")
        lines += ["", "| parameter | preset | calibrated |", "|---|---|---|"]
        for k in r["fitted"]:
            lines.append(f"| {k} | {r['params_before'][k]:.4g} | "
                         f"{r['params_after'][k]:.4g} |")
        g = r["gradient"]
        lines += ["", f"Gradient fit: loss {g['loss_start']:.4g} -> {g['loss']:.4g}, "
                  f"{g['exact_runs']} exact simulations, {g['gradient_steps']} Adam steps "
                  f"on schedules, {g['seconds']:.1f} s."]
        if "cma" in r:
            c = r["cma"]
            reach = (f"reached the gradient fit's loss (+1%) after "
                     f"{c['evaluations_to_gradient_loss']} evaluations, "
                     f"{c['seconds_to_gradient_loss']:.1f} s"
                     if c["evaluations_to_gradient_loss"] else
                     "did not reach the gradient fit's loss (+1%)")
            lines.append(f"CMA-ES on the same loss: best {c['loss']:.4g} in "
                         f"{c['evaluations']} evaluations, {c['seconds']:.1f} s; {reach}.")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.calibrate_check",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--files", default=",".join(FILES))
    ap.add_argument("--model", default=None,
                    help="model preset (default: the files' own model id)")
    ap.add_argument("--budget", type=int, default=200, help="CMA-ES evaluations")
    ap.add_argument("--starts", type=int, default=8)
    ap.add_argument("--no-cma", action="store_true")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.files.split(",") if n.strip()]
    bad = [n for n in names if n not in FILES]
    if bad or not names:
        print(f"experiments.calibrate_check: error: --files: unknown {bad}; known: "
              f"{', '.join(FILES)}", file=sys.stderr)
        return 2
    if args.out.exists() and not args.out.is_dir():
        print(f"experiments.calibrate_check: error: --out {args.out} is not a directory",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"tolerance": TOLERANCE, "holdout": HOLDOUT, "files": {}}
    for n in names:
        r = run_file(n, model=args.model, budget=args.budget, starts=args.starts,
                     cma=not args.no_cma)
        res["files"][n] = r
        write_json_atomic(args.out / f"{n}.profile.json", plain({
            "format": cal.PROFILE_FORMAT, "device": r["device"], "model": r["model"],
            "params": r["params_after"], "calibrated_from": r["file"],
            "provenance": provenance()}))
    res = stamped(res)
    write_json_atomic(args.out / "calibrate_check.json", plain(res))
    write_text_atomic(args.out / "calibrate_check.md",
                      stamp_markdown(render(res), res["provenance"]))
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
