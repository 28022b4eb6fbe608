"""Pareto fronts, tables and the Pareto plot of a sweep (NumPy and matplotlib only).

A sweep row is ``{"index", "system", "hardware", "model", "trace", "params": {...},
"metrics": {...}}``. Two trade-offs are marked and drawn: throughput against p99 time
to first token, and KV utilisation against migration rate. Every file is rendered to
bytes first and written (atomically, one by one) only once all of them rendered.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np

from tuner.common.atomic import plain, write_bytes_atomic

__all__ = ["FRONTS", "TABLE_METRICS", "fronts", "human", "mark_pareto", "pareto_mask",
           "plot_pareto", "summary_line", "to_csv", "to_markdown", "write_outputs"]

# name -> ((x metric, maximise x?), (y metric, maximise y?), panel title)
FRONTS = {
    "tps_ttft": (("ttft_p99_s", False), ("tps", True), "TPS vs p99 TTFT"),
    "util_migration": (("migration_rate", False), ("kv_utilization", True),
                       "KV utilisation vs migration rate"),
}
TABLE_METRICS = ("objective", "goodput_rps", "saturation_tps", "tps", "kv_utilization",
                 "ttft_p99_s", "tpot_p99_s", "migration_rate", "unserved")
TOP = 20


def fronts(rows: list[dict]) -> dict:
    """The :data:`FRONTS` whose two metrics the rows' system reports."""
    have = set(rows[0]["metrics"]) if rows else set()
    return {k: v for k, v in FRONTS.items() if {v[0][0], v[1][0]} <= have}


def table_metrics(rows: list[dict]) -> list[str]:
    have = set(rows[0]["metrics"]) if rows else set()
    return [m for m in TABLE_METRICS if m in have]


def human(v):
    """float32 values as the shortest decimals that round-trip (0.9, not 0.8999...)."""
    a = np.asarray(v, np.float32)
    out = [float(str(x)) for x in a.reshape(-1)]
    return out if a.ndim else out[0]


def pareto_mask(x, y, maximize=(True, True)) -> np.ndarray:
    """Non-dominated points of ``(x, y)``; non-finite points are never on the front."""
    pts = np.stack([np.asarray(x, np.float64), np.asarray(y, np.float64)], 1)
    pts = pts * np.where(maximize, 1.0, -1.0)  # now both are maximised
    ok = np.all(np.isfinite(pts), 1)
    mask = np.zeros(len(pts), bool)
    cand = pts[ok]
    keep = np.ones(len(cand), bool)
    for s in range(0, len(cand), 1024):  # bounded memory: 1024 x n at a time
        a = cand[s:s + 1024, None, :]
        dominated = np.all(cand[None] >= a, -1) & np.any(cand[None] > a, -1)
        keep[s:s + 1024] = ~np.any(dominated, 1)
    mask[np.flatnonzero(ok)] = keep
    return mask


def mark_pareto(rows: list[dict]) -> list[dict]:
    """Set ``row["pareto"] = {front name: bool}`` for every front in :data:`FRONTS` (of
    the metrics the system reports)."""
    for name, ((xm, xmax), (ym, ymax), _) in fronts(rows).items():
        x = [r["metrics"][xm] for r in rows]
        y = [r["metrics"][ym] for r in rows]
        for r, on in zip(rows, pareto_mask(x, y, (xmax, ymax))):
            r.setdefault("pareto", {})[name] = bool(on)
    return rows


def _param_columns(rows) -> list[tuple[str, str, int | None]]:
    cols = []
    for k, v in rows[0]["params"].items():
        if isinstance(v, list):
            cols += [(f"{k}[{i}]", k, i) for i in range(len(v))]
        else:
            cols.append((k, k, None))
    return cols


def _param(row, key, i):
    v = row["params"][key]
    return v if i is None else v[i]


def to_csv(rows: list[dict]) -> str:
    pcols = _param_columns(rows)
    mcols = list(rows[0]["metrics"])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["index", "system", "hardware", "model", "trace"]
               + [c for c, _, _ in pcols] + mcols + [f"pareto_{f}" for f in fronts(rows)])
    for r in rows:
        w.writerow([r["index"], r["system"], r["hardware"], r["model"], r["trace"]]
                   + [_param(r, k, i) for _, k, i in pcols]
                   + [r["metrics"][m] for m in mcols]
                   + [int(r.get("pareto", {}).get(f, False)) for f in fronts(rows)])
    return buf.getvalue()


