"""vLLM's auto_tune as it runs: the request rate it reports for each grid setting, and
the setting it keeps.

``benchmarks/auto_tune/auto_tune.sh`` (vLLM; read at commit 01277f9 of
vllm-project/vllm) benchmarks each setting of its grid (:mod:`tuner.search.engine_grid`)
first with every request at once (``--request-rate inf``). If that run meets the
latency requirement the setting is done; else it runs at ``int(throughput) + 1``
req/s (the throughput of the run with every request at once) and lowers the rate by 1
req/s until a run meets the requirement or the rate reaches 0. Of the settings that
met it, the one whose run there had the highest throughput is kept (the first on a
tie: the grid is walked ``max_num_seqs``-major).

Here the requirement is the one every method of ``experiments.engine_tune`` is scored by,
at least ``TARGET`` of the requests within both SLOs (auto_tune's own is the p99
end-to-end latency under ``MAX_LATENCY_ALLOWED_MS``), and every run is a run to
completion of the same training windows (auto_tune's runs below ``inf`` use 100
prompts, its ``inf`` run 1,000). The search speaks
:func:`tuner.objective.capacity.capacity_search`'s protocol (a generator of the rates
it needs), so :func:`tuner.objective.capacity.drive` runs it.
"""

from __future__ import annotations

import math

from tuner.objective.capacity import TARGET, drive

__all__ = ["auto_tune_pick", "auto_tune_rates", "rate_search"]


def rate_search(target: float = TARGET):
    """auto_tune's rate rule for one setting, as a generator: yields ``[rate]`` (one run
    per round; ``math.inf``: every request at once) and is sent ``[metrics]``
    (``slo_attainment``, ``requests_per_s``, optionally ``iterations``). Returns
    ``{"request_rate", "throughput_rps", "met", "runs", "iterations", "rungs"}``:
    the rate it stopped at (``math.inf`` when every request at once met the target;
    None when no rate down to 1 req/s did), the throughput of the run there (of the
    last run where none met), whether it met the target, its runs, the iterations
    they simulated (None where a run's metrics do not say) and ``{rate: attainment}``."""
    made = []

    def at(r):
        ms = yield [r]
        made.append((r, ms[0]))
        return ms[0]

    m = yield from at(math.inf)
    rate, met = math.inf, m["slo_attainment"] >= target
    if not met:
        r = int(m["requests_per_s"]) + 1  # the shell's ${throughput%.*} + 1
        rate = None
        while r > 0:
            m = yield from at(float(r))
            if m["slo_attainment"] >= target:
                rate, met = float(r), True
                break
            r -= 1
    its = [x.get("iterations") for _, x in made]
    return {"request_rate": rate, "throughput_rps": float(m["requests_per_s"]),
            "met": met, "runs": len(made),
            "iterations": None if None in its else float(sum(its)),
            "rungs": {f"{r:.6g}": float(x["slo_attainment"]) for r, x in made}}


def auto_tune_rates(settings: list, run_many, target: float = TARGET) -> list[dict]:
    """:func:`rate_search` for each setting in turn (auto_tune runs them one after
    another); ``run_many(setting, rates) -> metrics per rate``."""
    return [drive(rate_search(target), lambda rs, s=s: run_many(s, rs)) for s in settings]


def auto_tune_pick(results: list[dict]) -> int | None:
    """Index of the setting auto_tune keeps: of those that met the target, the first
    with the highest throughput; None when none met it."""
    best, thr = None, 0.0
    for i, r in enumerate(results):
        if r["met"] and r["throughput_rps"] > thr:
            best, thr = i, r["throughput_rps"]
    return best
