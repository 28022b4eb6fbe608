"""The operator's map of a tuned ``vllm-v1`` deployment: which engine arguments matter,
and goodput and tail latencies over the two that matter most.

:func:`influence` moves each tunable engine argument alone across its range (the others
at the tuned point) and scores it by the searches' own exact training objective (the
fixed-horizon goodput ladder on the training windows, ``Problem.batch``): the spread
(best - worst) ranks the arguments. Each argument's values start where vLLM starts
(:func:`feasible_lower`: a token budget below ``max_num_seqs`` is refused, and would
otherwise fill the sweep with zeros); a setting vLLM still refuses serves nothing
(goodput 0, no latencies). :func:`grid_map` evaluates a grid over the two
arguments with the largest spread (the others at the tuned point): the exact goodput,
and TTFT / TPOT p99 at one fixed load, the goodput vLLM's default sustains (the load an
operator already serves, so the panels show what a setting does to it).
:func:`plot` draws the three panels with the default and the tuned point marked.

Used by :mod:`experiments.engine_tune` (``engine_tune_<case>.png``); the numbers behind
each figure are in ``engine_tune.json`` under the case's ``map``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["axis_values", "feasible_lower", "grid_map", "influence", "plot"]

POINTS = 5  # values per argument in the sweeps and per axis of the grid


def _range(spec, name: str, upper: float | None = None) -> tuple[float, float, bool]:
    ps = next(p for p in spec.params if p.name == name)
    hi = float(ps.upper) if upper is None else min(float(ps.upper), float(upper))
    return float(ps.lower), hi, ps.domain == "int_log"


def _spaced(lo: float, hi: float, points: int, log: bool) -> list[float]:
    if log:
        return [float(v) for v in np.unique(np.round(np.geomspace(lo, hi, points)))]
    return [float(v) for v in np.round(np.linspace(lo, hi, points), 4)]


def axis_values(spec, name: str, points: int, include=(), upper: float | None = None,
                lower: float | None = None):
    """``points`` values of the tunable argument ``name`` across its range (log-spaced
    for an ``int_log`` domain, integers), widened to hold the values in ``include``;
    ``upper`` caps the range (the slot table for ``max_num_seqs``), ``lower`` raises its
    low end (where vLLM starts: :func:`feasible_lower`)."""
    lo, hi, log = _range(spec, name, upper)
    if lower is not None:
        lo = max(lo, float(lower))
    lo = min([lo, *map(float, include)])
    hi = max([hi, *map(float, include)])
    return _spaced(lo, hi, points, log)


FINE = 41  # candidate values per argument when looking for where vLLM starts


def feasible_lower(spec, deployment, base: dict, name: str, others=None,
                   upper: float | None = None) -> float | None:
    """The smallest of :data:`FINE` candidate values of ``name`` across its range at
    which vLLM starts (the system's ``refusal`` is None) for some combination of the
    candidate values in ``others`` ({argument: values}; the rest at ``base``); None
    where it starts at none. The map's axes begin there, so that its cells are not
    spent on settings vLLM refuses (a token budget below ``max_num_seqs``)."""
    import itertools

    lo, hi, log = _range(spec, name, upper)
    others = others or {}
    combos = list(itertools.product(*others.values())) or [()]
    for v in _spaced(lo, hi, FINE, log):
        for combo in combos:
            p = {**base, name: v, **dict(zip(others, combo))}
            if spec.refusal(deployment, {k: float(x) for k, x in p.items()}) is None:
                return v
    return None


def _at_load(train, system: str, settings: list[dict], load_rps: float, log) -> list:
    """Each setting's exact metrics in one run to completion per training window at
    ``load_rps`` (their mean), None for a setting vLLM would refuse at start-up."""
    from models import get_system
    from tuner.objective.evaluate import evaluate_many

    spec = get_system(system)
    dep = train[0].deployment
    ok = [i for i, p in enumerate(settings)
          if spec.refusal(dep, {k: float(v) for k, v in p.items()}) is None]
    scs = tuple(sc.at_rate(load_rps) for sc in train)
    res = evaluate_many([(scs, system, settings[i]) for i in ok],
                        objective="slo_attainment", log=log)
    out = [None] * len(settings)
    for i, m in zip(ok, res):
        out[i] = m
    return out


def influence(score, system: str, deployment, tuned: dict, default: dict, *, slots: int,
              points: int = POINTS) -> dict:
    """Each tunable argument's goodput sweep around the tuned point (``score(settings)``:
    the training objective of each setting): ``{name: {"values", "goodput",
    "spread"}}``, ranked by spread (largest first)."""
    from models import get_system

    spec = get_system(system)
    out = {}
    for ps in spec.params:
        if not ps.tunable:
            continue
        upper = slots if ps.name == "max_num_seqs" else None
        vals = axis_values(spec, ps.name, points, (tuned[ps.name], default[ps.name]),
                           upper=upper, lower=feasible_lower(spec, deployment, tuned,
                                                            ps.name, upper=upper))
        g = [float(x) for x in score([{**tuned, ps.name: v} for v in vals])]
        out[ps.name] = {"values": vals, "goodput": g, "spread": max(g) - min(g)}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["spread"]))


def grid_map(score, train, system: str, tuned: dict, default: dict,
             axes: tuple[str, str], *, load_rps: float, slots: int, points: int = POINTS,
             log=lambda s: None) -> dict:
    """The training objective (``score``) and the TTFT / TPOT p99 at ``load_rps`` (runs
    to completion on the training windows ``train``) over a ``points`` x ``points`` grid
    of the two arguments ``axes`` (the others at the tuned point)."""
    from models import get_system

    spec = get_system(system)
    def upper(a):
        return slots if a == "max_num_seqs" else None

    def fine(a):
        lo, hi, log = _range(spec, a, upper(a))
        return _spaced(lo, hi, FINE, log)

    dep = train[0].deployment
    xs, ys = (axis_values(spec, a, points, (tuned[a], default[a]), upper=upper(a),
                          lower=feasible_lower(spec, dep, tuned, a, {b: fine(b)},
                                               upper(a)))
              for a, b in (axes, axes[::-1]))
    settings = [{**tuned, axes[0]: x, axes[1]: y} for y in ys for x in xs]
    good = [float(x) for x in score(settings)]
    at_load = _at_load(train, system, settings, load_rps, log)
    shape = (len(ys), len(xs))

    def grid(key):  # None (JSON null) where vLLM refuses the setting or no value
        vals = [None if m is None or not math.isfinite(float(m[key])) else float(m[key])
                for m in at_load]
        return [vals[j * shape[1]:(j + 1) * shape[1]] for j in range(shape[0])]

    return {"axes": list(axes), "x": xs, "y": ys, "load_rps": float(load_rps),
            "goodput_rps": np.asarray(good, np.float64).reshape(shape).tolist(),
            "refused": np.asarray([m is None for m in at_load]).reshape(shape).tolist(),
            "ttft_p99_s": grid("ttft_p99_s"), "tpot_p99_s": grid("tpot_p99_s"),
            "slo_attainment": grid("slo_attainment"),
            "default": [float(default[axes[0]]), float(default[axes[1]])],
            "tuned": [float(tuned[axes[0]]), float(tuned[axes[1]])]}


def _edges(v, log: bool):
    v = np.asarray(v, np.float64)
    if len(v) == 1:
        return np.array([v[0] * 0.8, v[0] * 1.25]) if log else np.array([v[0] - .5,
                                                                          v[0] + .5])
    m = np.sqrt(v[1:] * v[:-1]) if log else (v[1:] + v[:-1]) / 2
    first = v[0] ** 2 / m[0] if log else 2 * v[0] - m[0]
    last = v[-1] ** 2 / m[-1] if log else 2 * v[-1] - m[-1]
    return np.concatenate([[first], m, [last]])


def plot(case: str, m: dict, slo_s: tuple[float, float], path, metadata: dict):
    """Three panels (goodput; TTFT p99 and TPOT p99 at the map's load, their SLOs in
    the titles) over the map's two arguments, the default (x) and the tuned (*) point
    marked; saved atomically as ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tuner.common.atomic import savefig_atomic

    ax_names = m["axes"]
    logs = [n != "gpu_memory_utilization" for n in ax_names]
    ex, ey = _edges(m["x"], logs[0]), _edges(m["y"], logs[1])
    fig, axs = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    panels = (("goodput_rps", "goodput (req/s, exact, training windows)", "viridis",
               None),
              ("ttft_p99_s", f"TTFT p99 (s) at {m['load_rps']:.3g} req/s; SLO "
               f"{slo_s[0]:.3g} s", "magma_r", slo_s[0]),
              ("tpot_p99_s", f"TPOT p99 (ms) at {m['load_rps']:.3g} req/s; SLO "
               f"{slo_s[1] * 1e3:.3g} ms", "magma_r", slo_s[1]))
    for ax, (key, title, cmap, slo) in zip(axs, panels):
        z = np.asarray([[np.nan if v is None else v for v in row] for row in m[key]],
                       np.float64) * (1e3 if key == "tpot_p99_s" else 1.0)
        refused = np.asarray(m.get("refused") or np.zeros(z.shape, bool), bool)
        z = np.where(np.isfinite(z) & ~refused, z, np.nan)  # refused: blank
        pc = ax.pcolormesh(ex, ey, z, cmap=cmap, shading="flat")
        fig.colorbar(pc, ax=ax)
        lo, hi = np.nanmin(z), np.nanmax(z)
        for j, y in enumerate(m["y"]):
            for i, x in enumerate(m["x"]):
                v = z[j, i]
                if refused[j, i]:
                    ax.text(x, y, "refused", ha="center", va="center", fontsize=6)
                elif math.isfinite(v):  # light text on the dark end of the colour map
                    f = (v - lo) / (hi - lo) if hi > lo else 0.5
                    dark = f < 0.45 if key == "goodput_rps" else f > 0.55
                    ax.text(x, y, f"{v:.3g}", ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
        ax.plot(*m["default"], "x", color="red", ms=11, mew=2.5, label="vLLM default")
        ax.plot(*m["tuned"], "*", color="cyan", ms=15, mec="black", label="tuned")
        ax.set_xscale("log" if logs[0] else "linear")
        ax.set_yscale("log" if logs[1] else "linear")
        ax.set_xlim(ex[0], ex[-1])
        ax.set_ylim(ey[0], ey[-1])
        ax.set_xlabel(ax_names[0])
        ax.set_ylabel(ax_names[1])
        ax.set_title(title, fontsize=9)
    fig.legend(*axs[0].get_legend_handles_labels(), loc="upper right", fontsize=8)
    fig.suptitle(f"{case}: the two most influential engine arguments (others at the "
                 "tuned point)", fontsize=10)
    savefig_atomic(fig, path, dpi=110, metadata=metadata)
    plt.close(fig)
