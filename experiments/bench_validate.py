"""Lanes per batched call for exact validation on a CPU, measured on the main job's own
validation (issue 30: every exact evaluation batched; the choice of
:data:`tuner.objective.evaluate.CPU_LANES`).

The main job's held-out samples (the default deployment's 2 held-out windows x 2 seeds,
built as ``tuner.fit`` builds them: the whole slice's SLOs and ``max_len`` pinned) and its
three policies (the tuned setting the main job finds, vLLM auto_tune's 128 / 512 / 0.98,
vLLM's defaults, and the paged baseline), each goodput search started from the policy's
exact goodput on the training windows as ``tuner.fit`` starts it, are evaluated for
goodput by :func:`tuner.objective.evaluate.evaluate_many` with 1, 2, 4 and 8 lanes per
call (1: every run alone, rungs read one at a time). Each way runs once to compile (that
run's time is reported too), then :data:`ROUNDS` more times, the ways interleaved
(round k starts with the k-th way), so that a drift of the machine's speed hits them
alike; the median is the way's time and its range is reported. Where the ranges of the
fastest way and ``CPU_LANES``'s overlap, the measurement does not tell them apart.
Every way's goodputs must agree (the largest relative difference is reported; exit 1
if it exceeds 1e-4).

Usage (from the repository root; about 4 minutes on 2 cores)::

    python3 -m experiments.bench_validate --out experiments/results/bench_validate

Writes ``bench_validate.json`` and ``bench_validate.md`` to ``--out`` (atomically).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # progress from the first second: the imports take ~2 s
    print("bench_validate: starting", file=sys.stderr, flush=True)

import os  # noqa: E402
import time  # noqa: E402

from experiments.out_folder import out_folder  # noqa: E402
from experiments.results_io import stamp_markdown, stamped  # noqa: E402
from tuner.common import compile_cache  # noqa: E402
from tuner.common.atomic import write_json_atomic, write_text_atomic  # noqa: E402

__all__ = ["LANES", "ROUNDS", "fastest", "main", "samples", "measure", "render"]

LANES = (1, 2, 4, 8)
ROUNDS = 3  # timed runs of each way, after the one that compiles
# the main job's tuned setting (vLLM auto_tune's 128 / 512 / 0.98), vLLM's defaults, and
# vllm-v1's baseline (paged)
TUNED = {"max_num_seqs": 128.0, "max_num_batched_tokens": 512.0,
         "gpu_memory_utilization": 0.98}


def samples(windows: int = 2, seeds: int = 2):
    """(held-out jobs of the main job's validation, their hints): its samples x its
    policies, and each policy's exact goodput on the training windows."""
    from models import get_system
    from tuner.objective.evaluate import evaluate_many
    from tuner.objective.validation import (plan_windows, validation_jobs,
                                            validation_samples)
    from tuner.scenario import ScenarioSpec, build_scenario
    from tuner.scenario.deployments import DEFAULT, get_deployment

    dep = get_deployment(DEFAULT)
    base = ScenarioSpec(**dep.spec_fields())
    win = plan_windows(base, windows)
    whole = build_scenario(win.whole)
    pinned = {"ttft_slo_s": whole.slo["ttft_s"], "tpot_slo_s": whole.slo["tpot_s"]}
    if base.max_len is None:
        pinned["max_len"] = int(whole.cfg.max_len)
    win = win.replace_specs(**pinned)
    policies = {"tuned": (dep.system, TUNED), "default": (dep.system, {}),
                **{b: (b, {}) for b in get_system(dep.system).baselines}}
    train = tuple(build_scenario(w) for w in win.train)
    got = evaluate_many([(train, s, p) for s, p in policies.values()],
                        objective="goodput_rps")
    hints = dict(zip(policies, (float(m["goodput_rps"]) for m in got)))
    todo, jobs = validation_jobs(policies, validation_samples(win, seeds, False))
    return jobs, [hints[name] for _, name in todo]


def _once(jobs: list, hints: list, lanes: int) -> tuple[float, list]:
    from tuner.objective.evaluate import evaluate_many

    t = time.perf_counter()
    out = evaluate_many(jobs, objective="goodput_rps", lanes=lanes, hints=hints)
    return time.perf_counter() - t, out


def measure(jobs: list, hints: list, lanes_list=LANES, rounds: int = ROUNDS,
            log=print) -> list[dict]:
    """Goodput of every job with each of ``lanes_list`` lanes per call: one run each to
    compile, then ``rounds`` timed runs each, interleaved (round k starts with way k);
    per way the median and range of the timed runs."""
    import numpy as np

    ways = []
    for lanes in lanes_list:
        wall, out = _once(jobs, hints, lanes)
        log(f"  {lanes} lane(s), first run (compiling): {wall:.1f} s")
        ways.append({"lanes": lanes, "first_s": wall, "walls_s": [],
                     "runs": sum(int(m["capacity"]["runs"]) for m in out),
                     "jobs": len(jobs), "goodput_rps": [m["goodput_rps"] for m in out]})
    n = len(ways)
    for k in range(rounds):
        for j in range(n):
            w = ways[(k + j) % n]
            wall = _once(jobs, hints, w["lanes"])[0]
            w["walls_s"].append(wall)
            log(f"  round {k + 1}, {w['lanes']} lane(s): {wall:.1f} s")
    for w in ways:
        w["wall_s"] = float(np.median(w["walls_s"]))
    return ways


def fastest(ways: list[dict], cpu_lanes: int) -> dict:
    """The way with the lowest median (``fastest``: its lanes) and whether its timed
    runs' range overlaps ``cpu_lanes``'s (``overlap``: no telling them apart)."""
    best = min(ways, key=lambda w: w["wall_s"])
    mine = next((w for w in ways if w["lanes"] == cpu_lanes), best)
    return {"fastest": best["lanes"],
            "overlap": bool(min(mine["walls_s"]) <= max(best["walls_s"]))}


def render(res: dict) -> str:
    ways = res["ways"]
    one = ways[0]
    L = ["# Exact validation: lanes per batched call on a CPU", "",
         f"The main job's validation: {one['jobs']} goodput searches (its held-out "
         f"samples x its policies, each started from the policy's training goodput), "
         f"exact mode, {res['cpus']} CPUs, jax {res['jax']}; after a first run that "
         f"compiles, {len(one['walls_s'])} timed runs of each way, interleaved: their "
         "median and range.", "",
         "| lanes per call | runs to completion | wall s (median) | range s | vs one "
         "lane | first run s (with compiling) |", "|---:|---:|---:|---|---:|---:|"]
    for w in ways:
        L.append(f"| {w['lanes']} | {w['runs']} | {w['wall_s']:.1f} | "
                 f"{min(w['walls_s']):.1f}-{max(w['walls_s']):.1f} | "
                 f"{one['wall_s'] / w['wall_s']:.2f}x | {w['first_s']:.1f} |")
    told = ("the ranges of the two overlap: this measurement does not tell them apart"
            if res["overlap"] else "their ranges do not overlap")
    L += ["", f"Fastest (median): {res['fastest']} lanes; `tuner.objective.evaluate."
          f"CPU_LANES` is {res['cpu_lanes']}" + ("" if res["fastest"] == res["cpu_lanes"]
                                               else f" ({told})")
          + ". Largest relative difference of a goodput between "
          f"the ways {res['max_rel_diff']:.1e} (the same runs are read whatever the "
          "lanes: more lanes ask for a ladder's rungs ahead, in one round, and a call "
          "runs until its slowest lane is done)."]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    out = out_folder("python -m experiments.bench_validate", __doc__, argv)
    if out is None:
        return 2
    compile_cache.enable()
    import jax

    from tuner.objective.evaluate import CPU_LANES

    print("building the held-out samples and the hints", file=sys.stderr, flush=True)
    jobs, hints = samples()
    res = {"cpus": os.cpu_count(), "jax": jax.__version__, "cpu_lanes": CPU_LANES,
           "ways": []}
    res["ways"] = measure(jobs, hints, log=lambda s: print(s, file=sys.stderr,
                                                           flush=True))
    a = res["ways"][0]["goodput_rps"]
    res["max_rel_diff"] = max(abs(x - y) / abs(x) for w in res["ways"][1:]
                              for x, y in zip(a, w["goodput_rps"]))
    res.update(fastest(res["ways"], CPU_LANES))
    res = stamped(res)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "bench_validate.json", res, sort_keys=False)
    write_text_atomic(out / "bench_validate.md",
                      stamp_markdown(render(res), res["provenance"]))
    print(render(res))
    return 0 if res["max_rel_diff"] < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
