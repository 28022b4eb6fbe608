"""Sweep a policy over parameters x hardware x workloads: ``python -m tuner.sweep``.

Every point (a parameter set, a device preset, a workload) is one slice of a single
leading sweep axis, and all points run through one jitted ``jax.vmap`` of a fixed-length
``models.simulate`` + ``metrics`` + objective. The axis is sharded over every visible
device with ``NamedSharding(Mesh(jax.devices(), ("sweep",)), P("sweep"))`` and cut into
chunks of ``--batch`` points, padded to one shape, so one compile serves the whole sweep.

Points: ``--grid key=v1,v2`` (repeatable) spans a cartesian grid; a vector parameter takes
one vector per ';' (``--grid 'levels=0.5,0.9,0.99;0.6,0.9,0.99'``). ``--random N`` draws N
sets uniformly from each tunable parameter's domain instead (``--seed`` seeds the draw
as well as the scenario). Either is crossed with ``--hardware a,b`` and ``--trace t1,t2``;
every workload uses one ``max_len`` (the largest the traces need) and is padded to a
common length. Without ``--steps`` a point runs 1.25 x the exact iteration count of the
default policy on the first scenario.

Outputs in ``--out DIR``: ``sweep.json`` (rows + run metadata), ``sweep.csv``,
``sweep.md`` (top 20 by objective + Pareto-optimal rows), ``pareto.png`` (TPS vs p99 TTFT,
KV utilisation vs migration rate). Bad input prints one ``error:`` line, exits 2 and
writes nothing.

Devices: several local devices are used as they are; on CPU try
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (set before Python starts).
Several hosts: run the same command on each with ``--coordinator HOST:PORT
--num-processes N --process-id I`` (or env ``KVTUNE_COORDINATOR``,
``KVTUNE_NUM_PROCESSES``, ``KVTUNE_PROCESS_ID``; ``KVTUNE_COORDINATOR=auto`` lets
``jax.distributed`` detect SLURM, TPU pods or Open MPI). ``jax.distributed.initialize``
runs before any other JAX work, the mesh spans the global ``jax.devices()``, every process
builds the same points and feeds only its own shards (``jax.make_array_from_callback``),
results are gathered with ``multihost_utils.process_allgather`` and only process 0
writes. Only the single-process path is tested. The simulators are imported inside
functions because importing ``models`` creates arrays, which starts the JAX backend.
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
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["init_distributed", "parse_grid", "grid_points", "random_points",
           "build_scenarios", "default_steps", "run_sweep", "main"]


def init_distributed(coordinator=None, num_processes=None, process_id=None) -> bool:
    """``jax.distributed.initialize`` from arguments or ``KVTUNE_*`` env; False if none."""
    env = os.environ
    coordinator = coordinator or env.get("KVTUNE_COORDINATOR")
    if not coordinator:
        return False
    if coordinator == "auto":
        jax.distributed.initialize()
        return True
    n = num_processes if num_processes is not None else env.get("KVTUNE_NUM_PROCESSES")
    i = process_id if process_id is not None else env.get("KVTUNE_PROCESS_ID")
    if n is None or i is None:
        raise ValueError("multi-host sweep: give --num-processes and --process-id (or "
                         "KVTUNE_NUM_PROCESSES, KVTUNE_PROCESS_ID) with the coordinator")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=int(n),
                               process_id=int(i))
    return True


def parse_grid(texts: list[str], system: str) -> dict[str, list]:
    """``key=v1,v2,...`` per text; a vector parameter takes ';'-separated vectors."""
    from models import get_system

    defaults = get_system(system).default_params(4096)
    grid: dict[str, list] = {}
    for text in texts:
        key, eq, value = (s.strip() for s in text.partition("="))
        if not eq or not key:
            raise ValueError(f"--grid {text!r}: expected key=v1,v2,...")
        if key not in defaults:
            raise ValueError(f"--grid {text!r}: {system} has no parameter {key!r}; "
                             f"known: {', '.join(sorted(defaults)) or 'none'}")
        if key in grid:
            raise ValueError(f"--grid {text!r}: {key!r} is given twice")
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
        shapes = {v[k].shape for v in out}
        if len(shapes) > 1:
            raise ValueError(f"{spec.name}: values of {k!r} differ in length {sorted(shapes)};"
                             " a sweep needs one length")
    return out


def grid_points(system: str, grid: dict[str, list], max_len: int) -> list[dict]:
    """Cartesian product of ``grid`` (other parameters at their defaults), validated."""
    from models import get_system

    keys = list(grid)
    sets = [dict(zip(keys, combo)) for combo in itertools.product(*grid.values())]
    return _validated(get_system(system), sets, max_len)


def random_points(system: str, n: int, seed: int, max_len: int) -> list[dict]:
    """``n`` parameter sets drawn uniformly from each tunable parameter's domain."""
    from models import get_system

    if n < 1:
        raise ValueError(f"--random {n}: need at least one point")
    spec = get_system(system)
    defaults = spec.default_params(max_len)
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(n):
        p = {}
        for ps in spec.tunable():
            shape, d = defaults[ps.name].shape, ps.domain
            if d == "ordered_unit":
                v = np.sort(rng.uniform(0.05, 0.999, shape))
            elif d == "interval":
                v = rng.uniform(ps.lower, ps.upper, shape)
            elif d == "unit":
                v = rng.uniform(0.001, 0.999, shape)
            elif d == "ordered_positive":
                v = np.sort(rng.uniform(1.0, max_len, shape))
            else:  # positive / integer: within a factor of two of the default
                v = defaults[ps.name] * np.exp(rng.uniform(-math.log(2), math.log(2), shape))
                v = np.round(v) if d == "integer" else v
            p[ps.name] = v
        sets.append(p)
    return _validated(spec, sets, max_len)


