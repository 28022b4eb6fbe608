"""Sweep a policy over parameters x hardware x workloads: ``python -m tuner.sweep``.

Each point (parameter set, device preset, workload) is one slice of a single sweep axis,
evaluated by one jitted ``jax.vmap`` of fixed-length ``models.simulate`` + ``metrics`` +
objective. The axis is sharded over all devices with ``NamedSharding(Mesh(jax.devices(),
("sweep",)), P("sweep"))``, in chunks of ``--batch`` points padded to one shape (one
compile). ``--grid key=v1,v2`` (repeatable; vectors separated by ';') spans a grid,
``--random N`` draws from each tunable parameter's domain (seeded by ``--seed``); both
cross ``--hardware a,b`` and ``--trace t1,t2`` (one ``max_len``, one padded length).
Default ``--steps``: 1.25 x the default policy's exact iterations on the first scenario.
``--out DIR`` gets ``sweep.json``, ``sweep.csv``, ``sweep.md``, ``pareto.png``
(``tuner.pareto``); bad input prints one ``error:`` line, exits 2, writes nothing.

Several CPU devices: ``XLA_FLAGS=--xla_force_host_platform_device_count=4``. Several
hosts: run the same command on each with ``--coordinator HOST:PORT --num-processes N
--process-id I`` (or env ``KVTUNE_COORDINATOR``, ``KVTUNE_NUM_PROCESSES``,
``KVTUNE_PROCESS_ID``; coordinator ``auto``: ``jax.distributed`` detects SLURM, TPU
pods, Open MPI). ``jax.distributed.initialize`` runs first, the mesh spans the global
``jax.devices()``, each process builds the same points and feeds its own shards
(``jax.make_array_from_callback``), ``process_allgather`` collects the results and
process 0 writes (only the single-process path is tested). ``models`` is imported
lazily: its import creates arrays, which would start the backend before ``initialize``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
from functools import partial

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm import tqdm

from tuner.pareto import human, mark_pareto, summary_line, write_outputs

__all__ = ["build_scenarios", "default_steps", "grid_points", "init_distributed",
           "main", "parse_grid", "random_points", "run_sweep"]


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
    from tuner.evaluate import evaluate
    it, rc = evaluate(sc, system, objective="tps")["iterations"] + 1, sc.spec.block
    return int(math.ceil(1.25 * it / rc) * rc)


def ladders(scenarios: list, system: str) -> tuple[np.ndarray, int]:
    """Per scenario, the rate ladder of a capacity objective around the default
    policy's goodput (``tuner.problem.plan_ladder``), and the longest horizon."""
    from tuner.problem import plan_ladder
    plans = [plan_ladder([sc], system, {}) for sc in scenarios]
    return np.stack([p[0] for p in plans]), max(p[1] for p in plans)


@partial(jax.jit, static_argnames=("opts", "n_steps", "objective"))
def _evaluate(params, hw, inputs, lad, t, *, opts, n_steps, objective):
    from models.simulate import note_trace
    from tuner.problem import measure
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
    from tuner.objectives import parse_objective
    from tuner.problem import Ladder, check_stackable, stack_inputs
    spec, obj, n_sc = get_system(system), parse_objective(objective), len(scenarios)
    obj.check_metrics(system)
    if not scenarios or not param_sets or n_steps < 1 or batch < 1:
        raise ValueError("a sweep needs scenarios, parameter sets, n_steps, batch >= 1")
    opts = check_stackable(scenarios, system)
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


_HOSTS = argparse.ArgumentParser(add_help=False)  # parsed before anything starts JAX
_HOSTS.add_argument("--coordinator", default=None, help="multi-host: HOST:PORT or auto")
_HOSTS.add_argument("--num-processes", type=int, default=None)
_HOSTS.add_argument("--process-id", type=int, default=None)


