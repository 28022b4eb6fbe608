"""The README's speed table, generated from the committed ``bench_sim`` results:
``python -m experiments.speed_table [--write-readme]``.

One row per system and machine: one config's iterations/s and the config-iterations/s of
the largest vmapped sweep measured (sweeps the benchmark skipped as over its time box
are named), with the result file and the commit that made it. ``--write-readme``
replaces the block between ``<!-- speed -->`` and ``<!-- /speed -->`` in README.md;
``tests/test_results.py`` checks that the README's block is the one this prints.
"""

from __future__ import annotations

import argparse
import json
import sys

from experiments import stale
from tuner.common.provenance import ROOT

__all__ = ["BEGIN", "END", "rows", "block", "main"]

RESULTS = ROOT / "experiments" / "results"
BEGIN, END = "<!-- speed -->", "<!-- /speed -->"


def _machine(s: dict) -> str:
    kind = s.get("device_kind", "cpu")
    if kind.lower() == "cpu":
        return f"{s['cpu_count']} CPU cores" + (f", {s['devices']} host devices"
                                                 if s.get("devices", 1) > 1 else "")
    return kind


def _g(x: float) -> str:
    """Two significant digits as 1.3e5 (not 1.3e+05)."""
    m, e = f"{x:.1e}".split("e")
    return f"{m}e{int(e)}"


def rows() -> list[dict]:
    """Every bench_sim result's systems: machine, 1-config it/s, the largest sweep."""
    status = {r.path: r.status for r in stale.scan()}
    out = []
    for f in sorted(RESULTS.glob("bench_sim*/bench_sim.json")):
        doc = json.loads(f.read_text())
        s = doc["settings"]
        for system in dict.fromkeys(r["system"] for r in doc["throughput"]):
            rs = [r for r in doc["throughput"] if r["system"] == system]
            one = next(r for r in rs if r["configs"] == 1 and r["devices"] == 1)
            ran = [r for r in rs if "cfg_it_per_s" in r and r["configs"] > 1]
            best = max(ran, key=lambda r: (r["configs"], r["devices"]), default=None)
            skipped = [r["configs"] for r in rs if "skipped" in r]
            out.append({"system": system, "machine": _machine(s), "jax": s["jax"],
                        "requests": s["requests"], "slots": s["slots"],
                        "steps": s["steps"], "one_config": one["cfg_it_per_s"],
                        "sweep_configs": best["configs"] if best else None,
                        "sweep_devices": best["devices"] if best else None,
                        "sweep": best["cfg_it_per_s"] if best else None,
                        "skipped": skipped, "file": str(f.relative_to(ROOT)),
                        "status": status.get(str(f.relative_to(ROOT)), "unknown"),
                        "commit": doc["provenance"]["commit"][:7]
                        + ("+" if doc["provenance"].get("dirty") else "")})
    return out


def block(rs: list[dict]) -> str:
    lines = [BEGIN, "", "| system | machine | 1 config it/s | largest sweep config-it/s "
             "| requests / slots / steps | result (commit, status) |",
             "|---|---|---:|---:|---|---|"]
    for r in rs:
        sweep = (f"{_g(r['sweep'])} ({r['sweep_configs']:,} configs"
                 + (f", {r['sweep_devices']} devices" if r["sweep_devices"] > 1 else "")
                 + ")") if r["sweep"] else "-"
        if r["skipped"]:
            sweep += "; " + ", ".join(f"{n:,}" for n in r["skipped"]) + " skipped (time box)"
        lines.append(f"| {r['system']} | {r['machine']} | {_g(r['one_config'])} | {sweep} "
                     f"| {r['requests']:,} / {r['slots']} / {r['steps']:,} | "
                     f"`{r['file']}` ({r['commit']}, {r['status']}) |")
    lines += ["", "(written by `python3 -m experiments.speed_table --write-readme`; "
              "a commit with + had uncommitted changes)", "", END]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.speed_table",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-readme", action="store_true",
                    help="replace the README's block with the current one")
    args = ap.parse_args(argv)
    b = block(rows())
    if args.write_readme:
        changed = stale.write_readme(b, BEGIN, END)
        print("README.md: " + ("updated" if changed else "already current"))
    else:
        print(b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
