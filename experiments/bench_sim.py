"""Throughput and memory of the simulators on a real trace (CPU): the bucketed systems by
default, any registered system with ``--systems`` (e.g. ``ellm,vllm,vllm-cp``).

For each system: simulated iterations per second of one exact-mode config, and
config-iterations per second of exact-mode sweeps (``jax.vmap`` over configs: the
capacity, and ODMA's ``gamma``, vary along the grid; the workload is shared, not
vmapped). Compile time is reported apart from run time (the run is timed on the second
call). With ``--devices 2`` the largest sweep also runs with its config axis sharded over
two host devices (``NamedSharding`` on the leading axis), next to the unsharded run.

Memory: the carried state per config (bytes of the state's leaves, from
``jax.eval_shape``), XLA's temporary buffers per config of each compiled run (its own
buffer assignment) and the process's peak RSS. A second table shows that the state per
config grows with slots (and ODMA's window), not with the number of requests.

Workload: the first 10,000 requests of ``azure-llm-2023-conv.csv`` with predictions
from the shipped error model; MLU370-X4 TP1 running DeepSeek-R1-Distill-Qwen-7B;
256 slots.

Usage (from the repository root)::

    python -m experiments.bench_sim --devices 2 --out results/bench_sim
    python -m experiments.bench_sim --quick            # CI smoke (small sizes)

Writes ``bench_sim.json`` and ``bench_sim.md`` to ``--out`` (atomically).
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import sys
import time

__all__ = ["main", "parse_args", "run_bench", "state_bytes", "to_markdown"]

TRACE = "azure-llm-2023-conv.csv"
KINDS = ("static", "paged", "s3", "odma")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2048, help="iterations per run")
    ap.add_argument("--systems", default=",".join(KINDS))
    ap.add_argument("--configs", default="64,256", help="sweep sizes (vmapped configs)")
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--devices", type=int, default=1,
                    help="host devices; >= 2 also runs the largest sweep sharded")
    ap.add_argument("--no-latency-hist", dest="latency_hist", action="store_false",
                    help="SimOptions(latency_hist=False): no TTFT/TPOT percentiles")
    ap.add_argument("--max-run-s", type=float, default=None,
                    help="skip a sweep whose run, projected from the system's best "
                         "sweep so far, would take longer (a time box; the first "
                         "sweep size always runs)")
    ap.add_argument("--no-memory-scaling", dest="memory_scaling", action="store_false",
                    help="leave out the state-size table (12 extra compiles)")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--out", default=None, help="folder for bench_sim.json / .md")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.configs, args.slots, args.requests = 64, "4,8", 64, 2000
    return args


def _setup_devices(n: int) -> None:
    """Host devices must be requested before jax is imported (benchmark only)."""
    if n > 1:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count={n}"
                                   .strip())


@functools.cache
def _deployment():
    import hardware

    return hardware.make_deployment("mlu370-x4", "deepseek-r1-distill-qwen-7b", tp=1)


def _options(kind, **settings):
    """The system's options: the bucketed family's window settings only for it."""
    from models import family_of, make_options

    if family_of(kind).name != "bucketed":
        settings = {k: v for k, v in settings.items()
                    if k not in ("window", "refresh_every")}
    return make_options(kind, **settings)


def _inputs(wl, cfg, opts):
    from models import make_inputs

    return make_inputs(wl, cfg, opts, deployment=_deployment())


def _problem(n_requests: int, n_slots: int):
    import jax.numpy as jnp
    import numpy as np

    import hardware
    from models import ServerConfig, make_workload
    from tuner.scenario import clip_lengths
    from tuner.workloads.error_model import load_default_error_model
    from tuner.workloads.presets import traces_dir
    from tuner.workloads.traces import load_trace

    dep = _deployment()
    tr = load_trace(traces_dir() / TRACE)
    sl = slice(0, n_requests)
    max_len = int(min(max(256, 2 ** int(np.ceil(np.log2(tr.output_tokens[sl].max())))),
                      16384))
    prompt, out = clip_lengths(tr.prompt_tokens[sl], tr.output_tokens[sl], max_len=max_len,
                               max_position=dep.model.max_position)
    pred, u = load_default_error_model().sample(out, 0)
    wl = make_workload(tr.arrival_s[sl] - tr.arrival_s[sl].min(), prompt, out, pred, u)
    cfg = ServerConfig(
        capacity_tokens=jnp.float32(dep.kv_capacity_tokens), max_batch=jnp.int32(n_slots),
        max_prefill=jnp.float32(8192), ttft_slo_s=jnp.float32(5.0),
        tpot_slo_s=jnp.float32(0.15), token_scale=jnp.float32(32.0),
        kv_bytes_per_token=jnp.float32(dep.kv_bytes_per_token_per_device),
        watermark_tokens=jnp.float32(np.floor(0.01 * dep.kv_capacity_tokens)),
        n_slots=n_slots, admit_window=32, max_len=max_len)
    return wl, cfg, hardware.roofline_params(dep)


def _grid(kind, cfg, n):
    """``n`` configs: capacity from 50% to 100% of the deployment's (and ODMA's gamma
    from 0 to 1), as leading-axis leaves; ``in_axes`` for the ServerConfig."""
    import jax
    import jax.numpy as jnp

    from models import get_system

    p = {k: jnp.asarray(v) for k, v in get_system(kind).default_params(cfg.max_len).items()}
    frac = jnp.linspace(0.5, 1.0, n, dtype=jnp.float32)
    cfgs = cfg.replace(capacity_tokens=frac * cfg.capacity_tokens)
    ps = {k: jnp.broadcast_to(v, (n, *v.shape)) for k, v in p.items()}
    if kind == "odma":
        ps["gamma"] = jnp.tile(jnp.linspace(0.0, 1.0, 8, dtype=jnp.float32), n // 8 + 1)[:n]
    axes = jax.tree_util.tree_map(lambda _: None, cfg).replace(capacity_tokens=0)
    return p, cfgs, ps, axes


def state_bytes(kind, wl, cfg, params, window=10_000) -> int:
    """Bytes of the carried simulator state of one config (without the workload)."""
    import jax

    from models import init_state

    opts = _options(kind, window=window)
    inputs = _inputs(wl, cfg, opts)
    shapes = jax.eval_shape(lambda: init_state(inputs, params, 0.0, opts))
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes)))


def _timed(fn, *args):
    """(compile s, run s, outputs, XLA temp bytes) of ``jit(fn)``. The run is timed
    after compiling ahead of time: a call of over a second once, a shorter one as the
    median of five calls after one untimed call."""
    import jax
    import numpy as np

    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    comp = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    run = time.perf_counter() - t0
    if run < 1.0:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            out = jax.block_until_ready(compiled(*args))
            times.append(time.perf_counter() - t0)
        run = float(np.median(times))
    mem = compiled.memory_analysis()
    return comp, run, out, int(getattr(mem, "temp_size_in_bytes", 0) or 0)


def _sweep_temp(kind, window, wl, hw, cfgs, ps, axes, steps=16) -> int:
    """XLA's temporary bytes of a compiled (not run) exact sweep over ``cfgs``."""
    import jax

    from models import metrics, simulate

    opts = _options(kind, window=window)
    inputs = _inputs(wl, cfgs, opts)

    def one(c, p):
        x = inputs.replace(cfg=c)
        return metrics(simulate(x, hw, p, 0.0, opts, steps)[0], x, opts)

    compiled = jax.jit(jax.vmap(one, in_axes=(axes, 0))).lower(cfgs, ps).compile()
    return int(getattr(compiled.memory_analysis(), "temp_size_in_bytes", 0) or 0)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_bench(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from models import metrics, simulate

    wl, cfg, hw = _problem(args.requests, args.slots)
    sizes = [int(c) for c in args.configs.split(",")]
    rows = []
    for kind in args.systems.split(","):
        extra = {} if args.latency_hist else {"latency_hist": False}
        opts = _options(kind, window=10_000, refresh_every=1000, block=16, **extra)
        inputs = _inputs(wl, cfg, opts)

        def one(c, p, opts=opts, inputs=inputs):  # t = 0.0 (a constant): exact mode
            x = inputs.replace(cfg=c)
            st, _ = simulate(x, hw, p, 0.0, opts, args.steps)
            return metrics(st, x, opts)  # every metric, so that XLA drops no work

        p, _, _, _ = _grid(kind, cfg, 1)
        base = {"system": kind, "steps": args.steps, "slots": args.slots,
                "latency_hist": args.latency_hist,
                "state_bytes_per_config": state_bytes(kind, wl, cfg, p)}
        comp, run, done, temp = _timed(one, cfg, p)
        rows.append({**base, "configs": 1, "devices": 1, "compile_s": comp, "run_s": run,
                     "cfg_it_per_s": args.steps / run, "temp_bytes_per_config": temp,
                     "completed_mean": float(done["completed"]), "maxrss_mb": _rss_mb()})
        print(_fmt(rows[-1]), flush=True)
        for n in sizes:
            # the first sweep always runs (a sweep's rate cannot be told from one
            # config's); a larger one is projected from the best sweep so far
            swept = [r["cfg_it_per_s"] for r in rows if r["system"] == kind
                     and r["configs"] > 1 and "cfg_it_per_s" in r]
            projected = n * args.steps / max(swept) if swept else 0.0
            if args.max_run_s is not None and projected > args.max_run_s:
                rows.append({**base, "configs": n, "devices": 1,
                             "skipped": f"projected run {projected:.3g} s > "
                                        f"--max-run-s {args.max_run_s:g}"})
                print(f"{kind:6s} configs={n:4d} skipped: {rows[-1]['skipped']}",
                      flush=True)
                continue
            _, cfgs, ps, axes = _grid(kind, cfg, n)
            sweep = jax.vmap(one, in_axes=(axes, 0))
            runs = [(1, (cfgs, ps))]
            if n == max(sizes) and args.devices > 1 and n % args.devices == 0:
                mesh = Mesh(np.array(jax.devices()[:args.devices]), ("cfg",))
                shard = NamedSharding(mesh, PartitionSpec("cfg"))
                cs = cfgs.replace(capacity_tokens=jax.device_put(cfgs.capacity_tokens, shard))
                runs.append((args.devices, (cs, jax.device_put(ps, shard))))
            for n_dev, fargs in runs:
                comp, run, done, temp = _timed(sweep, *fargs)
                rows.append({**base, "configs": n, "devices": n_dev, "compile_s": comp,
                             "run_s": run, "cfg_it_per_s": n * args.steps / run,
                             "temp_bytes_per_config": temp * n_dev / n,  # per device
                             "completed_mean": float(np.mean(np.asarray(done["completed"]))),
                             "maxrss_mb": _rss_mb()})
                print(_fmt(rows[-1]), flush=True)
    scaling = []
    for n_req in (1000, args.requests) if args.memory_scaling else ():
        wl_n, _, _ = _problem(n_req, args.slots)
        for slots in (64, 256):
            c = cfg.replace(n_slots=slots, max_batch=jnp.int32(slots))
            for kind, window in (("static", 10_000), ("odma", 1000), ("odma", 10_000)):
                p, cfgs, ps, axes = _grid(kind, c, 8)
                scaling.append({"system": kind, "requests": n_req, "slots": slots,
                                "window": window if kind == "odma" else None,
                                "state_bytes": state_bytes(kind, wl_n, c, p, window),
                                "temp_bytes_per_config": _sweep_temp(
                                    kind, window, wl_n, hw, cfgs, ps, axes) / 8})
    return {"settings": {**vars(args), "trace": TRACE, "devices_seen": jax.device_count(),
                         "device_kind": jax.devices()[0].device_kind,
                         "cpu_count": os.cpu_count(), "jax": jax.__version__,
                         "xla_flags": os.environ.get("XLA_FLAGS", "")},
            "throughput": rows, "memory_scaling": scaling}


def _fmt(r) -> str:
    return (f"{r['system']:6s} configs={r['configs']:4d} devices={r['devices']} "
            f"compile={r['compile_s']:6.1f}s run={r['run_s']:7.3f}s "
            f"{r['cfg_it_per_s']:10.3g} cfg-it/s state={r['state_bytes_per_config']/1024:.0f}"
            f" KiB/config temp={r['temp_bytes_per_config']/1024:.0f} KiB/config "
            f"maxrss={r['maxrss_mb']:.0f} MiB")


def to_markdown(res) -> str:
    s = res["settings"]
    head = (f"# bench_sim: {s['trace']}, first {s['requests']} requests, "
            f"{s['slots']} slots, {s['steps']} iterations per run")
    note = (f"jax {s['jax']}, {s['cpu_count']} CPUs, {s['devices_seen']} "
            f"{s.get('device_kind', 'host')} device(s); exact mode (T = 0); latency "
            f"histograms {'on' if s['latency_hist'] else 'off'}; run time = one call of "
            "over 1 s, else the median of 5 after one untimed; XLA temp = the compiled "
            "run's temporary buffers.")
    cols = ("| system | configs | devices | compile s | run s | config-it/s | "
            "state KiB/config | XLA temp KiB/config | peak RSS MiB |")
    lines = [head, "", note, "", cols, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["throughput"]:
        if "skipped" in r:
            lines.append(f"| {r['system']} | {r['configs']} | {r['devices']} | "
                         f"skipped: {r['skipped']} | | | | | |")
            continue
        lines.append(f"| {r['system']} | {r['configs']} | {r['devices']} | "
                     f"{r['compile_s']:.1f} | {r['run_s']:.3f} | {r['cfg_it_per_s']:,.0f} | "
                     f"{r['state_bytes_per_config'] / 1024:.1f} | "
                     f"{r['temp_bytes_per_config'] / 1024:.1f} | {r['maxrss_mb']:.0f} |")
    if not res["memory_scaling"]:
        return "\n".join(lines) + "\n"
    lines += ["", ("Memory per config (the workload is shared by all configs; XLA temp of "
                   "a compiled 8-config sweep):"), "",
              "| system | requests | slots | window | state KiB | XLA temp KiB/config |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in res["memory_scaling"]:
        lines.append(f"| {r['system']} | {r['requests']} | {r['slots']} | "
                     f"{r['window'] or '-'} | {r['state_bytes'] / 1024:.1f} | "
                     f"{r['temp_bytes_per_config'] / 1024:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    if "jax" not in sys.modules:
        _setup_devices(args.devices)
    res = run_bench(args)
    md = to_markdown(res)
    print(md)
    if args.out:
        from experiments.results_io import stamp_markdown, stamped
        from tuner.common.atomic import plain, write_json_atomic, write_text_atomic

        doc = stamped(res)
        write_json_atomic(os.path.join(args.out, "bench_sim.json"), plain(doc),
                          sort_keys=False)
        write_text_atomic(os.path.join(args.out, "bench_sim.md"),
                          stamp_markdown(md, doc["provenance"]))
    return res


if __name__ == "__main__":
    main()
