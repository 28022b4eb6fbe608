"""Capacity (goodput) of the tuned policy vs its default and the baselines, per deployment.

``python -m experiments.capacity_table --out DIR [--cases a,b|engine|odma] [--budget N]
[--quick]``

Two groups of cases (:data:`CASES`, :data:`GROUPS`):

* ``engine`` (the default run): vLLM V1's engine arguments (system ``vllm-v1``) on the
  named deployments of ``tuner.scenario.deployments`` that meet issue 31's stakes
  criterion before any tuning (``experiments/deployment_stakes.py`` measures it on the
  same deployments), each tuned by its deployment's own tuner, as ``tuner.fit
  --deployment NAME`` runs it;
* ``odma``: ODMA's policy (system ``odma``) on variants of the ``mlu370-azure``
  deployment (the built-in workload, its KV cut to 200k tokens, the Azure conversation
  trace, ShareGPT; Mooncake by name only), where the stakes measurement found little at
  stake (``experiments/results/stakes/``).

For each case the script runs the fit in-process (``tuner.fit.main``: the fit's default
objective ``goodput_rps``, ``--export-anyway`` so the policy file is written whatever the
verdict), times it, and reads the exported policy file ``DIR/<case>.policy.json``
(kept). The fit validates the tuned policy, the default and every baseline of the system
(ODMA: static, paged, S3; vllm-v1: paged, vLLM V1's scheduler at its default arguments)
in exact mode on held-out windows x held-out seeds (mean with a Student-t 95% interval)
and on the whole slice, and states a verdict (``win`` / ``tie`` / ``loss``) on paired
held-out differences; this script only collects and tabulates what the fit measured.

Goodput (``tuner.objective.capacity``) is the highest arrival rate, the trace's own arrival
pattern rescaled, at which at least 90% of requests meet both the TTFT and the TPOT SLO.

Writes, atomically and again after every case (so an interrupted run keeps what it
finished): ``DIR/capacity_table.json``, ``DIR/capacity_table.md`` (one row per case x
policy, the verdict sentences, and a section generated from the verdicts) and
``DIR/capacity_table.png`` (held-out goodput with its 95% interval per case and policy).
Progress goes to stderr (the fit's own report too); the markdown is printed at the end.
Exit 0: every case produced a policy file; 1: some case failed (the others are written);
2: bad arguments (nothing written).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # progress from the first second (JAX loads with the fit)
    print("experiments.capacity_table: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

from tuner.common.atomic import (plain, savefig_atomic, write_json_atomic,
                                 write_text_atomic)  # noqa: E402
from experiments.results_io import png_metadata, stamp_markdown, stamped  # noqa: E402

__all__ = ["CASES", "ENGINE_CASES", "GROUPS", "QUICK_ARGS", "POLICIES", "chart_layout",
           "main", "run", "render_markdown", "render_png", "summarise_case"]

METRIC = "goodput_rps"  # the fit's default objective
N = "2000"
# the ODMA cases vary the built-in ODMA deployment (the fit's default is another one)
ODMA = ["--deployment", "mlu370-azure", "--system", "odma"]
# issue 31's deployments with stakes (tuner.scenario.deployments; their stakes:
# experiments/results/deployment_stakes/): vLLM V1's engine arguments, each case the fit
# on the named deployment as it stands
ENGINE_CASES = ("h100-interactive", "h100-azure-conv", "a100-interactive",
                "h100-14b-interactive")


def _case_system(case_argv: list[str]) -> str:
    """The system a case's fit tunes, as ``tuner.fit`` resolves it: ``--system`` if
    given, else its ``--deployment``'s."""
    from tuner.scenario.deployments import DEPLOYMENTS

    if "--system" in case_argv:
        return case_argv[case_argv.index("--system") + 1]
    return DEPLOYMENTS[case_argv[case_argv.index("--deployment") + 1]].system


def _engine_case(name: str) -> tuple[str, list[str], str]:
    from tuner.scenario.deployments import DEPLOYMENTS

    return (name, ["--deployment", name], DEPLOYMENTS[name].description)


