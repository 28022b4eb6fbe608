"""The paged (vLLM) server against a peer simulator's results on identical requests.

``python -m experiments.vidur_check --out DIR [--n-requests N] [--schedulers v0,chunked]``

The peer is Vidur (microsoft/vidur) simulating Llama-2-70B at TP2 on A100-80GB with its
vLLM scheduler (batch cap 128, 4,096 tokens per batch, preemption by recompute) on the
request list ``../shared/reference/vidur-sharegpt-n2000-q0.25.csv`` (2,000 ShareGPT
requests, prompt + output clipped to 4,096 tokens, Poisson arrivals at 0.25 req/s); its
results are the table in ``../shared/reference/README.md``, restated in :data:`VIDUR`.

We run ``paged`` (block 16, the vLLM v0 scheduler by default) on the same list with the
same limits and Vidur's KV capacity (49,152 tokens, so that the comparison isolates
scheduling and step time from the memory model; our own deployment model's capacity
is reported beside it), exact mode, to completion. Two loads:

* ``steady``: the list as recorded (0.25 req/s), compared metric by metric with Vidur
  (TTFT p50/p90/p99, TPOT p50/p90/p99, end-to-end p50/p90/p99, time-weighted mean KV
  use, preemptions), each marked within 15% or not;
* ``saturating``: the same requests with arrival times halved (0.5 req/s), where the
  server preempts; Vidur published no run at this load, so it is reported, not compared;
* ``scaled`` (a diagnostic, not a calibration): the steady run with every iteration
  slowed by one factor so that TPOT p50 equals Vidur's; the other metrics then test the
  scheduling rules alone (a uniform step-time error cannot explain what still differs).

Writes ``DIR/vidur_check.json`` and ``DIR/vidur_check.md`` atomically; progress on
stderr. Exit 2 on bad arguments (nothing written).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # progress from the first second (JAX loads below)
    print("experiments.vidur_check: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from models import get_system, metrics, simulate_until_done, validate_params  # noqa: E402
from tuner.common.atomic import write_json_atomic, write_text_atomic  # noqa: E402
from experiments.results_io import stamp_markdown, stamped  # noqa: E402
from tuner.scenario import ScenarioSpec, build_scenario  # noqa: E402
from tuner.workloads.presets import traces_dir  # noqa: E402

__all__ = ["VIDUR", "REFERENCE", "TOLERANCE", "spec_for", "run_case", "compare", "main"]

REFERENCE = "vidur-sharegpt-n2000-q0.25.csv"
TOLERANCE = 0.15  # the aim: agreement within ~15%, not bit-equality
# Vidur's results on the request list (../shared/reference/README.md)
VIDUR = {
    "ttft_p50_s": 0.7616, "ttft_p90_s": 1.5259, "ttft_p99_s": 2.6729,
    "tpot_p50_s": 0.0732, "tpot_p90_s": 0.0862, "tpot_p99_s": 0.1160,
    "e2e_p50_s": 29.22, "e2e_p90_s": 58.67, "e2e_p99_s": 75.39,
    "kv_occupancy": 0.3044, "peak_kv_share": 0.8486, "preemptions": 0.0,
    "last_completion_s": 7702.0,
}
VIDUR_CAPACITY_TOKENS = 49152  # "about 49,152 tokens" (README)
COMPARED = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
            "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "kv_occupancy")
LOADS = {"steady": None, "saturating": 0.5}  # req/s (None: the list's own arrivals)


def reference_path() -> Path:
    """The request list, beside the traces: ``<traces dir>/../reference/``."""
    return traces_dir().parent / "reference" / REFERENCE


def spec_for(scheduler: str = "v0", rate: float | None = None,
             n_requests: int | None = None) -> ScenarioSpec:
    """The peer's setup as a scenario (Vidur's capacity, vLLM's limits)."""
    return ScenarioSpec(trace=str(reference_path()), hardware="a100-80gb",
                        model="llama-2-70b", tp=2, capacity_tokens=VIDUR_CAPACITY_TOKENS,
                        rate=rate, n_requests=n_requests, max_len=4096, n_slots=128,
                        max_batch=128, max_prefill=4096, admit_window=32,
                        scheduler=scheduler)


def slowed(hw, factor: float):
    """Roofline parameters whose every iteration takes ``factor`` times as long: the
    efficiencies and links slowed, the fixed latencies stretched."""
    return hw._replace(mfu=hw.mfu / factor, bw_eff=hw.bw_eff / factor,
                       tp_link_bw=hw.tp_link_bw / factor,
                       host_link_bw=hw.host_link_bw / factor,
                       tp_allreduce_latency_s=hw.tp_allreduce_latency_s * factor,
                       step_overhead_s=hw.step_overhead_s * factor)