def _args(argv):
    from tuner.evaluate import add_scenario_args
    ap = argparse.ArgumentParser(prog="python -m tuner.sweep", description=__doc__,
                                 parents=[_HOSTS],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", required=True, help="a registered system (python -m "
                    "tuner.evaluate --help lists them)")
    ap.add_argument("--grid", action="append", default=[], help="k=v1,v2 (or a,b;c,d)")
    ap.add_argument("--random", type=int, default=None, help="N random parameter sets")
    ap.add_argument("--mode", choices=("exact", "relaxed"), default="exact")
    ap.add_argument("--temperature", type=float, default=0.05, help="relaxed mode only")
    ap.add_argument("--objective", default=None)
    ap.add_argument("--steps", type=int, default=None, help="iterations per point")
    ap.add_argument("--batch", type=int, default=256, help="points per compiled call")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--quiet", action="store_true")
    add_scenario_args(ap)
    return ap.parse_args(argv)


OUT_FILES = ("sweep.json", "sweep.csv", "sweep.md", "pareto.png")


def check_out_dir(out) -> None:
    """Raise ValueError unless ``--out`` can be written as the sweep's folder later
    (creates nothing: the folder is made when the results are written)."""
    from pathlib import Path

    from tuner.atomic import unwritable_reason
    if not str(out).strip():
        raise ValueError("--out: give an output directory")
    why = unwritable_reason(out)
    if why:
        raise ValueError(f"--out {out}: {why} (give a directory for "
                         f"{', '.join(OUT_FILES)})")
    for name in OUT_FILES:
        if (Path(out) / name).is_dir():
            raise ValueError(f"--out {out}: {Path(out) / name} is a directory")


def _plan(args):
    """Validate the command line: (scenarios, parameter sets, steps, T, objective)."""
    from tuner.evaluate import spec_from_args
    from tuner.objectives import parse_objective
    from tuner.scenario import ScenarioSpec
    check_out_dir(args.out)
    objective = parse_objective(args.objective).spec
    if args.grid and args.random is not None:
        raise ValueError("give --grid or --random, not both")
    if (args.steps is not None and args.steps < 1) or args.batch < 1:
        raise ValueError("--steps and --batch must be >= 1")
    temp = args.temperature if args.mode == "relaxed" else 0.0
    if args.mode == "relaxed" and not temp > 0:
        raise ValueError("--temperature must be > 0 in relaxed mode")
    grid = parse_grid(args.grid, args.system)
    d = ScenarioSpec()
    hw, traces = (args.hardware or d.hardware), (args.trace or d.trace)
    scs = build_scenarios(spec_from_args(args, d), hw.split(","), traces.split(","))
    if parse_objective(objective).capacity:
        for sc in scs:
            if not math.isfinite(sc.nominal_rps):
                raise ValueError(
                    f"trace {sc.spec.trace}: all requests of the slice arrive at t = 0, "
                    f"so there is no time pattern for the rate ladder of objective "
                    f"{objective!r}: pass --rate R (Poisson arrivals at R req/s) or an "
                    "objective without one (e.g. --objective tps)")
    max_len, rc = scs[0].cfg.max_len, scs[0].spec.block
    sets = (random_points(args.system, args.random, args.seed or 0, max_len)
            if args.random is not None else grid_points(args.system, grid, max_len))
    rates = None
    if parse_objective(objective).capacity:
        rates, steps = ladders(scs, args.system)
    else:
        steps = default_steps(scs[0], args.system)
    if args.steps is not None:
        steps = -(-args.steps // rc) * rc
    return scs, sets, steps, temp, objective, rates


def main(argv=None) -> int:
    hosts, _ = _HOSTS.parse_known_args(argv)
    try:
        init_distributed(hosts.coordinator, hosts.num_processes, hosts.process_id)
        args = _args(argv)
        scs, sets, steps, temp, objective, rates = _plan(args)
        t0 = time.perf_counter()
        with tqdm(total=len(sets) * len(scs), desc="sweep", unit="pt", file=sys.stderr,
                  disable=args.quiet or jax.process_index() != 0) as bar:
            rows = run_sweep(scs, args.system, sets, n_steps=steps, temperature=temp,
                             objective=objective, batch=args.batch, rates=rates,
                             progress=lambda done, n: bar.update(done - bar.n))
        wall = time.perf_counter() - t0
        if jax.process_index() != 0:
            return 0
        meta = {"system": args.system, "n_points": len(rows), "steps": steps,
                "mode": args.mode, "temperature": temp, "batch": args.batch,
                "objective": objective, "wall_s": wall, "max_len": scs[0].cfg.max_len,
                "devices": jax.device_count(), "platform": jax.devices()[0].platform,
                "processes": jax.process_count(), "scenario": scs[0].spec.to_dict(),
                "hardware": list(dict.fromkeys(s.spec.hardware for s in scs)),
                "traces": list(dict.fromkeys(s.spec.trace for s in scs))}
        from tuner.provenance import provenance
        write_outputs(args.out, mark_pareto(rows), meta,
                      provenance=provenance(None if argv is None else
                                            ["python3", "-m", "tuner.sweep", *argv]))
    except (ValueError, OSError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
    print(summary_line(rows, meta) + f"; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
