"""Exact validation one run at a time against batched, in one process (issue 30, item 1).

The main job's held-out samples (the built-in workload's 2 held-out windows x 2 seeds,
padded to the whole slice, plus the whole slice under each seed) and its five policies
(ODMA's default twice, as the main job's tuned policy is its default, then static, S3
and paged) are evaluated for goodput by :func:`tuner.objective.evaluate.evaluate_many`
twice: with one lane (every run alone, rungs read one at a time: how validation ran
before) and batched (searches in lockstep, each round's runs of one system in
``vmap``-ped calls of :func:`tuner.objective.evaluate.lane_width` lanes). Each way runs
twice and the second run is timed, so compiling is left out of the comparison (it is
reported apart); the goodputs of the two ways must agree (their largest relative
difference is reported).

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

__all__ = ["main", "samples", "measure", "render"]

POLICIES = (("tuned", "odma"), ("default", "odma"), ("static", "static"), ("s3", "s3"),
            ("paged", "paged"))


def samples(windows: int = 2, seeds: int = 2) -> list:
    """The held-out samples the main job validates on, as its validation builds them."""
    from tuner.objective.validation import HOLDOUT_SEED, plan_windows
    from tuner.scenario import ScenarioSpec, build_scenario

    win = plan_windows(ScenarioSpec(), windows)
    wholes = [build_scenario(win.whole.replace(seed=win.whole.seed + HOLDOUT_SEED + k))
              for k in range(seeds)]
    n = max(sc.workload.size for sc in wholes)
    held = [build_scenario(w.replace(seed=w.seed + HOLDOUT_SEED + k)).padded(n)
            for w in win.holdout for k in range(seeds)]
    return held + wholes


def measure(scs: list, lanes: int | None, log=print) -> dict:
    """Goodput of every policy on every sample, ``lanes`` 1 (one run at a time) or None
    (batched); the second of two runs timed."""
    from tuner.objective.evaluate import evaluate_many

    jobs = [(sc, system, {}) for sc in scs for _, system in POLICIES]
    walls, out = [], None
    for k in range(2):
        t = time.perf_counter()
        out = evaluate_many(jobs, objective="goodput_rps", lanes=lanes)
        walls.append(time.perf_counter() - t)
        log(f"  {'one lane' if lanes == 1 else 'batched'}, run {k + 1}: "
            f"{walls[-1]:.1f} s")
    runs = sum(int(m["capacity"]["runs"]) for m in out)
    return {"first_s": walls[0], "wall_s": walls[1], "runs": runs, "jobs": len(jobs),
            "goodput_rps": [m["goodput_rps"] for m in out]}


def render(res: dict) -> str:
    one, bat = res["one_lane"], res["batched"]
    L = ["# Exact validation: one run at a time vs batched", "",
         f"The main job's {res['samples']} held-out samples x {len(POLICIES)} policies "
         f"({one['jobs']} goodput searches), exact mode, {res['cpus']} CPUs, jax "
         f"{res['jax']}; the second of two runs timed (the first includes compiling).", "",
         "| way | runs to completion | wall s | first run s (with compiling) |",
         "|---|---:|---:|---:|",
         f"| one lane (before) | {one['runs']} | {one['wall_s']:.1f} | "
         f"{one['first_s']:.1f} |",
         f"| batched | {bat['runs']} | {bat['wall_s']:.1f} | {bat['first_s']:.1f} |", "",
         f"Speed-up {res['speedup']:.2f}x; largest relative difference of a goodput "
         f"between the two ways {res['max_rel_diff']:.1e}. The batched way's lanes per "
         "call are `tuner.objective.evaluate.lane_width`'s: on a CPU 4, and a ladder's "
         "rungs asked for all in one round only where a round would leave lanes idle "
         "(else read one at a time, as the one-lane way reads them); on an accelerator "
         "up to 32 lanes and every rung in one round, including rungs above the first "
         "miss that no search reads."]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    out = out_folder("python -m experiments.bench_validate", __doc__, argv)
    if out is None:
        return 2
    compile_cache.enable()
    import jax

    print("building the held-out samples", file=sys.stderr, flush=True)
    scs = samples()
    res = {"samples": len(scs), "cpus": os.cpu_count(), "jax": jax.__version__}
    for name, lanes in (("one_lane", 1), ("batched", None)):
        print(f"{name}:", file=sys.stderr, flush=True)
        res[name] = measure(scs, lanes, log=lambda s: print(s, file=sys.stderr,
                                                            flush=True))
    a, b = res["one_lane"]["goodput_rps"], res["batched"]["goodput_rps"]
    res["max_rel_diff"] = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    res["speedup"] = res["one_lane"]["wall_s"] / res["batched"]["wall_s"]
    res = stamped(res)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "bench_validate.json", res, sort_keys=False)
    write_text_atomic(out / "bench_validate.md",
                      stamp_markdown(render(res), res["provenance"]))
    print(render(res))
    return 0 if res["max_rel_diff"] < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
