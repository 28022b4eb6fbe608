"""Scoring and report of :mod:`experiments.bench_tuners` (pure functions of its tasks).

Every task is one ``(problem, seed)``; each method's run is a list of exact evaluations
with the cost (exact-evaluation equivalents) spent when each was made. A method reaches
the 1% band of a task at the first cost where its best-so-far is within 1% of the best
any method found on that task.
"""

from __future__ import annotations

import io
import math

import numpy as np

__all__ = ["GRADIENT_METHODS", "BLACKBOX_METHODS", "TARGET_RATIO", "TARGET_DIM",
           "TOLERANCE", "best_so_far", "budgets_for", "cost_to_reach", "render_markdown",
           "render_plot", "summarise", "within"]

GRADIENT_METHODS = ("gradient", "gradient-coords", "hybrid", "guided")
BLACKBOX_METHODS = ("tpe", "cmaes", "random")
TOLERANCE = 0.01      # "within 1% of the best objective any method finds"
TARGET_RATIO = 3.0    # a gradient method: 3x less budget than the better of TPE, CMA-ES
TARGET_DIM = 16       # ... on problems with at least this many parameters
TARGET_PROBLEMS = 2   # ... on at least this many of them
LADDER = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024)


def best_so_far(costs, values, budgets) -> list:
    """Best value among evaluations whose cost is <= each budget (None: none yet)."""
    out = []
    for b in budgets:
        seen = [v for c, v in zip(costs, values) if c <= b + 1e-9]
        out.append(max(seen) if seen else None)
    return out


def within(value: float, best: float, tol: float = TOLERANCE) -> bool:
    return value >= best - tol * abs(best)


def cost_to_reach(costs, values, best: float, tol: float = TOLERANCE):
    """First cost at which the best-so-far is within ``tol`` of ``best`` (None: never)."""
    for c, v in zip(costs, values):
        if within(v, best, tol):
            return float(c)
    return None


def _median(xs):
    """Median with None as 'never' (infinite): None when at least half never reach."""
    vals = sorted(math.inf if x is None else x for x in xs)
    if not vals:
        return None
    n = len(vals)
    m = vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])
    return None if math.isinf(m) else float(m)


def _stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": float(np.median(xs)), "min": float(min(xs)),
            "max": float(max(xs)), "n": len(xs)}


def budgets_for(tasks, budget: int) -> list:
    """The ladder up to the most any method spent, with the black-box budget on it."""
    top = math.ceil(max(r["spent"] for t in tasks for r in t["runs"].values()))
    return sorted({b for b in LADDER if b < top} | {min(budget, top), top})


def _ratio(reach: dict, method: str) -> dict:
    """The better (smaller median budget) of TPE and CMA-ES over ``method``'s median
    budget to the 1% band: a bound when neither black-box method got there in half the
    seeds, none when ``method`` did not."""
    g = reach[method]["median"]
    bb = {m: reach[m]["median"] for m in ("tpe", "cmaes") if m in reach}
    got = {m: v for m, v in bb.items() if v is not None}
    if g is None:
        return {"value": None, "bound": None, "versus": None,
                "note": f"{method} did not reach the 1% band in at least half the seeds"}
    if not bb:
        return {"value": None, "bound": None, "versus": None,
                "note": "neither TPE nor CMA-ES was run"}
    if not got:
        spent = max(reach[m]["spent_max"] for m in bb)
        return {"value": None, "bound": spent / g, "versus": None,
                "note": "neither TPE nor CMA-ES reached the 1% band in half the seeds "
                        "within their budget: the ratio is at least the bound"}
    best = min(got, key=got.get)
    return {"value": got[best] / g, "bound": None, "versus": best, "note": ""}