def _fmt(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return "nan" if not math.isfinite(v) else f"{v:.4g}"
    return str(v)


def _objective_key(r):
    v = r["metrics"]["objective"]
    return -v if math.isfinite(v) else math.inf


def to_markdown(rows: list[dict], meta: dict | None = None, top: int = TOP) -> str:
    """Rows sorted by objective: the best ``top`` plus every Pareto-optimal row."""
    ranked = sorted(rows, key=_objective_key)
    shown = [(k + 1, r) for k, r in enumerate(ranked)
             if k < top or any(r.get("pareto", {}).values())]
    pnames = list(rows[0]["params"])
    head = (["rank", "#", "hardware", "trace"] + pnames + table_metrics(rows)
            + ["pareto"])
    lines = []
    if meta:
        lines += [(f"# Sweep: {meta.get('system')} ({meta.get('n_points')} points, "
                   f"{meta.get('steps')} iterations, "
                   f"objective `{meta.get('objective')}`)"), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, r in shown:
        marks = ",".join(f for f, on in r.get("pareto", {}).items() if on)
        cells = ([rank, r["index"], r["hardware"], r["trace"]]
                 + [r["params"][k] for k in pnames]
                 + [r["metrics"][m] for m in table_metrics(rows)] + [marks or ""])
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    lines += ["", f"Top {top} by objective, plus Pareto-optimal rows (pareto: "
              + "; ".join(f"{k} = {v[2]}" for k, v in fronts(rows).items()) + ")."]
    return "\n".join(lines) + "\n"


def summary_line(rows: list[dict], meta: dict) -> str:
    best = min(rows, key=_objective_key)
    return (f"{len(rows)} points x {meta['steps']} iterations on {meta['devices']} "
            f"{meta['platform']} device(s) in {meta['wall_s']:.1f} s; best objective "
            f"{best['metrics']['objective']:.6g} (#{best['index']}: "
            f"{best['hardware']}, {best['trace']}, {best['params']})")


def plot_pareto(rows: list[dict], path, title: str = "") -> None:
    """Two panels, one per front; points coloured by hardware and trace. ``path`` is a
    file name or a binary file object (PNG is written)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["hardware"], r["trace"]) for r in rows})
    colours = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
    shown = fronts(rows)
    fig, axes = plt.subplots(1, max(len(shown), 1), figsize=(6.2 * max(len(shown), 1), 4.8))
    axes = np.atleast_1d(axes)
    for ax, (name, ((xm, _), (ym, _), label)) in zip(axes, shown.items()):
        for g, (hw, tr) in enumerate(groups):
            sel = [r for r in rows if (r["hardware"], r["trace"]) == (hw, tr)]
            ax.scatter([r["metrics"][xm] for r in sel], [r["metrics"][ym] for r in sel],
                       s=18, alpha=0.6, color=colours(g % colours.N),
                       label=f"{hw} · {Path(tr).name}")
        front = sorted((r for r in rows if r.get("pareto", {}).get(name)),
                       key=lambda r: r["metrics"][xm])
        if front:
            fx = [r["metrics"][xm] for r in front]
            fy = [r["metrics"][ym] for r in front]
            ax.step(fx, fy, where="post", color="black", lw=1.0)
            ax.scatter(fx, fy, s=60, facecolors="none", edgecolors="black", lw=1.2,
                       label="Pareto front")
        ax.set_xlabel(xm)
        ax.set_ylabel(ym)
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def write_outputs(out_dir, rows: list[dict], meta: dict,
                  provenance: dict | None = None) -> list[Path]:
    """Write sweep.json, sweep.csv, sweep.md, pareto.png: all four are rendered to bytes
    first, so a failure while rendering writes nothing; then each is written
    atomically, and a failure while writing removes those already written. ``provenance`` (``tuner.common.provenance.provenance()``) goes into
    sweep.json's top level."""
    out = Path(out_dir)
    prov = {} if provenance is None else {"provenance": provenance}
    doc = json.dumps(plain({"schema": "kvtune.sweep/1", "meta": meta, "rows": rows,
                            **prov}),
                     indent=2, sort_keys=True, allow_nan=False) + "\n"
    data = {name: text.encode("utf-8") for name, text in (
        ("sweep.json", doc), ("sweep.csv", to_csv(rows)),
        ("sweep.md", to_markdown(rows, meta)))}
    png = io.BytesIO()
    plot_pareto(rows, png, title=f"{meta.get('system', '')} sweep")
    data["pareto.png"] = png.getvalue()
    done: list[Path] = []
    try:  # all or nothing: what was written is removed when a later file fails
        for name, b in data.items():
            done.append(write_bytes_atomic(out / name, b))
    except BaseException:
        for path in done:
            path.unlink(missing_ok=True)
        raise
    return done