def build_scenarios(base, hardware: list[str], traces: list[str]) -> list:
    """One scenario per (hardware, trace), hardware-major, all with one ``max_len``."""
    from tuner.scenario import build_scenario

    if not hardware or not traces or not all(hardware) or not all(traces):
        raise ValueError("--hardware and --trace must name at least one non-empty preset")
    specs = [base.replace(hardware=h, trace=t) for h in hardware for t in traces]
    scs = [build_scenario(s) for s in specs]
    max_len = max(s.cfg.max_len for s in scs)
    return [sc if sc.cfg.max_len == max_len else build_scenario(
        sc.spec.replace(max_len=max_len)) for sc in scs]


def default_steps(sc, system: str) -> int:
    """1.25 x the exact iterations of the default policy, rounded up to refresh_check."""
    from tuner.evaluate import evaluate

    it = evaluate(sc, system)["iterations"] + 1
    rc = sc.spec.refresh_check
    return int(math.ceil(1.25 * it / rc) * rc)


@partial(jax.jit, static_argnames=("opts", "n_steps", "objective"))
def _evaluate(params, cfg, hw, wl, prior, t, *, opts, n_steps, objective):
    from models import metrics, simulate

    def one(p, c, h, w, pr):
        state, _ = simulate(w, c, h, p, t, opts, n_steps, pr)
        m = metrics(state, w, c)
        m["objective"] = objective(m)
        return m

    return jax.vmap(one)(params, cfg, hw, wl, prior)


def _human(v):
    """float32 values as the shortest decimals that round-trip (0.9, not 0.8999...)."""
    a = np.asarray(v, np.float32)
    out = [float(str(x)) for x in a.reshape(-1)]
    return out if a.ndim else out[0]


def _stack(trees):
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


def _shard(tree, sharding):
    return jax.tree.map(lambda a: jax.make_array_from_callback(
        a.shape, sharding, lambda i: a[i]), tree)


