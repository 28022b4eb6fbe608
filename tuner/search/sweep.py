"""Sweeps: every point (parameter set x device preset x workload) of a grid or a random
draw evaluated by one jitted ``jax.vmap`` of fixed-length ``models.simulate`` + ``metrics``
+ objective, sharded over all devices (``python -m tuner.sweep`` is the command line and
says how to run it on several devices or hosts).

The axis is sharded with ``NamedSharding(Mesh(jax.devices(), ("sweep",)), P("sweep"))``,
in chunks of points padded to one shape (one compile). :func:`init_distributed` runs
``jax.distributed.initialize`` before anything starts the backend; ``models`` is
imported lazily for that reason (its import creates arrays).
"""

from __future__ import annotations

import itertools
import math
import os
from functools import partial

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tuner.search.pareto import human

__all__ = ["build_scenarios", "default_steps", "grid_points", "init_distributed",
           "ladders", "parse_grid", "random_points", "run_sweep"]


def init_distributed(coordinator=None, num_processes=None, process_id=None) -> bool:
    """``jax.distributed.initialize`` from arguments or ``KVTUNE_*``; False if none."""
    env = os.environ
    addr = coordinator or env.get("KVTUNE_COORDINATOR")
    n = num_processes if num_processes is not None else env.get("KVTUNE_NUM_PROCESSES")
    i = process_id if process_id is not None else env.get("KVTUNE_PROCESS_ID")
    if addr:  # "auto" / no n, i: jax.distributed detects SLURM, TPU pods, Open MPI
        jax.distributed.initialize(None if addr == "auto" else addr,
                                   None if n is None else int(n),
                                   None if i is None else int(i))
    return bool(addr)


def parse_grid(texts: list[str], system: str) -> dict[str, list]:
    """``key=v1,v2,...`` per text; a vector parameter takes ';'-separated vectors."""
    from models import get_system
    defaults = get_system(system).default_params(4096)
    grid: dict[str, list] = {}
    for text in texts:
        key, eq, value = (s.strip() for s in text.partition("="))
        if not eq or key not in defaults or key in grid:
            raise ValueError(f"--grid {text!r}: expected key=v1,v2,... with a new key "
                             f"among {system}'s {sorted(defaults)}")
        vector = np.ndim(defaults[key]) > 0
        parts = value.split(";") if vector else value.replace(";", ",").split(",")
        try:
            vals = [[float(x) for x in p.split(",")] if vector else float(p)
                    for p in parts if p.strip()]
        except ValueError:
            raise ValueError(f"--grid {text!r}: values must be numbers") from None
        if not vals:
            raise ValueError(f"--grid {text!r}: empty grid")
        grid[key] = vals
    return grid


def _validated(spec, sets: list[dict], max_len: int) -> list[dict]:
    from models import validate_params
    out = [validate_params(spec, p, max_len) for p in sets]
    for k in out[0] if out else ():
        shapes = sorted({v[k].shape for v in out})
        if len(shapes) > 1:
            raise ValueError(f"{spec.name}: values of {k!r} differ in length {shapes}")
    return out


def grid_points(system: str, grid: dict[str, list], max_len: int) -> list[dict]:
    """Cartesian product of ``grid`` (other parameters at their defaults), validated."""
    from models import get_system
    sets = [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]
    return _validated(get_system(system), sets, max_len)


def random_points(system: str, n: int, seed: int, max_len: int) -> list[dict]:
    """``n`` parameter sets drawn from each tunable parameter's domain (its sampler in
    ``models.domains``)."""
    from models import get_system
    from models.domains import get_domain
    if n < 1:
        raise ValueError(f"--random {n}: need at least one point")
    spec = get_system(system)
    defaults = spec.default_params(max_len)
    rng = np.random.default_rng(seed)
    sets = [{} for _ in range(n)]
    for p in sets:
        for ps in spec.tunable():
            p[ps.name] = get_domain(ps.domain).sample(rng, ps, defaults[ps.name], max_len)
    return _validated(spec, sets, max_len)


def build_scenarios(base, hardware: list[str], traces: list[str]) -> list:
    """One scenario per (hardware, trace), hardware-major, all with one ``max_len``."""
    from tuner.scenario import build_scenario
    if not hardware or not traces or not all(hardware) or not all(traces):
        raise ValueError("--hardware and --trace must name non-empty presets")
    scs = [build_scenario(base.replace(hardware=h, trace=t))
           for h in hardware for t in traces]
    top = max(s.cfg.max_len for s in scs)
    return [s if s.cfg.max_len == top else build_scenario(s.spec.replace(max_len=top))
            for s in scs]


def default_steps(sc, system: str) -> int:
    """1.25 x the default policy's exact iterations, rounded up to whole blocks."""
    from tuner.objective.evaluate import evaluate
    it, rc = evaluate(sc, system, objective="tps")["iterations"] + 1, sc.spec.block
    return int(math.ceil(1.25 * it / rc) * rc)


