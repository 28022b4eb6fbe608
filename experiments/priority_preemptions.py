"""How often the paged server preempts in the learned priority's stakes case, first-
come-first-served against shortest-prompt-first: where preemptions are rare, the ways
the priority model differs from vLLM V1 on preemption (victims from the running queue's
tail, preempted requests resuming first; docs/server-semantics.md) cannot move the
stakes measured by ``experiments.learned_stakes --target priority``.

``python -m experiments.priority_preemptions --out DIR [--requests N] [--rates R,...]
[--capacity TOKENS]``

The scenario is learned_stakes' (the built-in workload, realisation seed 0, KV cut to
``--capacity`` tokens) at each arrival rate; per order, the exact run's preemptions,
completed and dropped requests and SLO attainment. Writes ``DIR/priority_preemptions.json``
and ``.md`` atomically with their provenance. Exit 2 on bad arguments.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    print("experiments.priority_preemptions: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from experiments.results_io import positive_floats, write_result  # noqa: E402
from tuner.common import compile_cache  # noqa: E402
from tuner.common.atomic import unwritable_reason  # noqa: E402

__all__ = ["main", "measure", "render"]

ORDERS = ("fcfs", "short-prompt-first")
KEYS = ("preemptions", "completed", "dropped", "slo_attainment")


def measure(n: int, capacity: int, rates, log=print) -> dict:
    from tuner.objective.evaluate import run
    from tuner.scenario import ScenarioSpec, build_scenario

    sc0 = build_scenario(ScenarioSpec(n_requests=n, capacity_tokens=capacity, seed=0))
    rows = []
    for rate in rates:
        sc = sc0.at_rate(rate)
        wl = sc.workload
        prompt = np.asarray(wl.prompt_tokens, np.float32)
        for order in ORDERS:
            w = wl if order == "fcfs" else wl.replace(
                priority=np.where(np.asarray(wl.valid), prompt, np.inf).astype(np.float32))
            m = run(dataclasses.replace(sc, workload=w), "paged")
            rows.append({"rate_rps": rate, "order": order,
                         **{k: float(m[k]) for k in KEYS}})
            log(f"rate {rate:g}: {order}: " + ", ".join(f"{k} {m[k]:.4g}" for k in KEYS))
    return {"requests": n, "capacity_tokens": capacity, "system": "paged", "rows": rows}


def render(res: dict) -> str:
    L = ["# Preemptions in the learned priority's stakes case", "",
         f"paged, the built-in workload ({res['requests']} requests, realisation seed 0), "
         f"{res['capacity_tokens']:,} KV tokens; exact runs.", "",
         "| rate (req/s) | order | preemptions | completed | dropped | SLO attainment |",
         "|---:|---|---:|---:|---:|---:|"]
    for r in res["rows"]:
        L.append(f"| {r['rate_rps']:g} | {r['order']} | {r['preemptions']:.0f} | "
                 f"{r['completed']:.0f} | {r['dropped']:.0f} | "
                 f"{r['slo_attainment']:.3f} |")
    most = max(r["preemptions"] for r in res["rows"])
    L += ["", f"At most {most:.0f} preemptions in a run of {res['requests']} requests "
          f"({res['wall_s']:.0f} s)."]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.priority_preemptions",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="result folder")
    ap.add_argument("--requests", type=int, default=1000, help="requests (default 1000)")
    ap.add_argument("--rates", default="4.4,5.4,6.5",
                    help="arrival rates, req/s (default 4.4,5.4,6.5: FCFS's expected "
                    "goodput, and the rates the best priority policies reached at 1,000 "
                    "and 300 requests)")
    ap.add_argument("--capacity", type=int, default=100_000,
                    help="KV tokens (default 100000, learned_stakes' kv-100k)")
    args = ap.parse_args(argv)
    try:
        rates = positive_floats("--rates", args.rates)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for flag, v in (("--requests", args.requests), ("--capacity", args.capacity)):
        if v < 1:
            print(f"error: {flag} {v}: must be >= 1", file=sys.stderr)
            return 2
    why = unwritable_reason(args.out)
    if why:
        print(f"error: --out {args.out}: {why}", file=sys.stderr)
        return 2
    compile_cache.enable()
    t0 = time.perf_counter()
    res = measure(args.requests, args.capacity, rates,
                  log=lambda s: print(s, file=sys.stderr, flush=True))
    res["wall_s"] = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    write_result(args.out, "priority_preemptions", res, render)
    print(render(res), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