def summarise(tasks: list, problems: list, methods: list, budget: int) -> dict:
    budgets = budgets_for(tasks, budget)
    curves, reach, ratio, dims, cost_ratio = {}, {}, {}, {}, {}
    for pb in problems:
        ts = sorted((t for t in tasks if t["problem"] == pb), key=lambda t: t["seed"])
        dims[pb] = ts[0]["dim"]
        cost_ratio[pb] = _stats([t["grad_cost"] for t in ts])
        curves[pb], reach[pb] = {}, {}
        for m in methods:
            per_seed, norm = [], []
            for t in ts:
                b = best_so_far(t["runs"][m]["cost"], t["runs"][m]["value"], budgets)
                per_seed.append(b)
                best = t["best_objective"]
                norm.append([x / best if x is not None and best > 0 else None for x in b])
            curves[pb][m] = {
                "best": per_seed,
                "stats": [_stats([s[i] for s in per_seed]) for i in range(len(budgets))],
                "normalised": [_stats([s[i] for s in norm]) for i in range(len(budgets))]}
            costs = [cost_to_reach(t["runs"][m]["cost"], t["runs"][m]["value"],
                                   t["best_objective"]) for t in ts]
            reach[pb][m] = {"per_seed": costs, "median": _median(costs),
                            "reached": sum(c is not None for c in costs),
                            "seeds": len(costs),
                            "spent_max": max(t["runs"][m]["spent"] for t in ts)}
        ratio[pb] = {g: _ratio(reach[pb], g) for g in GRADIENT_METHODS if g in methods}
    high = [pb for pb in problems if dims[pb] >= TARGET_DIM]
    wins = [pb for pb in high
            if any(q["value"] is not None and q["value"] >= TARGET_RATIO
                   or q["bound"] is not None and q["bound"] >= TARGET_RATIO
                   for g, q in ratio[pb].items() if g != "gradient-coords")]
    return {"budgets": budgets, "dims": dims, "grad_cost": cost_ratio, "curves": curves,
            "to_within_1pct": reach, "ratio_blackbox_over": ratio,
            "target": {"ratio": TARGET_RATIO, "min_dim": TARGET_DIM,
                       "problems_needed": TARGET_PROBLEMS, "high_dim_problems": high,
                       "won": wins, "met": len(wins) >= TARGET_PROBLEMS}}


# ---------------------------------------------------------------------------------------
# report


def _fmt(x, digits=4):
    return "-" if x is None else f"{x:.{digits}g}"


def _reach_table(doc) -> list[str]:
    s, methods = doc["summary"], doc["methods"]
    grads = [g for g in GRADIENT_METHODS if g in methods]
    lines = ["| problem | d | " + " | ".join(methods) + " | "
             + " | ".join(f"best of TPE/CMA-ES / {g}" for g in grads) + " |",
             "|---|---:|" + "---|" * (len(methods) + len(grads))]
    for pb, rows in s["to_within_1pct"].items():
        cells = []
        for m in methods:
            r = rows[m]
            per = [c for c in r["per_seed"] if c is not None]
            spread = f" [{min(per):.0f}-{max(per):.0f}]" if per else ""
            cells.append(f"{_fmt(r['median'])}{spread} ({r['reached']}/{r['seeds']})")
        for g in grads:
            q = s["ratio_blackbox_over"][pb][g]
            cells.append(f"{q['value']:.2f}x (vs {q['versus']})" if q["value"] is not None
                         else f">= {q['bound']:.2f}x" if q["bound"] is not None else "n/a")
        lines.append(f"| {pb} | {s['dims'][pb]} | " + " | ".join(cells) + " |")
    return lines


def _quality_table(doc) -> list[str]:
    lines = ["| problem | parameter | coords | " + " | ".join(
        f"T={t:g}: agree/disagree/vanishing/flat" for t in doc["settings"]["temperatures"])
        + " |", "|---|---|---:|" + "---|" * len(doc["settings"]["temperatures"])]
    for pb, q in doc["gradient_quality"].items():
        for name, row in q["per_parameter"].items():
            # results written before the vanishing class counted it as agree
            cells = [f"{c['agree']}/{c['disagree']}/{c.get('vanishing', '-')}/{c['flat']}"
                     for c in row["by_t"]]
            lines.append(f"| {pb} | {name} | {row['coords']} | " + " | ".join(cells) + " |")
    return lines


def _why(doc) -> list[str]:
    """Per high-dimensional problem the gradient tuners did not win: where they ended,
    what the gradient checks saw at the start, and which method did best."""
    s, q = doc["summary"], doc.get("gradient_quality", {})
    lost = [pb for pb in s["target"]["high_dim_problems"] if pb not in s["target"]["won"]]
    if not lost:
        return []
    dirs = doc["settings"]["check_dirs"]
    out = ["## Why the gradient tuners did not win", "",
           "What was tried: gradient checks along random directions instead of per "
           f"coordinate ({2 * dirs} exact evaluations instead of 2 per parameter), a "
           "gradient step "
           "charged its measured cost, and the hybrid start from the best of random "
           "exact samples.", ""]
    for pb in lost:
        reach = s["to_within_1pct"][pb]
        final = {m: s["curves"][pb][m]["normalised"][-1]["median"]
                 for m in GRADIENT_METHODS if m in reach}
        got = {m: r["median"] for m, r in reach.items() if r["median"] is not None}
        best = (f"{min(got, key=got.get)} (median {min(got.values()):.0f} evaluations)"
                if got else "none in half the seeds")
        line = (f"- `{pb}`: the gradient tuners end at a median "
                + ", ".join(f"{100 * v:.1f}% ({m})" for m, v in final.items()
                            if v is not None)
                + f" of the best policy found; the fastest to the 1% band: {best}.")
        if pb in q:
            rows = q[pb]["per_parameter"].values()
            n = sum(r["coords"] for r in rows)
            cold = [r["by_t"][-1] for r in rows]
            flat = sum(c["flat"] for c in cold)
            agree = sum(c["agree"] for c in cold)
            van = sum(c.get("vanishing", 0) for c in cold)
            line += (f" At the start, {flat} of {n} coordinates have an exact difference "
                     f"of 0 (the exact objective is flat there at step "
                     f"{doc['settings']['fd_step']}: a relaxed slope predicts no exact "
                     f"gain) and {agree} of the other {n - flat} agree at "
                     f"T={doc['settings']['temperatures'][-1]:g}"
                     + (f" ({van} more have a vanishing relaxed derivative)" if van
                        else "") + ".")
        out.append(line)
    return out + [""]