def run_case(spec: ScenarioSpec, slow: float = 1.0) -> dict:
    """Exact run of ``paged`` (block 16) to completion: the family's metrics plus
    end-to-end latency percentiles and the last completion time from the record
    (``slow``: every iteration takes that many times as long, :func:`slowed`)."""
    sc = build_scenario(spec)
    if slow != 1.0:
        sc = dataclasses.replace(sc, hw=slowed(sc.hw, slow))
    system = "paged"
    p = validate_params(get_system(system), {"block_size": 16.0}, sc.cfg.max_len, sc.hw)
    p = {k: jnp.asarray(v) for k, v in p.items()}
    opts = sc.options(system, record=True)
    inputs = sc.inputs(system)
    t0 = time.perf_counter()
    st = simulate_until_done(inputs, sc.hw, p, opts)
    m = {k: float(v) for k, v in metrics(st, inputs, opts).items()}
    n = int(np.sum(np.asarray(sc.workload.valid)))
    fin = np.asarray(st.rec.finish_s)[:n]
    arr = np.asarray(sc.workload.arrival_s)[:n]
    e2e = fin - arr
    for q in (50, 90, 99):
        m[f"e2e_p{q}_s"] = float(np.nanpercentile(e2e, q))
    m["last_completion_s"] = float(np.nanmax(fin))
    m["sim_seconds"] = time.perf_counter() - t0
    m["requests"] = n
    m["rate_rps"] = sc.nominal_rps
    m["deployment_kv_capacity_tokens"] = int(sc.deployment.kv_capacity_tokens)
    return m


def compare(ours: dict, skip=()) -> dict:
    """Relative difference (ours / Vidur - 1) per compared metric, within TOLERANCE?"""
    out = {}
    for k in COMPARED:
        if k in skip:
            continue
        rel = ours[k] / VIDUR[k] - 1.0
        out[k] = {"vidur": VIDUR[k], "ours": ours[k], "rel": rel,
                  "within": bool(abs(rel) <= TOLERANCE)}
    return out


def _table(comparison: dict, ours: str) -> list[str]:
    """Markdown rows of a :func:`compare` result."""
    rows = [f"| metric | Vidur | {ours} | ours / Vidur - 1 | within {TOLERANCE:.0%} |",
            "|---|---:|---:|---:|:-:|"]
    for k, c in comparison.items():
        rows.append(f"| {k} | {c['vidur']:.4g} | {c['ours']:.4g} | {c['rel']:+.1%} | "
                    f"{'yes' if c['within'] else 'no'} |")
    return rows


def render(res: dict) -> str:
    L = ["# Paged (vLLM) server vs Vidur on identical requests", "",
         f"Request list `../shared/reference/{REFERENCE}` ({res['requests']} requests), "
         "Llama-2-70B TP2 on A100-80GB, batch cap 128, 4,096 tokens per iteration, "
         f"KV capacity {VIDUR_CAPACITY_TOKENS:,} tokens (Vidur's; our deployment model "
         f"gives {res['deployment_kv_capacity_tokens']:,}), paged block 16, exact mode. "
         f"Agreement aim: within {TOLERANCE:.0%}.", ""]
    for sched, by_load in res["runs"].items():
        steady = by_load["steady"]
        L += [f"## Scheduler `{sched}`, steady load ({steady['rate_rps']:.3f} req/s)", ""]
        L += _table(by_load["comparison"], "ours")
        L += ["", f"Preemptions {steady['preemptions']:.0f} (Vidur 0); peak KV "
              f"{steady['peak_kv_share']:.1%} (Vidur max 84.86%); last completion "
              f"{steady['last_completion_s']:.0f} s (Vidur 7,702 s).", ""]
        sc_ = by_load["scaled"]
        L += [f"Diagnostic: every iteration {sc_['slow_factor']:.3f}x as long (so that TPOT "
              "p50 equals Vidur's; not a calibration), the other metrics then compare the "
              "scheduling alone:", ""]
        L += _table(by_load["scaled_comparison"], "ours, scaled")
        L += ["", f"Preemptions {sc_['preemptions']:.0f}; peak KV {sc_['peak_kv_share']:.1%}; "
              f"last completion {sc_['last_completion_s']:.0f} s.", ""]
        sat = by_load["saturating"]
        L += [f"Saturating load ({sat['rate_rps']:.3f} req/s, arrivals halved; no Vidur "
              "run to compare): "
              f"preemptions {sat['preemptions']:.0f}, TTFT p50/p90/p99 "
              f"{sat['ttft_p50_s']:.3g} / {sat['ttft_p90_s']:.3g} / {sat['ttft_p99_s']:.3g} s,"
              f" TPOT p50/p99 {sat['tpot_p50_s'] * 1e3:.1f} / {sat['tpot_p99_s'] * 1e3:.1f} "
              f"ms, mean KV use {sat['kv_occupancy']:.1%}, last completion "
              f"{sat['last_completion_s']:.0f} s.", ""]
    if res.get("notes"):
        L += ["## What differs and why", ""] + [f"- {n}" for n in res["notes"]] + [""]
    return "\n".join(L)


LATENCY = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
           "e2e_p50_s", "e2e_p90_s", "e2e_p99_s")


