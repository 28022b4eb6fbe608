"""Explain an exported policy for a person: ``python -m tuner.explain POLICY.json``.

Prints the system, hardware and model; the workload it was tuned on and the SLOs; the
objective; the parameters (value, unit, meaning); what they come to on this workload
(bucket bounds, pool sizes in tokens and bytes, the reservation rules); the server the
simulation assumed; the equivalent vLLM engine arguments and command; where the length
predictions came from; tuned vs default vs baseline metrics (``mean [lo, hi]`` where
the file has confidence intervals) and the verdict. Sections the file lacks are skipped.
``--json`` prints the deployment section (from :func:`tuner.export.deployment.describe`) as
JSON; ``--derive`` computes it from the policy's scenario when the file has none (this
builds the scenario, so it needs the trace). A bad file prints one ``error: ...`` line
and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from tuner.export.policy import load_policy

__all__ = ["main", "render"]

METRIC_COLUMNS = ("goodput_rps", "saturation_tps", "ttft_p99_s", "tpot_p99_s",
                  "slo_attainment")


def _get(d, *keys):
    """``d[k1][k2]...`` or None where a level is missing or not a dict."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _fmt(v, digits: int = 6) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x, digits) for x in v) + "]"
    return str(v)


def _table(headers, rows, indent: str = "  ") -> list[str]:
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]

    def line(cells):
        return (indent + "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _flat(d, prefix: str = "") -> list[tuple[str, object]]:
    """Nested dicts as ``(dotted.key, value)`` pairs, in order."""
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out += _flat(v, key + ".")
        else:
            out.append((key, v))
    return out


def _pairs(d, indent: str = "  ") -> list[str]:
    items = _flat(d)
    width = max((len(k) for k, _ in items), default=0)
    return [f"{indent}{k.ljust(width)}  {_fmt(v)}" for k, v in items]


def _cell(summary, metric: str) -> str:
    v = summary.get(metric) if isinstance(summary, dict) else None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    ci = _get(summary, "ci", metric)
    if isinstance(ci, (list, tuple)) and len(ci) == 2 \
            and all(isinstance(x, (int, float)) for x in ci):
        return f"{v:.4g} [{ci[0]:.4g}, {ci[1]:.4g}]"
    return f"{v:.4g}"


def _parameters(doc) -> list[dict]:
    params = _get(doc, "deployment", "parameters")
    if isinstance(params, list) and all(isinstance(p, dict) for p in params):
        return params
    from models import get_system

    values = doc.get("params") or {}
    return [{"name": p.name, "value": values.get(p.name), "unit": p.unit,
             "meaning": p.doc} for p in get_system(doc["system"]).params]


def _header(doc) -> list[str]:
    out = [f"{doc['system']} policy for {doc['model']} on {doc['hardware']}"]
    made = [f"{k} {doc[k]}" for k in ("created", "version") if doc.get(k)]
    if made:
        out.append("  " + ", ".join(made) + f", schema {doc.get('schema')}")
    return out


def _workload(doc) -> list[str]:
    s = _get(doc, "workload", "summary")
    if not isinstance(s, dict):
        return []
    out = ["", "Workload"]
    head = [f"{_fmt(s.get('requests'))} requests"]
    if isinstance(s.get("duration_s"), (int, float)):
        head.append(f"over {s['duration_s']:.4g} s")
    if isinstance(s.get("source"), str):
        head.append(f"from {s['source']}")
    out.append("  " + " ".join(head))
    rows = [[name.replace("_", " ")] + [_fmt(_get(s, name, q), 5)
                                        for q in ("mean", "p50", "p99", "max")]
            for name in ("prompt_tokens", "output_tokens") if isinstance(s.get(name), dict)]
    if rows:
        out += _table(["lengths", "mean", "p50", "p99", "max"], rows)
    pred = _get(doc, "workload", "predictions")
    if pred:
        out.append(f"  length predictions: {pred}")
    hold = _get(doc, "workload", "holdout")
    if hold:
        out.append(f"  metrics measured on: {hold}")
    return out


def _slo(doc) -> list[str]:
    slo = doc.get("slo")
    if not isinstance(slo, dict):
        return []
    parts = [f"TTFT <= {_fmt(slo.get('ttft_s'))} s", f"TPOT <= {_fmt(slo.get('tpot_s'))} s"]
    src = f" (source: {slo['source']})" if slo.get("source") else ""
    return ["", "SLOs: " + ", ".join(parts) + src]


def _deployment(dep) -> list[str]:
    if not isinstance(dep, dict):
        return ["", "Deployment: not in this file (--derive computes it from the "
                    "policy's scenario)"]
    out = []
    derived = dep.get("derived")
    if isinstance(derived, dict) and derived:
        out += ["", f"Derived on this workload ({dep.get('system', '')}, at the start "
                    "of a run)", *_pairs(derived)]
    server = dep.get("server")
    if isinstance(server, dict):
        out += ["", "Server (as simulated)", *_pairs(server)]
    vllm = dep.get("vllm")
    if isinstance(vllm, dict):
        out += ["", f"vLLM engine arguments ({vllm.get('applies_to', 'paged')})"]
        if isinstance(vllm.get("args"), dict):
            out += _pairs(vllm["args"])
        if vllm.get("request_max_tokens") is not None:
            out.append(f"  per-request max_tokens  {_fmt(vllm['request_max_tokens'])}")
        if vllm.get("command"):
            out += ["  command:", f"    {vllm['command']}"]
        for note in vllm.get("notes") or ():
            out.append(f"  note: {note}")
    pred = dep.get("predictor")
    if isinstance(pred, dict):
        out += ["", "Length predictions",
                f"  source  {_fmt(pred.get('source'))}"]
        if pred.get("path"):
            out.append(f"  path    {pred['path']}")
        if pred.get("note"):
            out.append(f"  note    {pred['note']}")
    return out


def _metrics(doc) -> list[str]:
    mets = doc.get("metrics")
    if not isinstance(mets, dict):
        return []
    rows = [(name, mets[name]) for name in ("tuned", "default")
            if isinstance(mets.get(name), dict)]
    bases = mets.get("baselines")
    if isinstance(bases, dict) and bases:
        rows += [(f"baseline {b}", m) for b, m in bases.items() if isinstance(m, dict)]
    elif isinstance(mets.get("baseline"), dict):
        base = mets["baseline"]
        rows.append((f"baseline {base.get('system', '')}".rstrip(), base))
    if not rows:
        return []
    cols = ["objective"] + [c for c in METRIC_COLUMNS
                            if any(isinstance(m.get(c), (int, float)) for _, m in rows)]
    return ["", "Metrics (exact mode)",
            *_table(["run", *cols], [[name, *(_cell(m, c) for c in cols)]
                                     for name, m in rows])]


def render(doc: dict) -> str:
    """The explanation of a loaded policy document (see the module docstring)."""
    out = _header(doc) + _workload(doc) + _slo(doc)
    if doc.get("objective"):
        out += ["", f"Objective: {doc['objective']}"]
    params = _parameters(doc)
    if params:
        out += ["", "Parameters",
                *_table(["name", "value", "default", "unit", "meaning"],
                        [[p.get("name"), _fmt(p.get("value")),
                          _fmt(p.get("paper_default")), p.get("unit", ""),
                          p.get("meaning", "")] for p in params])]
    out += _deployment(doc.get("deployment"))
    out += _metrics(doc)
    sentence = _get(doc, "verdict", "sentence")
    if sentence:
        outcome = _get(doc, "verdict", "outcome")
        out += ["", f"Verdict ({outcome}): {sentence}" if isinstance(outcome, str)
                else f"Verdict: {sentence}"]
        if outcome == "undetermined":  # written only with --export-anyway
            n, k = _get(doc, "verdict", "n_samples"), _get(doc, "verdict", "n_independent")
            out.append("The held-out data cannot decide between the tuned policy and the "
                       "others (not a tie: no interval could be drawn"
                       + (f"; {k} independent of {n} held-out samples" if k is not None
                          and n is not None else "") + "); tuner.fit exported it only "
                       "because --export-anyway was given.")
    return "\n".join(out) + "\n"


def _derive(doc: dict) -> dict:
    from tuner.export.deployment import describe
    from tuner.scenario import ScenarioSpec, build_scenario

    sc = build_scenario(ScenarioSpec.from_dict(doc["scenario"]))
    return describe(sc, doc["system"], doc["params"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.explain",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("policy", help="exported policy JSON (from python -m tuner.fit)")
    ap.add_argument("--json", action="store_true",
                    help="print the deployment section as JSON")
    ap.add_argument("--derive", action="store_true",
                    help="compute the deployment section from the policy's scenario "
                         "when the file has none (builds the scenario: needs its trace)")
    args = ap.parse_args(argv)
    try:
        doc = load_policy(args.policy)
        if args.derive and not isinstance(doc.get("deployment"), dict):
            doc["deployment"] = _derive(doc)
        if args.json:
            dep = doc.get("deployment")
            if not isinstance(dep, dict):
                print(f"note: {args.policy} has no deployment section (--derive "
                      "computes it)", file=sys.stderr)
                dep = {}
            text = json.dumps(dep, indent=2) + "\n"
        else:
            text = render(doc)
    except (ValueError, OSError, KeyError, TypeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