def _vanishing() -> float:
    from tuner.search.gradcheck import VANISHING_RATIO

    return VANISHING_RATIO


def render_markdown(doc: dict) -> str:
    cfg, s = doc["settings"], doc["summary"]
    tgt = s["target"]
    def over(p):
        return "".join(f", {k} {v}" for k, v in p.get("spec", {}).items())

    probs = "; ".join(f"`{p['name']}` ({p['doc']}, system `{p['system']}`, "
                      f"d = {s['dims'][p['name']]}, devices {', '.join(p['hardware'])}, "
                      f"workloads {', '.join(p['traces'])}{over(p)})"
                      for p in doc["problems"])
    setup = (
        f"Problems: {probs}. Objective `{cfg['objective']}` (exact mode, the mean over "
        f"each problem's scenarios); {cfg['seeds']} seeds per problem (scenario seed = "
        f"method seed); {cfg['n_requests']} requests and {cfg['n_slots']} slots per "
        f"scenario unless the problem says otherwise, tp {cfg['tp']}, max_len "
        f"{cfg['max_len']}, {cfg['crn']} CRN workload(s). Gradient tuners: {cfg['grad_steps']} "
        f"steps, exact check every {cfg['check_every']}; `gradient` checks the gradient "
        f"along {cfg['check_dirs']} random directions, `gradient-coords` per coordinate "
        f"(the fit's check for few parameters), `hybrid` is `gradient` started from the "
        f"best of the start and {cfg['explore']} random exact samples; `guided` steers "
        f"CMA-ES by relaxed gradients at T = {cfg.get('guide_t', 0.1)}. Black-box methods: "
        f"{cfg['budget']} exact evaluations each (TPE sequential, multivariate; CMA-ES "
        f"popsize {cfg['batch']}, sigma0 {cfg['sigma0']}; random in batches of "
        f"{cfg['batch']}; theta box +-{cfg['box']}). Runtime {doc['runtime_s']:.0f} s "
        f"with {doc['jobs']} worker(s).")
    cost = ", ".join(f"{pb} {_fmt(c['median'], 3)} [{_fmt(c['min'], 3)}, "
                     f"{_fmt(c['max'], 3)}]" for pb, c in s["grad_cost"].items())
    lines = ["# Tuner benchmark: gradient vs Optuna TPE, CMA-ES and random search", "",
             setup, "",
             "Budget unit: one exact evaluation of the problem (every scenario, every rung "
             "of the goodput ladder). A relaxed forward + backward pass is charged what it "
             "measured: the median wall time of a gradient over that of an exact "
             "evaluation, timed in each task after compiling (median [min, max] over "
             f"seeds): {cost}. Every exact evaluation a tuner makes (its gradient checks, "
             "exploration samples and exact checks) is charged in full.", "",
             "## Budget to reach within 1% of the best objective any method found", "",
             "Median over seeds of the first cost at which a method's best exact "
             "objective is within 1% of the best any method found on that (problem, "
             "seed), [min-max over the seeds that reached] (seeds reached / seeds); '-' "
             "when at least half the seeds never get there.", ""]
    lines += _reach_table(doc)
    lines += ["", (f"Target: at d >= {tgt['min_dim']}, `gradient` or `hybrid` reaches the "
                   f"1% band with >= {tgt['ratio']:.0f}x less budget than the better of "
                   f"TPE and CMA-ES on at least {tgt['problems_needed']} problems: "
                   f"**{'met' if tgt['met'] else 'not met'}** (won on "
                   f"{', '.join(tgt['won']) or 'none'} of "
                   f"{', '.join(tgt['high_dim_problems']) or 'none'})."), ""]
    lines += _why(doc) + ["## Gradient quality per parameter", "",
              "At each problem's start policy (first seed): the relaxed gradient of the "
              "log objective at each temperature against exact CRN central finite "
              f"differences (step {cfg['fd_step']} in theta) per coordinate, classified "
              "by `tuner.search.gradcheck.classify` (the fit's rule): 'flat', the exact "
              "difference is 0 up to float32 rounding (nothing to agree with); "
              f"'vanishing', the relaxed derivative is under {_vanishing():.0%} of the "
              "exact difference "
              "(treated like 'disagree': exact differences for it); else 'agree' or "
              "'disagree' by sign. Not charged to any method.", ""]
    lines += _quality_table(doc)
    lines += [""]
    for pb in s["to_within_1pct"]:
        lines += [f"## Best exact objective vs budget: {pb}", "",
                  "Median [min, max] over seeds; in parentheses the median share of the "
                  "best any method found on the same seed. A run that ended below a budget "
                  "keeps its final best at larger budgets.", "",
                  "| budget | " + " | ".join(doc["methods"]) + " |",
                  "|---:|" + "---|" * len(doc["methods"])]
        for i, b in enumerate(s["budgets"]):
            cells = []
            for m in doc["methods"]:
                st = s["curves"][pb][m]["stats"][i]
                nm = s["curves"][pb][m]["normalised"][i]
                cells.append("-" if st["median"] is None else
                             f"{_fmt(st['median'])} [{_fmt(st['min'], 3)}, "
                             f"{_fmt(st['max'], 3)}] ({_fmt(100 * nm['median'], 3)}%)")
            lines.append(f"| {b} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Per (problem, seed)", "",
              "| problem | seed | default | best | " + " | ".join(doc["methods"])
              + " | grad/exact cost | wall s (" + "/".join(doc["methods"]) + ") |",
              "|---|---:|---:|---:|" + "---:|" * len(doc["methods"]) + "---:|---|"]
    for t in doc["tasks"]:
        finals = [max(t["runs"][m]["value"], default=None) for m in doc["methods"]]
        walls = "/".join(f"{t['runs'][m]['wall_s']:.0f}" for m in doc["methods"])
        lines.append(f"| {t['problem']} | {t['seed']} | {_fmt(t['default_objective'])} | "
                     f"{_fmt(t['best_objective'])} | "
                     + " | ".join(_fmt(v) for v in finals)
                     + f" | {t['grad_cost']:.2f} | {walls} |")
    lines += ["", "Final columns: the best exact objective each method reached with its "
              "whole budget (the gradient tuners: every exact evaluation they made)."]
    if doc.get("provenance"):
        from tuner.common.provenance import stamp_text

        lines += ["", stamp_text(doc["provenance"])]
    return "\n".join(lines) + "\n"