# (name, fit arguments, one-line description)
CASES: tuple[tuple[str, list[str], str], ...] = (
    *(_engine_case(n) for n in ENGINE_CASES),
    ("builtin", ODMA,
     "ODMA on the built-in default workload: 2,000 requests derived from the Azure LLM "
     "2023 conversation trace, DeepSeek-R1-Distill-Qwen-7B on MLU370-X4"),
    ("builtin-tight", ODMA + ["--capacity-tokens", "200000"],
     "ODMA on the built-in workload with the KV capacity cut to 200k tokens, so memory "
     "binds"),
    ("azure-conv", ODMA + ["--trace", "azure-conv", "--n-requests", N],
     "ODMA on the Azure LLM inference 2023 conversation trace, its real arrivals (first "
     "2,000 requests)"),
    ("mooncake", ODMA + ["--trace", "mooncake", "--n-requests", N],
     "ODMA on the Mooncake conversation trace: bursty arrivals, long prompts (first "
     "2,000 requests)"),
    ("sharegpt", ODMA + ["--trace", "sharegpt", "--n-requests", N],
     "ODMA on ShareGPT chat lengths (first 2,000 requests); lengths only, so arrivals "
     "are drawn (the fit warns)"),
)
ALL_CASES = tuple(c[0] for c in CASES)
# the odma group leaves out mooncake: with SLOs of 25x the trace's *mean* uncontended
# latency its long-tailed prompts miss them even unloaded (goodput ~0.0006 req/s), and
# the nearly serial runs at that rate did not finish a fit in 8 minutes (README)
GROUPS = {"engine": ENGINE_CASES,
          "odma": ("builtin", "builtin-tight", "azure-conv", "sharegpt")}
CASE_NAMES = GROUPS["engine"]  # the default run
QUICK_CASES = ("builtin",)
QUICK_ARGS = ["--n-requests", "256", "--windows", "1", "--slots", "32", "--budget", "1",
              "--holdout-seeds", "2"]
# table order; baselines the system lists beyond these follow them
POLICIES = ("tuned", "default", "static", "paged", "s3")
CHART_POLICIES = ("tuned", "default", "static", "paged")
KEEP = ("slo_attainment", "ttft_p99_s", "tpot_p99_s", "saturation_tps", "goodput_scale")
COLORS = {"tuned": "tab:red", "default": "tab:brown", "static": "tab:gray",
          "paged": "tab:green", "s3": "tab:orange"}
OUTCOMES = ("win", "tie", "loss", "undetermined")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- reading
def _ci(m: dict, key: str) -> list:
    lo, hi = (m.get("ci") or {}).get(key) or [None, None]
    return [lo, hi]


def _policy_metrics(m: dict) -> dict:
    """What the table keeps of one policy's validation record (``doc['metrics'][...]``)."""
    w = m.get("whole_trace") or {}
    out = {METRIC: m.get(METRIC), f"{METRIC}_ci": _ci(m, METRIC),
           "samples": m.get("samples"),
           "whole_trace": {METRIC: w.get(METRIC), f"{METRIC}_ci": _ci(w, METRIC),
                           "samples": w.get("samples"),
                           **{k: w.get(k) for k in KEEP}}}
    for k in KEEP:
        out[k] = m.get(k)
        out[f"{k}_ci"] = _ci(m, k)
    return out