def run_sweep(scenarios: list, system: str, param_sets: list[dict], *, n_steps: int,
              temperature: float = 0.0, objective: str | None = None, batch: int = 256,
              devices=None, progress=None) -> list[dict]:
    """Metrics of every (parameter set, scenario) point, parameter-major.

    One compiled ``vmap`` evaluates chunks of ``batch`` points (rounded up to a multiple
    of the device count) sharded over ``devices`` (default: all, across hosts).
    """
    from models import get_system
    from tuner.gradcheck import stack_workloads
    from tuner.objectives import parse_objective

    spec, obj = get_system(system), parse_objective(objective)
    if not scenarios or not param_sets:
        raise ValueError("a sweep needs at least one scenario and one parameter set")
    if n_steps < 1 or batch < 1:
        raise ValueError("n_steps and batch must be >= 1")
    opts = scenarios[0].options(system)
    static = {(s.cfg.n_slots, s.cfg.admit_window, s.cfg.max_len) for s in scenarios}
    if len(static) > 1 or any(s.options(system) != opts for s in scenarios):
        raise ValueError(f"scenarios differ in n_slots/admit_window/max_len {sorted(static)}"
                         " or simulator options; a sweep needs them equal")
    params = _stack([{k: np.asarray(v, np.float32) for k, v in p.items()}
                     for p in _validated(spec, param_sets, scenarios[0].cfg.max_len)])
    wl, prior = stack_workloads(scenarios)
    per_sc = {"cfg": _stack([s.cfg for s in scenarios]),
              "hw": jax.tree.map(lambda *x: np.asarray(x, np.float32),
                                 *[s.hw for s in scenarios]),
              "wl": jax.tree.map(np.asarray, wl), "prior": np.asarray(prior)}
    n_sc, n_points = len(scenarios), len(param_sets) * len(scenarios)
    devices = list(devices if devices is not None else jax.devices())
    sharding = NamedSharding(Mesh(np.array(devices), ("sweep",)), PartitionSpec("sweep"))
    size = -(-min(batch, n_points) // len(devices)) * len(devices)
    out: dict[str, list] = {}
    for start in range(0, n_points, size):
        idx = np.arange(start, start + size)
        idx = np.where(idx < n_points, idx, start)  # pad with a real point
        pi, si = idx // n_sc, idx % n_sc
        args = (jax.tree.map(lambda a: a[pi], params),
                *(jax.tree.map(lambda a: a[si], per_sc[k]) for k in per_sc))
        res = _evaluate(*_shard(args, sharding), np.float32(temperature), opts=opts,
                        n_steps=int(n_steps), objective=obj)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            res = multihost_utils.process_allgather(res, tiled=True)
        keep = min(size, n_points - start)
        for k, v in jax.device_get(res).items():
            out.setdefault(k, []).append(np.asarray(v)[:keep])
        if progress:
            progress(start + keep, n_points)
    cols = {k: np.concatenate(v) for k, v in out.items()}
    rows = []
    for j in range(n_points):
        sc, p = scenarios[j % n_sc], param_sets[j // n_sc]
        rows.append({"index": j, "system": system, "hardware": sc.spec.hardware,
                     "model": sc.spec.model, "trace": sc.spec.trace,
                     "fingerprint": sc.fingerprint,
                     "params": {k: _human(v) for k, v in p.items()},
                     "metrics": {k: float(v[j]) for k, v in cols.items()}})
    return rows


def _args(argv):
    from tuner.evaluate import add_scenario_args

    ap = argparse.ArgumentParser(prog="python -m tuner.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", required=True, help="static | paged | s3 | odma")
    ap.add_argument("--grid", action="append", default=[], help="key=v1,v2 (vectors: ';')")
    ap.add_argument("--random", type=int, default=None, help="N random parameter sets")
    ap.add_argument("--mode", choices=("exact", "relaxed"), default="exact")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--objective", default=None)
    ap.add_argument("--steps", type=int, default=None, help="iterations per point")
    ap.add_argument("--batch", type=int, default=256, help="points per compiled call")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--coordinator", default=None, help="multi-host: HOST:PORT or auto")
    ap.add_argument("--num-processes", type=int, default=None)
    ap.add_argument("--process-id", type=int, default=None)
    ap.add_argument("--quiet", action="store_true")
    add_scenario_args(ap)
    return ap.parse_args(argv)


def _plan(args):
    """Validate the command line into (scenarios, parameter sets, steps, temperature)."""
    from tuner.evaluate import spec_from_args
    from tuner.objectives import parse_objective
    from tuner.scenario import ScenarioSpec

    parse_objective(args.objective)
    if args.grid and args.random is not None:
        raise ValueError("give --grid or --random, not both")
    if args.steps is not None and args.steps < 1 or args.batch < 1:
        raise ValueError("--steps and --batch must be >= 1")
    temp = 0.0
    if args.mode == "relaxed":
        temp = 0.05 if args.temperature is None else args.temperature
        if not temp > 0:
            raise ValueError("--temperature must be > 0 in relaxed mode")
    grid = parse_grid(args.grid, args.system)
    d = ScenarioSpec()
    scs = build_scenarios(spec_from_args(args, d), (args.hardware or d.hardware).split(","),
                          (args.trace or d.trace).split(","))
    max_len = scs[0].cfg.max_len
    sets = (random_points(args.system, args.random, args.seed or 0, max_len)
            if args.random is not None else grid_points(args.system, grid, max_len))
    rc = scs[0].spec.refresh_check
    steps = (-(-args.steps // rc) * rc if args.steps is not None
             else default_steps(scs[0], args.system))
    return scs, sets, steps, temp


def main(argv=None) -> int:
    args = _args(argv)
    try:
        init_distributed(args.coordinator, args.num_processes, args.process_id)
        scs, sets, steps, temp = _plan(args)
        from tqdm import tqdm

        bar = tqdm(total=len(sets) * len(scs), desc="sweep", unit="pt", file=sys.stderr,
                   disable=args.quiet or jax.process_index() != 0)
        t0 = time.perf_counter()
        rows = run_sweep(scs, args.system, sets, n_steps=steps, temperature=temp,
                         objective=args.objective, batch=args.batch,
                         progress=lambda done, n: bar.update(done - bar.n))
        wall = time.perf_counter() - t0
        bar.close()
        if jax.process_index() != 0:
            return 0
        from tuner.objectives import parse_objective
        from tuner.pareto import mark_pareto, write_outputs

        devs = jax.devices()
        meta = {"system": args.system, "n_points": len(rows), "steps": steps,
                "mode": args.mode, "temperature": temp, "batch": args.batch,
                "objective": parse_objective(args.objective).spec, "wall_s": wall,
                "devices": len(devs), "platform": devs[0].platform,
                "processes": jax.process_count(),
                "hardware": sorted({s.spec.hardware for s in scs}, key=str),
                "traces": sorted({s.spec.trace for s in scs}, key=str),
                "scenario": scs[0].spec.to_dict()}
        write_outputs(args.out, mark_pareto(rows), meta)
    except (ValueError, OSError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
    best = max(rows, key=lambda r: -math.inf if math.isnan(r["metrics"]["objective"])
               else r["metrics"]["objective"])
    print(f"{len(rows)} points x {steps} iterations on {len(devs)} {devs[0].platform} "
          f"device(s) in {wall:.1f} s; best objective {best['metrics']['objective']:.6g} "
          f"(#{best['index']}: {best['hardware']}, {best['trace']}, {best['params']}); "
          f"wrote {args.out}/sweep.{{json,csv,md}}, pareto.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