def render_plot(doc: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = doc["summary"]
    pbs = list(s["curves"])
    fig, axes = plt.subplots(1, len(pbs), figsize=(5.5 * len(pbs), 4.2), squeeze=False)
    budgets = np.asarray(s["budgets"], float)
    for ax, pb in zip(axes[0], pbs):
        for m in doc["methods"]:
            st = s["curves"][pb][m]["normalised"]
            ok = np.array([x["median"] is not None for x in st])
            if not ok.any():
                continue
            med = np.array([x["median"] for x in st], dtype=float)[ok]
            lo = np.array([x["min"] for x in st], dtype=float)[ok]
            hi = np.array([x["max"] for x in st], dtype=float)[ok]
            (line,) = ax.plot(budgets[ok], med, marker="o", ms=3, label=m,
                              drawstyle="steps-post")
            ax.fill_between(budgets[ok], lo, hi, color=line.get_color(), alpha=0.15,
                            step="post")
        ax.axhline(1 - TOLERANCE, color="k", lw=0.8, ls="--", label="within 1%")
        ax.set_xscale("log")
        ax.set_title(f"{pb} (d = {s['dims'][pb]})")
        ax.set_xlabel("budget (exact evaluations)")
        ax.set_ylabel("best exact objective / best found by any method")
        ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]), top=1.02)
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="lower right")
    fig.suptitle("Best exact objective vs budget: median over seeds, band = min-max")
    fig.tight_layout()
    buf = io.BytesIO()
    meta = None
    if doc.get("provenance"):  # the run's provenance line in the PNG, as in the markdown
        from experiments.results_io import png_metadata

        meta = png_metadata(doc["provenance"])
    fig.savefig(buf, format="png", dpi=120, metadata=meta)
    plt.close(fig)
    return buf.getvalue()