def summarise_case(doc: dict) -> dict:
    """The table's record of one case, from the fit's policy file ``doc``."""
    mets = doc["metrics"]
    policies = {"tuned": mets["tuned"], "default": mets["default"], **mets["baselines"]}
    order = [p for p in POLICIES if p in policies] + [p for p in policies
                                                      if p not in POLICIES]
    dep = doc.get("deployment") or {}
    derived = dep.get("derived") or {}
    defaults = {p["name"]: p.get("paper_default") for p in dep.get("parameters") or []
                if "name" in p}
    ver = doc["verdict"]
    wl = doc.get("workload") or {}
    return {
        "system": doc.get("system"),
        "verdict": {k: ver.get(k) for k in ("outcome", "sentence", "best_baseline",
                                            "comparisons")},
        "slo": doc.get("slo"),
        "workload": wl.get("summary"),
        "windows": wl.get("windows"),
        "train_windows": wl.get("train"),
        "holdout_windows": wl.get("holdout"),
        "prediction_source": wl.get("predictions"),
        "objective": doc.get("objective"),
        "rates_rps": (doc.get("tuner") or {}).get("rates_rps"),
        "tuner_steps": (doc.get("tuner") or {}).get("steps"),
        "policy_order": order,
        "policies": {p: _policy_metrics(policies[p]) for p in order},
        "params": doc.get("params"),
        "default_params": defaults or None,
        "bucket_bounds_tokens": derived.get("bucket_bounds_tokens"),
        "max_len_tokens": derived.get("max_len_tokens"),
        "scenario": doc.get("scenario"),
    }


# --------------------------------------------------------------------------- running
class _Tee(io.TextIOBase):
    """Writes through to ``sink`` and keeps a copy (the fit's warnings and errors)."""

    def __init__(self, sink):
        self.sink, self.parts = sink, []

    def write(self, s):
        self.sink.write(s)
        self.parts.append(s)
        return len(s)

    def flush(self):
        self.sink.flush()

    def lines(self, prefix: str) -> list[str]:
        return [ln[len(prefix):].strip() for ln in "".join(self.parts).splitlines()
                if ln.startswith(prefix)]


def _fit_argv(case_argv: list[str], quick: bool, budget: int | None, out: Path) -> list:
    argv = list(case_argv)
    if quick:
        argv += QUICK_ARGS
    if budget is not None:  # after QUICK_ARGS: the last --budget wins
        argv += ["--budget", str(budget)]
    return argv + ["--whole-slice", "--export-anyway", "--quiet", "--out", str(out)]


def run_case(name: str, case_argv: list[str], description: str, out_dir: Path,
             quick: bool, budget: int | None) -> dict:
    """One fit, in-process; its record for the table (``error`` set when it failed)."""
    from tuner import fit as fit_cli

    policy = out_dir / f"{name}.policy.json"
    argv = _fit_argv(case_argv, quick, budget, policy)
    entry = {"name": name, "description": description, "argv": list(case_argv),
             "fit_argv": ["python", "-m", "tuner.fit", *argv], "policy_file": policy.name}
    policy.unlink(missing_ok=True)  # never read a previous run's file for this one
    err = _Tee(sys.stderr)
    t = time.perf_counter()
    try:  # the fit's report (stdout) goes to stderr too: stdout carries the markdown
        with contextlib.redirect_stdout(err), contextlib.redirect_stderr(err):
            try:
                rc = fit_cli.main(argv)
            except SystemExit as e:  # argparse rejects an argument
                rc = e.code if isinstance(e.code, int) else 2
    except Exception as e:  # noqa: BLE001 - one failed case must not lose the others
        traceback.print_exc(file=sys.stderr)
        rc, entry["error"] = None, f"{type(e).__name__}: {e}"
    entry["wall_s"] = round(time.perf_counter() - t, 2)
    entry["exit_code"] = rc
    entry["exported"] = rc == 0
    entry["fit_warnings"] = err.lines("warning: ")
    if "error" not in entry:
        if rc in (0, 3) and policy.is_file():
            entry.update(summarise_case(json.loads(policy.read_text(encoding="utf-8"))))
        else:
            errs = err.lines("error: ")
            entry["error"] = (errs[-1] if errs else
                              f"tuner.fit exited {rc} without writing {policy.name}")
    return entry


def _previous(out_dir: Path) -> dict | None:
    """The cases of an earlier run in ``out_dir`` (for ``--append``)."""
    path = out_dir / "capacity_table.json"
    return json.loads(path.read_text(encoding="utf-8"))["cases"] if path.is_file() else None


