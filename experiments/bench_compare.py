"""Simulator throughput of this checkout against another one, side by side in one run.

Runs ``python -m experiments.bench_sim`` (same arguments) in this repository and in
``--baseline DIR`` (a checkout of an earlier commit, e.g. ``git worktree add DIR REV``)
alternately for ``--rounds`` rounds, each in a fresh process, and reports per (system,
configs, devices) the median config-iterations/s of both and their ratio (this /
baseline; the pairs alternate, so a drift of the machine's speed hits both alike).

Usage (from the repository root)::

    git worktree add /tmp/kvtune_base 1e7995e
    python -m experiments.bench_compare --baseline /tmp/kvtune_base --rounds 3 \\
        --out results/bench_compare -- --steps 1024 --configs 64,256

Writes ``bench_compare.json`` and ``bench_compare.md`` to ``--out`` (atomically).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tuner.common.atomic import (plain, unwritable_reason, write_json_atomic,
                                 write_text_atomic)
from experiments.results_io import stamp_markdown, stamped
from tuner.workloads.presets import traces_dir

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]


def _run(repo: Path, bench_args: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        # both read this checkout's traces (a worktree has no ../shared beside it)
        env = {**os.environ, "PYTHONPATH": str(repo), "KVTUNE_TRACES": str(traces_dir())}
        proc = subprocess.run([sys.executable, "-m", "experiments.bench_sim", *bench_args,
                               "--out", tmp], cwd=repo, env=env, capture_output=True,
                              text=True)
        if proc.returncode:
            raise RuntimeError(f"bench_sim in {repo} failed:\n{proc.stderr[-2000:]}")
        return json.loads((Path(tmp) / "bench_sim.json").read_text())["throughput"]


def _commit(repo: Path) -> str | None:
    """The baseline checkout's commit (``+dirty`` with uncommitted changes), so that the
    result says what it was compared against; None outside git."""
    def git(*a):
        return subprocess.run(["git", "-C", str(repo), *a], capture_output=True,
                              text=True)
    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return None
    dirty = git("status", "--porcelain", "--", "hardware", "models", "tuner",
                "experiments").stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="checkout to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("bench_args", nargs="*", help="arguments for bench_sim (after --)")
    args = ap.parse_args(argv)
    base = Path(args.baseline).resolve()
    if not (base / "experiments" / "bench_sim.py").exists():
        print(f"error: --baseline {base}: no experiments/bench_sim.py there", file=sys.stderr)
        raise SystemExit(2)
    if args.rounds < 1:
        print("error: --rounds must be >= 1", file=sys.stderr)
        raise SystemExit(2)
    why = unwritable_reason(Path(args.out)) if args.out else None
    if why:
        print(f"error: --out {args.out}: {why}", file=sys.stderr)
        raise SystemExit(2)
    commit = _commit(base)
    runs: dict[tuple, dict[str, list]] = {}
    for r in range(args.rounds):
        for name, repo in (("this", ROOT), ("baseline", base)):
            print(f"round {r + 1}/{args.rounds}: {name} ({repo})", file=sys.stderr,
                  flush=True)
            for row in _run(repo, args.bench_args):
                key = (row["system"], row["configs"], row["devices"])
                runs.setdefault(key, {"this": [], "baseline": []})[name].append(
                    row["cfg_it_per_s"])
    rows = []
    for (system, configs, devices), v in runs.items():
        ratios = np.asarray(v["this"]) / np.asarray(v["baseline"])
        rows.append({"system": system, "configs": configs, "devices": devices,
                     "this_cfg_it_per_s": float(np.median(v["this"])),
                     "baseline_cfg_it_per_s": float(np.median(v["baseline"])),
                     "ratio_median": float(np.median(ratios)),
                     "ratio_min": float(ratios.min()), "ratio_max": float(ratios.max()),
                     "runs": v})
    res = {"baseline": str(base), "baseline_commit": commit, "rounds": args.rounds,
           "bench_args": args.bench_args, "cpu_count": os.cpu_count(), "rows": rows}
    at = f" at commit {commit[:12]}" if commit else " (not a git checkout)"
    lines = [f"# bench_compare: this checkout vs {base}{at} ({args.rounds} alternating "
             "rounds; "
             f"bench_sim {' '.join(args.bench_args) or '(defaults)'})", "",
             "| system | configs | devices | this cfg-it/s | baseline cfg-it/s | "
             "ratio (median) | ratio min-max |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['system']} | {r['configs']} | {r['devices']} | "
                     f"{r['this_cfg_it_per_s']:,.0f} | {r['baseline_cfg_it_per_s']:,.0f} | "
                     f"{r['ratio_median']:.3f} | {r['ratio_min']:.3f}-{r['ratio_max']:.3f} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        doc = stamped(res)
        write_json_atomic(os.path.join(args.out, "bench_compare.json"), plain(doc),
                          sort_keys=False)
        write_text_atomic(os.path.join(args.out, "bench_compare.md"),
                          stamp_markdown(md, doc["provenance"]))
    return res


if __name__ == "__main__":
    main()