def notes(res: dict) -> list[str]:
    """What differs and why, from the measured numbers of the first scheduler."""
    sched = "v0" if "v0" in res["runs"] else next(iter(res["runs"]))
    run = res["runs"][sched]
    rel = [run["comparison"][k]["rel"] for k in LATENCY]
    srel = {k: c["rel"] for k, c in run["scaled_comparison"].items()}
    ttft = max(abs(srel[k]) for k in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"))
    e2e = max(abs(srel[k]) for k in ("e2e_p50_s", "e2e_p90_s", "e2e_p99_s"))
    sc = run["scaled"]
    return [
        f"Step time ({sched}): at steady load every latency metric is between "
        f"{min(rel):+.0%} and {max(rel):+.0%} of Vidur's: one cause, a uniformly shorter "
        "iteration. Our roofline takes published best-case efficiencies (A100: MAMF GEMM "
        "0.87 of peak, BabelStream 0.83 of HBM bandwidth; hardware/_device_presets.py) "
        "and adds the TP all-reduces; Vidur times its operators as profiled on A100, "
        "slower at these shapes. Slowing every iteration by "
        f"{sc['slow_factor']:.3f} (a diagnostic, not a calibration) brings TTFT p50/p90/p99 "
        f"within {ttft:.1%} and end-to-end latency within {e2e:.1%} of Vidur's: the "
        "scheduling rules agree, the step-time model does not. Calibrating it to an "
        "operator's measured runs is the calibration issue's work, not a constant tuned "
        "here.",
        f"KV occupancy: {run['steady']['kv_occupancy']:.1%} as measured and "
        f"{sc['kv_occupancy']:.1%} with the slowed steps, vs Vidur's 30.44% (peak "
        f"{sc['peak_kv_share']:.1%} vs 84.86%). Ours is reserved blocks (ceil((ctx+1)/16), "
        "one token of look-ahead) time-weighted over first arrival to last completion; "
        "Vidur's definition (what it samples and over which time) was not available "
        "here, so this difference is reported, not explained.",
        f"Saturating load: {res['runs'][sched]['saturating']['preemptions']:.0f} "
        "preemptions, each of the most recently admitted request and only as many as a "
        "block was short (vLLM's rule); the requests behind a preempted one wait for "
        "its recompute, which is where the TTFT tail comes from.",
        "Definitions: Vidur reports decode time per output token and request end-to-end "
        "time; ours are (finish - first token) / (output - 1) and finish - arrival.",
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.vidur_check",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the result files")
    ap.add_argument("--n-requests", type=int, default=None,
                    help="first N requests only (default: all 2,000)")
    ap.add_argument("--schedulers", default="v0",
                    help="comma list of v0, chunked (default v0)")
    args = ap.parse_args(argv)
    scheds = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    bad = [s for s in scheds if s not in ("v0", "chunked")]
    if bad or not scheds:
        print(f"error: --schedulers: unknown {bad or '(none)'}; choose v0, chunked",
              file=sys.stderr)
        return 2
    if args.out.exists() and not args.out.is_dir():
        print(f"error: --out {args.out}: exists and is not a directory", file=sys.stderr)
        return 2
    if not reference_path().is_file():
        print(f"error: reference request list not found: {reference_path()}",
              file=sys.stderr)
        return 2
    if args.n_requests is not None and not 2 <= args.n_requests <= 2000:
        print("error: --n-requests must be in [2, 2000]", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {}
    meta = {}
    for sched in scheds:
        runs[sched] = {}
        for load, rate in LOADS.items():
            print(f"vidur_check: {sched} scheduler, {load} load ...", file=sys.stderr,
                  flush=True)
            m = run_case(spec_for(sched, rate, args.n_requests))
            print(f"  {m['requests']} requests in {m['sim_seconds']:.1f} s", file=sys.stderr)
            runs[sched][load] = m
            meta = {"requests": m["requests"],
                    "deployment_kv_capacity_tokens": m["deployment_kv_capacity_tokens"]}
        runs[sched]["comparison"] = compare(runs[sched]["steady"])
        factor = VIDUR["tpot_p50_s"] / runs[sched]["steady"]["tpot_p50_s"]
        print(f"vidur_check: {sched} scheduler, steady load, step time x{factor:.3f} ...",
              file=sys.stderr, flush=True)
        m = run_case(spec_for(sched, None, args.n_requests), slow=factor)
        m["slow_factor"] = factor
        runs[sched]["scaled"] = m
        runs[sched]["scaled_comparison"] = compare(m, skip=("tpot_p50_s",))
    res = {"reference": REFERENCE, "vidur": VIDUR, "tolerance": TOLERANCE,
           "runs": runs, **meta}
    res["notes"] = notes(res)
    res = stamped(res)
    write_json_atomic(args.out / "vidur_check.json", res)
    md = stamp_markdown(render(res), res["provenance"])
    write_text_atomic(args.out / "vidur_check.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
