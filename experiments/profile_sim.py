"""Where an exact sweep's time goes, by XLA operation (issue 30, item 4).

Runs one system's exact-mode sweep (``bench_sim``'s workload, grid and step function)
under ``jax.profiler.trace``, reads the Perfetto trace it writes, and sums the time of
every device (GPU) or XLA:CPU event by name. Each name is a kernel or thunk of the
compiled program (``fusion.12``, ``sort.3``, ``scatter.7`` ...); the compiled HLO maps
it to the operations it holds (a fusion's instructions by opcode, with their shapes), so
the table says e.g. "a sort over 10,000 requests per config" rather than a fusion
number.

Usage (from the repository root)::

    python -m experiments.profile_sim --system token-pd --configs 1024 --out DIR
    python -m experiments.profile_sim --quick --out DIR     # CPU smoke (small sizes)

Writes ``profile_<system>.json`` and ``profile_<system>.md`` to ``--out`` (atomically).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main", "parse_args", "op_table", "hlo_ops"]

TOP = 15


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system", default="token-pd")
    ap.add_argument("--configs", type=int, default=1024, help="vmapped configs")
    ap.add_argument("--steps", type=int, default=256, help="iterations per run")
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--out", required=True, help="folder for profile_<system>.json / .md")
    args = ap.parse_args(argv)
    if args.quick:
        args.configs, args.steps, args.slots, args.requests = 4, 16, 64, 1000
    for k in ("configs", "steps", "slots", "requests"):
        if getattr(args, k) <= 0:
            ap.error(f"--{k} must be positive, got {getattr(args, k)}")
    return args


def hlo_ops(hlo_text: str) -> dict[str, str]:
    """Each instruction or fused computation name of a compiled HLO module -> a short
    description of the operations it holds (opcode x count, with the largest shape)."""
    comps: dict[str, list[tuple[str, str]]] = {}
    cur = None
    head = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
    calls: dict[str, str] = {}
    for line in hlo_text.splitlines():
        m = head.match(line)
        if m and "=" not in line.split("{")[0]:
            cur = m.group(1)
            comps[cur] = []
            continue
        m = re.match(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*([^ ]+)\s+([\w\-]+)\(", line)
        if m and cur is not None:
            name, shape, op = m.groups()
            comps[cur].append((op, shape))
            c = re.search(r"calls=%?([\w.\-]+)", line)
            if c:
                calls[name] = c.group(1)
            else:
                calls.setdefault(name, "")
                comps.setdefault("__single__" + name, [(op, shape)])
    out = {}
    for name, target in calls.items():
        ops = comps.get(target) if target else comps.get("__single__" + name)
        if not ops:
            continue
        counts = collections.Counter(op for op, _ in ops
                                     if op not in ("parameter", "constant", "tuple",
                                                   "get-tuple-element", "bitcast"))
        big = max(ops, key=lambda o: _elements(o[1]))
        desc = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.most_common(6))
        out[name] = f"{desc or ops[0][0]} (largest {big[1]})"
    return out


def _elements(shape: str) -> int:
    dims = re.findall(r"\[([\d,]*)\]", shape)
    best = 0
    for d in dims:
        n = 1
        for x in d.split(","):
            if x:
                n *= int(x)
        best = max(best, n)
    return best


def _trace_events(log_dir: str) -> list[dict]:
    files = sorted(Path(log_dir).rglob("*.trace.json.gz")) + \
        sorted(Path(log_dir).rglob("perfetto_trace.json.gz"))
    if not files:
        raise RuntimeError(f"no trace file under {log_dir}")
    with gzip.open(files[-1], "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def op_table(events: list[dict], ops: dict[str, str]) -> tuple[list[dict], float, str]:
    """Time by event name on the device (GPU) lanes, else on XLA:CPU's lanes: rows of
    {name, ms, share, calls, ops}, the total ms, and which lanes were read."""
    procs = {e.get("pid"): e.get("args", {}).get("name", "")
             for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    gpu = {p for p, n in procs.items() if "/device:GPU" in n}
    lanes = "GPU kernels" if gpu else "host (XLA:CPU thunks)"
    tot: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        name = e.get("name", "")
        if gpu:
            if e.get("pid") not in gpu:
                continue
        else:
            base = name.split(":")[0]
            if base not in ops and base.split(".")[0] not in {
                    "fusion", "sort", "scatter", "gather", "while", "reduce", "dot"}:
                continue
            name = base
        tot[name] += e["dur"] / 1000.0
        calls[name] += 1
    total = sum(tot.values())
    rows = [{"name": n, "ms": ms, "share": ms / total if total else 0.0,
             "calls": calls[n], "ops": _lookup(ops, n)} for n, ms in tot.most_common()]
    return rows, total, lanes


def _lookup(ops: dict[str, str], name: str) -> str:
    if name in ops:
        return ops[name]
    for k, v in ops.items():  # kernel names carry the fusion's name as a prefix
        if name.startswith(k + "_") or name.startswith(k + "."):
            return v
    return ""


def run(args) -> dict:
    import jax

    from experiments import bench_sim
    from models import metrics, simulate

    wl, cfg, hw = bench_sim._problem(args.requests, args.slots)
    opts = bench_sim._options(args.system, window=10_000, refresh_every=1000, block=16)
    inputs = bench_sim._inputs(wl, cfg, opts)

    def one(c, p):
        x = inputs.replace(cfg=c)
        st, _ = simulate(x, hw, p, 0.0, opts, args.steps)
        return metrics(st, x, opts)

    _, cfgs, ps, axes = bench_sim._grid(args.system, cfg, args.configs)
    compiled = jax.jit(jax.vmap(one, in_axes=(axes, 0))).lower(cfgs, ps).compile()
    jax.block_until_ready(compiled(cfgs, ps))
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(cfgs, ps))
    untraced = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            jax.block_until_ready(compiled(cfgs, ps))
        events = _trace_events(log_dir)
    ops = hlo_ops(compiled.as_text())
    rows, total, lanes = op_table(events, ops)
    by_op: collections.Counter = collections.Counter()
    for r in rows:  # the kind of operation: a fusion's most frequent non-trivial opcode
        by_op[(r["ops"].split(" (")[0].split(",")[0].split(" x")[0] or "other")] += r["ms"]
    return {"settings": {**vars(args), "jax": jax.__version__,
                         "device": str(jax.devices()[0].device_kind)},
            "run_s": untraced, "cfg_it_per_s": args.configs * args.steps / untraced,
            "lanes": lanes, "traced_ms": total,
            "by_opcode": [{"op": k, "ms": v, "share": v / total if total else 0.0}
                          for k, v in by_op.most_common()],
            "ops": rows[:50]}


def to_markdown(res) -> str:
    s = res["settings"]
    lines = [f"# profile_sim: {s['system']}, {s['configs']} configs x {s['steps']} "
             f"iterations, {s['requests']} requests, {s['slots']} slots", "",
             f"{s['device']}, jax {s['jax']}; untraced run {res['run_s']:.3f} s "
             f"({res['cfg_it_per_s']:,.0f} config-it/s); time by {res['lanes']}, "
             f"{res['traced_ms']:.0f} ms traced in all.", "",
             "| kernel / thunk | ms | share | calls | operations (HLO) |",
             "|---|---:|---:|---:|---|"]
    for r in res["ops"][:TOP]:
        lines.append(f"| `{r['name'][:60]}` | {r['ms']:.1f} | {r['share']:.1%} | "
                     f"{r['calls']} | {r['ops'][:160]} |")
    lines += ["", "By kind of operation (a kernel's most frequent opcode):", "",
              "| operation | ms | share |", "|---|---:|---:|"]
    lines += [f"| {r['op']} | {r['ms']:.1f} | {r['share']:.1%} |"
              for r in res["by_opcode"][:TOP]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"error: --out {out}: not a folder", file=sys.stderr)
        raise SystemExit(2)
    from models import list_systems

    if args.system not in list_systems():
        print(f"error: --system {args.system!r}: unknown "
              f"(known: {', '.join(list_systems())})",
              file=sys.stderr)
        raise SystemExit(2)
    print(f"profile_sim: {args.system}, {args.configs} configs ...", flush=True)
    res = run(args)
    md = to_markdown(res)
    print(md)
    from experiments.results_io import stamp_markdown, stamped
    from tuner.common.atomic import plain, write_json_atomic, write_text_atomic

    doc = stamped(res)
    write_json_atomic(os.path.join(out, f"profile_{args.system}.json"), plain(doc),
                      sort_keys=False)
    write_text_atomic(os.path.join(out, f"profile_{args.system}.md"),
                      stamp_markdown(md, doc["provenance"]))
    return res


if __name__ == "__main__":
    main()