def run(names: list[str], out_dir: Path, quick: bool = False,
        budget: int | None = None, keep: dict | None = None) -> dict:
    """Run the named cases in order, rewriting the three outputs after each one;
    ``keep``: cases of an earlier run to keep (those named here are rerun)."""
    t0 = time.perf_counter()
    cases = {c[0]: c for c in CASES}
    res = {"setup": {
        "systems": {n: _case_system(cases[n][1]) for n in names},
        "metric": METRIC,
        "objective": "the fit's default (goodput_rps)",
        "goodput": "highest arrival rate (the trace's own arrival pattern rescaled) at "
                   "which >= 90% of requests meet both the TTFT and the TPOT SLO "
                   "(tuner.objective.capacity)",
        "intervals": "Student-t 95% over held-out window x held-out seed samples "
                     "(held-out) or over seeds (whole slice), as computed by the fit",
        "quick": quick, "quick_args": QUICK_ARGS if quick else None,
        "budget": (budget if budget is not None else 1 if quick
                   else "the fit's default"),
        "cases": list(names),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds")},
        "cases": {k: v for k, v in (keep or {}).items() if k not in names}}
    if keep:
        res["setup"]["kept_from_an_earlier_run"] = sorted(res["cases"])
    from tuner.common import compile_cache

    compile_cache.enable()
    for i, name in enumerate(names):
        _, case_argv, desc = cases[name]
        _log(f"[{time.perf_counter() - t0:7.1f}s] case {name} ({i + 1}/{len(names)}): "
             f"start; python -m tuner.fit "
             + " ".join(_fit_argv(case_argv, quick, budget, out_dir / f"{name}.policy.json")))
        e = run_case(name, case_argv, desc, out_dir, quick, budget)
        res["cases"][name] = e
        if "error" in e:
            _log(f"[{time.perf_counter() - t0:7.1f}s] case {name}: FAILED after "
                 f"{e['wall_s']:.1f} s (exit {e['exit_code']}): {e['error']}")
        else:
            v, p = e["verdict"], e["policies"]
            best = v["best_baseline"]
            _log(f"[{time.perf_counter() - t0:7.1f}s] case {name}: done in "
                 f"{e['wall_s']:.1f} s, exit {e['exit_code']}, verdict {v['outcome']}; "
                 f"held-out goodput tuned {_num(p['tuned'][METRIC])} vs {best} "
                 f"{_num(p[best][METRIC])} req/s")
        res["setup"]["runtime_s"] = round(time.perf_counter() - t0, 1)
        res["findings"] = findings(res)
        write_outputs(res, out_dir)
    return res


def write_outputs(res: dict, out_dir: Path) -> None:
    res = stamped(res)
    write_json_atomic(out_dir / "capacity_table.json", plain(res), sort_keys=False)
    write_text_atomic(out_dir / "capacity_table.md",
                      stamp_markdown(render_markdown(res), res["provenance"]))
    render_png(res, out_dir / "capacity_table.png")


# --------------------------------------------------------------------------- report
def _ok(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _num(x, fmt: str = ".4g") -> str:
    return format(x, fmt) if _ok(x) else "—"


def _with_ci(x, ci) -> str:
    lo, hi = ci or (None, None)
    if _ok(lo) and _ok(hi):
        return f"{_num(x)} [{_num(lo, '.3g')}, {_num(hi, '.3g')}]"
    return _num(x)


def _pct(x) -> str:
    return f"{x:+.1%}" if _ok(x) else "—"


def _spread(e: dict) -> float | None:
    vals = [m[METRIC] for m in e["policies"].values() if _ok(m[METRIC])]
    if not vals or min(vals) <= 0:
        return None
    return max(vals) / min(vals) - 1.0


def _same_as_default(e: dict) -> bool:
    c = e["verdict"]["comparisons"].get("default") or {}
    return c.get("diff") == 0 and list(c.get("ci") or []) == [0, 0]


def _winner(e: dict) -> str | None:
    """In a loss: the policy the tuned one is worse than with the highest goodput."""
    worse = [n for n, c in e["verdict"]["comparisons"].items() if c.get("status") == "worse"]
    if not worse:
        return None
    return max(worse, key=lambda n: e["policies"].get(n, {}).get(METRIC) or -math.inf)


def findings(res: dict) -> dict:
    """The cases grouped by verdict, with the numbers the markdown cites."""
    groups: dict = {o: [] for o in OUTCOMES}
    groups["failed"] = []
    for name, e in res["cases"].items():
        if "error" in e:
            groups["failed"].append({"case": name, "error": e["error"]})
            continue
        v = e["verdict"]
        best = v["best_baseline"]
        other = _winner(e) if v["outcome"] == "loss" else best
        c = v["comparisons"].get(other) or {}
        groups.setdefault(v["outcome"], []).append({
            "case": name, "against": other, "relative": c.get("relative"),
            "diff": c.get("diff"), "ci": c.get("ci"),
            "tuned": e["policies"]["tuned"][METRIC],
            "other": e["policies"].get(other, {}).get(METRIC),
            "policy_spread": _spread(e), "tuned_equals_default": _same_as_default(e)})
    return groups


def _group_line(r: dict) -> str:
    ci = r.get("ci")
    return (f"{r['case']} (tuned {_num(r['tuned'])} vs {r['against']} {_num(r['other'])} "
            f"req/s, {_pct(r['relative'])}; " + (
                f"paired 95% interval of the difference [{_num(ci[0], '.3g')}, "
                f"{_num(ci[1], '.3g')}])" if ci else "no interval)"))


def _findings_md(res: dict) -> list[str]:
    f = res["findings"]
    n = sum(len(f[o]) for o in OUTCOMES)
    L = ["## Where tuning wins and where a baseline wins", ""]
    if not n:
        L += ["No case finished.", ""]
        return L
    heads = {"win": "Tuning wins (better than every baseline on held-out data, not worse "
                    "than the default)",
             "tie": "Indistinguishable (no baseline and not the default is better; tuned "
                    "is not better than every baseline)",
             "loss": "A baseline or the default wins (better than tuned on held-out data)",
             "undetermined": "Undetermined (too few independent held-out samples, or "
                             "paired differences all equal: no interval)"}
    for o in OUTCOMES:
        rows = f[o]
        L.append(f"- {heads[o]}: {len(rows)} of {n} case(s)"
                 + (": " + "; ".join(_group_line(r) for r in rows) if rows else "") + ".")
    if f["failed"]:
        L.append("- Failed (no policy file): " + "; ".join(
            f"{r['case']} ({r['error']})" for r in f["failed"]) + ".")
    rows = [r for o in OUTCOMES for r in f[o]]
    spread = [r for r in rows if r["policy_spread"] is not None]
    if spread:
        hi = max(spread, key=lambda r: r["policy_spread"])
        lo = min(spread, key=lambda r: r["policy_spread"])
        s = (f"- Spread of held-out goodput across all policies (best / worst - 1): "
             f"largest in {hi['case']} ({hi['policy_spread']:.1%})")
        if lo is not hi:
            s += f", smallest in {lo['case']} ({lo['policy_spread']:.1%})"
        L.append(s + "; where it is small, the memory policy does not decide goodput on "
                 "that workload.")
    same = [r["case"] for r in rows if r["tuned_equals_default"]]
    if same:
        L.append("- The tuned policy scored exactly as the default on every held-out "
                 "sample in: " + ", ".join(same) + " (the fit did not move the outcome).")
    L.append("")
    return L


def _tuned(e: dict) -> str:
    """The tuned policy in a cell: ODMA's bucket bounds (tokens), else its parameters
    (an engine's policy file derives one 'bucket', its KV block, which says nothing)."""
    if e.get("system", "odma") == "odma" and e.get("bucket_bounds_tokens"):
        return f"bounds {e['bucket_bounds_tokens']} tokens"
    params = e.get("params") or {}
    return ", ".join(f"{k} {_num(v) if _ok(v) else v}" for k, v in params.items()) or "—"


def render_markdown(res: dict) -> str:
    s = res["setup"]
    cases = res["cases"]
    L = ["# Goodput of the tuned policy vs its default and the baselines", ""]
    systems = sorted(set((s.get("systems") or {}).values()) | {
        e["system"] for e in cases.values() if e.get("system")})
    L.append(f"Systems {', '.join(systems)}; objective {s['objective']}: {s['goodput']}. "
             f"Budget: {s['budget']}"
             + ("; quick run (" + " ".join(s["quick_args"]) + ")" if s["quick"] else "")
             + f". Intervals: {s['intervals']}.")
    L.append("")
    L.append("| case | system | description | requests | trace rate (req/s) | SLO TTFT / "
             "TPOT (s) | fit wall (s) | exit | verdict | tuned policy |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for name, e in cases.items():
        if "error" in e:
            L.append(f"| {name} | — | {e['description']} | — | — | — | {e['wall_s']:.0f} | "
                     f"{e['exit_code']} | failed: {e['error']} | — |")
            continue
        w, slo = e.get("workload") or {}, e.get("slo") or {}
        L.append(f"| {name} | {e.get('system') or '—'} | {e['description']} | "
                 f"{w.get('requests', '—')} | "
                 f"{_num(w.get('rate_rps'), '.3g')} | {_num(slo.get('ttft_s'), '.3g')} / "
                 f"{_num(slo.get('tpot_s'), '.3g')} | {e['wall_s']:.0f} | "
                 f"{e['exit_code']} | {e['verdict']['outcome']} | {_tuned(e)} |")
    L.append("")
    L.append("## Goodput per case and policy")
    L.append("")
    L.append("Goodput in req/s. Held-out: mean over held-out windows x seeds [95% "
             "interval]; whole slice: mean over seeds [95% interval]. TTFT/TPOT p99 and "
             "SLO attainment: held-out means, at the goodput operating point.")
    L.append("")
    L.append("| case | policy | goodput, held-out [95% CI] | goodput, whole slice | "
             "TTFT p99 (s) | TPOT p99 (s) | SLO attainment |")
    L.append("|---|---|---|---|---|---|---|")
    for name, e in cases.items():
        if "error" in e:
            continue
        for p in e["policy_order"]:
            m = e["policies"][p]
            w = m["whole_trace"]
            label = f"**{p}**" if p == "tuned" else p
            L.append(f"| {name} | {label} | {_with_ci(m[METRIC], m[METRIC + '_ci'])} | "
                     f"{_with_ci(w[METRIC], w[METRIC + '_ci'])} | "
                     f"{_num(m['ttft_p99_s'], '.3g')} | {_num(m['tpot_p99_s'], '.3g')} | "
                     f"{_num(m['slo_attainment'], '.3f')} |")
    L.append("")
    L.append("## Verdicts")
    L.append("")
    for name, e in cases.items():
        if "error" in e:
            L.append(f"- **{name}**: failed ({e['error']}).")
        else:
            L.append(f"- **{name}** ({e['verdict']['outcome']}): {e['verdict']['sentence']}")
    L.append("")
    L += _findings_md(res)
    L.append(f"Runtime {s.get('runtime_s', 0):.0f} s. Policy files: "
             + ", ".join(e["policy_file"] for e in cases.values() if "error" not in e)
             + ".")
    return "\n".join(L) + "\n"


def render_png(res: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names, scale, shown = chart_layout(res)
    scale = np.asarray(scale)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.9 * len(names) + 3.5), 4.6))
    k = len(shown)
    width = 0.8 / k
    x = np.arange(len(names))
    for i, p in enumerate(shown):
        ms = [res["cases"][n]["policies"].get(p) for n in names]
        vals = np.array([m[METRIC] if m and _ok(m[METRIC]) else np.nan for m in ms])
        err = np.zeros((2, len(names)))
        for j, m in enumerate(ms):
            lo, hi = (m or {}).get(METRIC + "_ci") or (None, None)
            if _ok(lo) and _ok(hi) and np.isfinite(vals[j]):
                err[:, j] = [max(vals[j] - lo, 0.0), max(hi - vals[j], 0.0)]
        pos = x + (i - (k - 1) / 2) * width
        ax.bar(pos, vals / scale, width, yerr=err / scale, capsize=3, label=p,
               color=COLORS.get(p), error_kw={"lw": 0.9})
        whole = np.array([m["whole_trace"][METRIC] if m and _ok(m["whole_trace"][METRIC])
                          else np.nan for m in ms])
        ax.plot(pos, whole / scale, "kx", ms=5, label="whole slice" if i == 0 else None)
    ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
    ax.set_xticks(x, [f"{n}\n({res['cases'][n]['verdict']['outcome']}; default "
                      f"{_num(s)} req/s)" for n, s in zip(names, scale)], fontsize=8)
    ax.set_ylabel("goodput / the default's (held out)")
    ax.set_title("Held-out goodput over each case's default, mean with 95% interval "
                 "(x: whole slice)", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    meta = {"metadata": png_metadata(res["provenance"])} if "provenance" in res else {}
    savefig_atomic(fig, path, dpi=110, **meta)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI
def chart_layout(res: dict) -> tuple[list, list, list]:
    """The chart's cases, each case's unit and the policies drawn. Each case is drawn
    over its own default's held-out mean goodput (1 where it has none), so that cases
    whose goodputs differ tenfold share one axis; a policy that no case ran (static for
    vLLM's engine cases) gets no bar and no legend entry."""
    names = [n for n, e in res["cases"].items() if "error" not in e]
    scale = []
    for n in names:
        v = (res["cases"][n]["policies"].get("default") or {}).get(METRIC)
        scale.append(float(v) if _ok(v) and v > 0 else 1.0)
    shown = [p for p in CHART_POLICIES
             if any(res["cases"][n]["policies"].get(p) for n in names)]
    return names, scale, shown


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.capacity_table",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True,
                    help="folder for the table files and the per-case policy files")
    ap.add_argument("--cases", default=None,
                    help="comma-separated cases or groups: " + ", ".join(ALL_CASES)
                    + "; groups " + ", ".join(f"{g} ({', '.join(c)})" for g, c in
                                              GROUPS.items())
                    + " (default: engine; with --quick: " + ", ".join(QUICK_CASES) + ")")
    ap.add_argument("--budget", type=int, default=None,
                    help="optimiser steps per fit (default: the fit's default)")
    ap.add_argument("--append", action="store_true",
                    help="keep the cases already in DIR/capacity_table.json (rerun "
                    "or add the named ones)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny fits for tests: " + " ".join(QUICK_ARGS))
    args = ap.parse_args(argv)
    if args.cases is None:
        names = list(QUICK_CASES if args.quick else CASE_NAMES)
    else:
        names = [n for c in args.cases.split(",") if c.strip()
                 for n in GROUPS.get(c.strip(), (c.strip(),))]
        bad = [c for c in names if c not in ALL_CASES]
        if bad or not names:
            return _error(f"--cases: unknown case(s) {', '.join(bad) or '(none given)'}; "
                          f"choose from {', '.join(ALL_CASES)} or the groups "
                          f"{', '.join(GROUPS)}")
        names = list(dict.fromkeys(names))
    if args.budget is not None and args.budget < 1:
        return _error(f"--budget must be >= 1, got {args.budget}")
    if args.out.exists() and not args.out.is_dir():
        return _error(f"--out {args.out}: exists and is not a directory")
    args.out.mkdir(parents=True, exist_ok=True)
    res = run(names, args.out, quick=args.quick, budget=args.budget,
              keep=_previous(args.out) if args.append else None)
    print(render_markdown(res))
    return 1 if any("error" in e for e in res["cases"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