def ladders(scenarios: list, system: str) -> tuple[np.ndarray, int]:
    """Per scenario, the rate ladder of a capacity objective around the default
    policy's goodput (``tuner.objective.problem.plan_ladder``), and the longest horizon."""
    from tuner.objective.problem import plan_ladder
    plans = [plan_ladder([sc], system, {}) for sc in scenarios]
    return np.stack([p[0] for p in plans]), max(p[1] for p in plans)


@partial(jax.jit, static_argnames=("opts", "n_steps", "objective"))
def _evaluate(params, hw, inputs, lad, t, *, opts, n_steps, objective):
    from models.simulate import note_trace
    from tuner.objective.problem import measure
    note_trace("sweep", opts, params, hw, inputs, lad, t)

    def one(p, h, x, la):
        m = measure(p, x, h, t, la, opts=opts, n_steps=n_steps, objective=objective)
        return {**m, "objective": objective(m)}

    return jax.vmap(one)(params, hw, inputs, lad)


def _stack(trees, dtype=None):
    return jax.tree.map(lambda *xs: np.asarray(np.stack(xs), dtype), *trees)


def _put(tree, idx, sharding):
    """Rows ``idx`` of each leaf, sharded on axis 0 (each process fills its own)."""
    return jax.tree.map(lambda a: jax.make_array_from_callback(
        (len(idx), *a.shape[1:]), sharding, lambda s: a[idx[s[0]]]), tree)


def run_sweep(scenarios: list, system: str, param_sets: list[dict], *, n_steps: int,
              temperature: float = 0.0, objective: str | None = None,
              batch: int = 256, devices=None, progress=None, rates=None) -> list[dict]:
    """Rows of metrics per (parameter set, scenario) point, parameter-major; chunks of
    ``batch`` points (a multiple of the device count) are sharded over ``devices``.
    A capacity objective runs each scenario's rate ladder (``rates``, [scenarios, K]
    req/s; default :func:`ladders`)."""
    from models import get_system
    from tuner.objective.objectives import parse_objective
    from tuner.objective.problem import Ladder, check_stackable, stack_inputs
    spec, obj, n_sc = get_system(system), parse_objective(objective), len(scenarios)
    obj.check_metrics(system)
    if not scenarios or not param_sets or n_steps < 1 or batch < 1:
        raise ValueError("a sweep needs scenarios, parameter sets, n_steps, batch >= 1")
    opts = check_stackable(scenarios, system, obj.needs_record)
    sets = _validated(spec, param_sets, scenarios[0].cfg.max_len)
    if obj.capacity and rates is None:
        rates, _ = ladders(scenarios, system)
    rates = np.ones((n_sc, 1), np.float32) if rates is None else np.asarray(rates,
                                                                              np.float32)
    lad = Ladder(rates, np.asarray([s.nominal_rps for s in scenarios], np.float32))
    per_sc = (_stack([s.hw for s in scenarios], np.float32),
              jax.tree.map(np.asarray, stack_inputs(scenarios, system)), lad)
    params, n_points = _stack(sets, np.float32), len(sets) * n_sc
    devices = list(devices if devices is not None else jax.devices())
    mesh = Mesh(np.array(devices), ("sweep",))
    sharding = NamedSharding(mesh, PartitionSpec("sweep"))
    size = -(-min(batch, n_points) // len(devices)) * len(devices)
    out: dict[str, list] = {}
    for start in range(0, n_points, size):
        idx = np.arange(start, start + size)
        idx = np.where(idx < n_points, idx, start)  # pad with a real point
        args = (_put(params, idx // n_sc, sharding),
                *(_put(x, idx % n_sc, sharding) for x in per_sc))
        res = _evaluate(*args, np.float32(temperature), opts=opts, n_steps=int(n_steps),
                        objective=obj)
        if jax.process_count() > 1:  # every process gets every shard
            res = multihost_utils.process_allgather(res, tiled=True)
        keep = min(size, n_points - start)
        for k, v in jax.device_get(res).items():
            out.setdefault(k, []).append(np.asarray(v)[:keep])
        if progress:
            progress(start + keep, n_points)
    cols = {k: np.concatenate(v) for k, v in out.items()}
    rows = []
    for j in range(n_points):
        sc = scenarios[j % n_sc]
        rows.append({"index": j, "system": system, "hardware": sc.spec.hardware,
                     "model": sc.spec.model, "trace": sc.spec.trace,
                     "fingerprint": sc.fingerprint,
                     "params": {k: human(v) for k, v in sets[j // n_sc].items()},
                     "metrics": {k: human(v[j]) for k, v in cols.items()}})
    return rows

