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
(``tuner.search.pareto``); bad input prints one ``error:`` line, exits 2, writes nothing.

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
import sys
import time

import jax
from tqdm import tqdm

from tuner.common import compile_cache
from tuner.common.argv import relaxed_temperature
from tuner.search.pareto import mark_pareto, summary_line, write_outputs
from tuner.search.sweep import (build_scenarios, default_steps, grid_points, init_distributed,
                                ladders, parse_grid, random_points, run_sweep)

__all__ = ["main"]


_HOSTS = argparse.ArgumentParser(add_help=False)  # parsed before anything starts JAX
_HOSTS.add_argument("--coordinator", default=None, help="multi-host: HOST:PORT or auto")
_HOSTS.add_argument("--num-processes", type=int, default=None)
_HOSTS.add_argument("--process-id", type=int, default=None)


def _args(argv):
    from tuner.cli import add_scenario_args
    ap = argparse.ArgumentParser(prog="python -m tuner.sweep", description=__doc__,
                                 parents=[_HOSTS],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", required=True, help="a registered system (python -m "
                    "tuner.evaluate --help lists them)")
    ap.add_argument("--grid", action="append", default=[], help="k=v1,v2 (or a,b;c,d)")
    ap.add_argument("--random", type=int, default=None, help="N random parameter sets")
    ap.add_argument("--mode", choices=("exact", "relaxed"), default="exact")
    ap.add_argument("--temperature", type=float, default=None,
                    help="relaxed mode only (default 0.05)")
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

    from tuner.common.atomic import unwritable_reason
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
    from tuner.cli import spec_from_args
    from tuner.objective.objectives import parse_objective
    from tuner.scenario import ScenarioSpec
    check_out_dir(args.out)
    objective = parse_objective(args.objective).spec
    if args.grid and args.random is not None:
        raise ValueError("give --grid or --random, not both")
    if (args.steps is not None and args.steps < 1) or args.batch < 1:
        raise ValueError("--steps and --batch must be >= 1")
    temp = relaxed_temperature(args.mode, args.temperature)
    grid = parse_grid(args.grid, args.system)
    d = ScenarioSpec()
    hw, traces = (args.hardware or d.hardware), (args.trace or d.trace)
    scs = build_scenarios(spec_from_args(args, d), hw.split(","), traces.split(","))
    if parse_objective(objective).capacity:
        for sc in scs:
            sc.check_rate_ladder(objective)
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
        compile_cache.enable()
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
        from tuner.common.provenance import provenance
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
