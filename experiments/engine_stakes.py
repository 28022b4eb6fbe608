"""Engine stakes: do vLLM's own engine arguments decide goodput on a deployment?

``python -m experiments.engine_stakes --out DIR [--cases a,b] [--seqs 32,64,...]
[--tokens 512,...] [--utils 0.9,0.95] [--slots 512] [--realisations 2] [--quick]``

Issue 31's stakes criterion (best / worst goodput >= 1.5 and best / default >= 1.1,
measured before any tuning) applied to the settings operators of vLLM already choose
(issue 34): a grid over ``max_num_seqs`` x ``max_num_batched_tokens`` x
``gpu_memory_utilization``, as vLLM's ``benchmarks/auto_tune`` sweeps them, on the V1
engine (chunked prefill, :data:`tuner.scenario.build.SCHEDULERS` ``"chunked"``) with
paged KV. Every setting is a parameter set of the ``vllm-v1`` system
(``models.bucketed.engine``) on the same scenarios: its KV capacity is what vLLM's
memory profile (``hardware.memory_profile``) leaves after the weights and the profiling
run's activation peak at that token budget and row count; a setting vLLM would refuse
at start-up (the system's ``refusal``) is listed with vLLM's reason and not run.

The default is vLLM V1's own (the system's default: ``vllm_defaults`` for the device,
the OpenAI server; ``gpu_memory_utilization`` 0.9). The simulator's slot table
(``--slots``) bounds the running requests: a ``max_num_seqs`` above it (vLLM's 1024 on
an H100) runs at most ``--slots`` at once, said in the result. Every setting is scored
exactly (``tuner.objective.evaluate.evaluate_many``, batched) on the same
``--realisations`` workload realisations by both goodputs: ``goodput_rps`` (a count of
requests meeting both SLOs) and ``goodput_expected_rps`` (each request's probability of
meeting them under lognormal latency noise). Nothing is tuned: the grid is measured.

Writes ``engine_stakes.json`` and ``engine_stakes.md`` (atomically, again after every
case) to ``--out``; progress goes to stderr. Exit 0: every case ran; 2: bad arguments.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # progress from the first second: the imports take ~2 s
    print("experiments.engine_stakes: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import itertools  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from experiments.results_io import pick_cases, positive_ints, write_result  # noqa: E402
from experiments.stakes import (BEST_OVER_DEFAULT, BEST_OVER_WORST, judge,  # noqa: E402
                                summary_line)
from tuner.common import compile_cache  # noqa: E402
from tuner.common.atomic import unwritable_reason  # noqa: E402

__all__ = ["CASES", "main", "render", "run_case"]

N = 1000
SLO_SCALE = 5.0   # SLOs at 5x the uncontended TTFT / TPOT unless a case gives them
#                   (eLLM's 25x binds nothing here)
SEQS = (32, 64, 128, 256, 512)
TOKENS = (512, 1024, 2048, 4096, 8192)
UTILS = (0.9, 0.95)
SLOTS = 512
SYSTEM = "vllm-v1"  # models.bucketed.engine: the engine arguments are its parameters
# (name, ScenarioSpec fields, one-line description, gpu_memory_utilization values: only
# where the KV binds does the KV capacity they move matter)
CASES = (
    ("h100-sharegpt", dict(trace="sharegpt", hardware="h100-80gb", model="qwen3-8b", tp=1),
     "ShareGPT lengths (Poisson arrivals), Qwen3-8B on one H100 80GB; SLOs 5x the "
     "uncontended TTFT / TPOT", (0.9,)),
    ("h100-sharegpt-tpot20", dict(trace="sharegpt", hardware="h100-80gb", model="qwen3-8b",
                                  tp=1, ttft_slo_s=1.0, tpot_slo_s=0.02),
     "the same with an interactive SLO: TTFT 1 s, TPOT 20 ms (50 tokens/s per user, "
     "about 2x the uncontended TPOT)", (0.9,)),
    ("a100-40gb-sharegpt", dict(trace="sharegpt", hardware="a100-40gb", model="qwen3-8b",
                                tp=1),
     "ShareGPT lengths (Poisson arrivals), Qwen3-8B on one A100 40GB: what the "
     "weights leave of 40 GB holds the KV; SLOs 5x the uncontended TTFT / TPOT", UTILS),
)
QUICK = dict(n_requests=120)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _setting(seqs, tokens, util, default: dict) -> dict:
    """One grid setting: the grid's three arguments, every other one (block size, the
    long-prefill threshold: off, vLLM's 0) at the system's default."""
    return {**{k: float(v) for k, v in default.items()},
            "max_num_seqs": float(seqs), "max_num_batched_tokens": float(tokens),
            "gpu_memory_utilization": float(util)}


def run_case(name: str, fields: dict, grid: list, realisations: int, slots: int,
             quick: bool) -> dict:
    """Every setting of ``grid`` ((max_num_seqs, max_num_batched_tokens,
    gpu_memory_utilization) tuples) as parameters of the ``vllm-v1`` system on the
    case's scenarios, vLLM's own default first; refused settings listed, not run."""
    from hardware import VllmRefusal
    from models import get_system
    from tuner.export.deployment import engine_scenario
    from tuner.objective.evaluate import evaluate_many
    from tuner.scenario import ScenarioSpec, build_scenario

    base = {"n_requests": N, "scheduler": "chunked", "n_slots": slots,
            "max_batch": slots, "slo_scale": SLO_SCALE, **fields,
            **(QUICK if quick else {})}
    spec = ScenarioSpec(**base)
    scs = tuple(build_scenario(spec.replace(seed=s)) for s in range(realisations))
    sc = scs[0]
    system = get_system(SYSTEM)
    d = system.default_params(sc.cfg.max_len, sc.hw, sc.deployment)
    default = (int(d["max_num_seqs"]), int(d["max_num_batched_tokens"]),
               round(float(d["gpu_memory_utilization"]), 6))
    settings = [default] + [s for s in grid if s != default]
    jobs, rows, refused = [], [], []
    for seqs, tokens, util in settings:
        p = _setting(seqs, tokens, util, d)
        row = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens,
               "gpu_memory_utilization": util}
        why = system.refusal(sc.deployment, p)
        if why is not None:
            refused.append({**row, "field": why[0], "reason": why[1]})
            continue
        try:
            cap = float(engine_scenario(sc, p).cfg.capacity_tokens)
        except VllmRefusal as e:  # never: refusal() runs the same profile
            raise AssertionError(f"{name}: {row}: {e}") from e
        jobs.append((scs, SYSTEM, p))
        rows.append({**row, "kv_capacity_tokens": cap})
    if not rows or (rows[0]["max_num_seqs"], rows[0]["max_num_batched_tokens"],
                    rows[0]["gpu_memory_utilization"]) != default:
        raise SystemExit(f"{name}: vLLM would refuse its own default setting")
    _log(f"{name}: {len(jobs)} settings x {realisations} realisation(s), "
         f"{int(np.sum(sc.workload.valid))} requests each; {len(refused)} refused")
    t = time.perf_counter()
    res = evaluate_many(jobs, objective="goodput_expected_rps", log=_log)
    wall = time.perf_counter() - t
    for row, m in zip(rows, res):
        row["goodput_rps"] = float(m["goodput_rps"])
        row["goodput_expected_rps"] = float(m["goodput_expected_rps"])
    out = {"spec": {**base, "realisations": realisations}, "requests": int(np.sum(
        sc.workload.valid)), "slo_s": [float(sc.cfg.ttft_slo_s), float(sc.cfg.tpot_slo_s)],
        "default": {"max_num_seqs": default[0], "max_num_batched_tokens": default[1],
                    "gpu_memory_utilization": default[2],
                    "running_at_most": min(default[0], slots)},
        "settings": rows, "refused": refused, "wall_s": wall,
        "runs": sum(int(m["capacity"]["runs"]) for m in res) * realisations}
    for metric in ("goodput_rps", "goodput_expected_rps"):
        vals = [r[metric] for r in rows]
        # the grid's other settings are the sample (the default may be the worst too)
        out[metric] = {**judge(vals[0], vals[1:] or vals[:1]),
                       "best_setting": dict(rows[int(np.argmax(vals))])}
    _log(summary_line(name, wall, out["goodput_expected_rps"]))
    return out


def render(res: dict) -> str:
    L = ["# Engine stakes: do vLLM's engine arguments decide goodput?", "",
         f"vLLM V1 (chunked prefill, paged KV), a grid of max_num_seqs x "
         "max_num_batched_tokens x gpu_memory_utilization (vLLM auto_tune's knobs), each "
         f"setting with the KV capacity vLLM's memory profile leaves, on "
         f"{res['realisations']} workload realisation(s), exact runs to completion"
         + (" (quick run: small slices)" if res["quick"] else "") + ". Criterion "
         f"(issue 31): best / worst >= {BEST_OVER_WORST} and best / default >= "
         f"{BEST_OVER_DEFAULT}; the default is vLLM V1's own for the device.", "",
         "| case | goodput | default (seqs / tokens / util) | default | worst | best | "
         "best setting | best / worst | best / default | meets |",
         "|---|---|---|---:|---:|---:|---|---:|---:|---|"]
    for name, c in res["cases"].items():
        d = c["default"]
        cut = d["running_at_most"] < d["max_num_seqs"]
        ds = (f"{d['max_num_seqs']}{'*' if cut else ''} / "
              f"{d['max_num_batched_tokens']} / {d['gpu_memory_utilization']:g}")
        for metric in ("goodput_rps", "goodput_expected_rps"):
            r = c[metric]
            b = r["best_setting"]
            bs = (f"{b['max_num_seqs']} / {b['max_num_batched_tokens']} / "
                  f"{b['gpu_memory_utilization']:g}")
            L.append(f"| {name} | {metric} | {ds} | {r['default']:.3f} | "
                     f"{r['worst']:.3f} | {r['best']:.3f} | {bs} | "
                     f"{r['best_over_worst']:.2f} | {r['best_over_default']:.2f} | "
                     f"{'yes' if r['meets'] else 'no'} |")
    L += ["", "Goodputs in req/s. `*`: more than the simulator's slot table (--slots), "
          "which bounds the running requests; the memory profile sees the setting "
          "itself.", ""]
    for name, c in res["cases"].items():
        L += [f"## {name}", "", f"{c['description']}; {c['requests']} requests; SLOs "
              f"TTFT {c['slo_s'][0]:.3f} s, TPOT {c['slo_s'][1] * 1e3:.1f} ms; "
              f"{c['wall_s']:.0f} s, {c['runs']} runs to completion.", "",
              "| max_num_seqs | max_num_batched_tokens | gpu_memory_utilization | KV "
              "tokens | goodput_rps | goodput_expected_rps |", "|---:|---:|---:|---:|---:|---:|"]
        for r in c["settings"]:
            L.append(f"| {r['max_num_seqs']} | {r['max_num_batched_tokens']} | "
                     f"{r['gpu_memory_utilization']:g} | {r['kv_capacity_tokens']:.0f} | "
                     f"{r['goodput_rps']:.3f} | {r['goodput_expected_rps']:.3f} |")
        for r in c["refused"]:
            L.append(f"| {r['max_num_seqs']} | {r['max_num_batched_tokens']} | "
                     f"{r['gpu_memory_utilization']:g} | refused: {r['reason']} | | |")
        L.append("")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.engine_stakes",
                                 description=__doc__.split("\n\n")[1])
    ap.add_argument("--out", type=Path, required=True, help="result folder")
    ap.add_argument("--cases", default=",".join(c[0] for c in CASES),
                    help="comma-separated case names (default: all)")
    ap.add_argument("--seqs", default=",".join(map(str, SEQS)), help="max_num_seqs values")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)),
                    help="max_num_batched_tokens values")
    ap.add_argument("--utils", default=None,
                    help="gpu_memory_utilization values in (0, 1] (default: each case's)")
    ap.add_argument("--slots", type=int, default=SLOTS,
                    help="the simulator's slot table (max_num_seqs above it is cut)")
    ap.add_argument("--realisations", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small slices (a test)")
    args = ap.parse_args(argv)
    known = {c[0]: c for c in CASES}
    try:
        names = pick_cases(args.cases, known)
        seqs = positive_ints("--seqs", args.seqs)
        tokens = positive_ints("--tokens", args.tokens)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        utils = None if args.utils is None else [
            float(x) for x in args.utils.split(",") if x.strip()]
    except ValueError:
        print(f"error: --utils {args.utils!r}: not a comma-separated list of numbers",
              file=sys.stderr)
        return 2
    if utils is not None and not (utils and all(0 < u <= 1 for u in utils)):
        print(f"error: --utils {args.utils!r}: values must be in (0, 1]", file=sys.stderr)
        return 2
    for flag, v in (("--realisations", args.realisations), ("--slots", args.slots)):
        if v < 1:
            print(f"error: {flag} {v}: must be >= 1", file=sys.stderr)
            return 2
    if max(seqs) > args.slots:
        print(f"error: --seqs {max(seqs)} exceeds --slots {args.slots}", file=sys.stderr)
        return 2
    why = unwritable_reason(args.out)
    if why:
        print(f"error: --out {args.out}: {why}", file=sys.stderr)
        return 2
    compile_cache.enable()
    import jax

    res = {"realisations": args.realisations, "slo_scale": SLO_SCALE, "slots": args.slots,
           "quick": args.quick, "cpus": os.cpu_count(), "jax": jax.__version__,
           "grid": {"max_num_seqs": seqs, "max_num_batched_tokens": tokens},
           "criterion": {"best_over_worst": BEST_OVER_WORST,
                         "best_over_default": BEST_OVER_DEFAULT}, "cases": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        _, fields, desc, case_utils = known[name]
        grid = list(itertools.product(seqs, tokens, utils or case_utils))
        c = run_case(name, fields, grid, args.realisations, args.slots, args.quick)
        c["description"] = desc
        res["cases"][name] = c
        write_result(args.out, "engine_stakes", res, render)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
