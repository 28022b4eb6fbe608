"""Fit the built-in default workload to the Azure LLM conversation trace.

Writes ``tuner/workloads/data/default_workload.json``: 101 percentiles (p0..p100) of prompt and
output tokens, their Spearman rank correlation, the mean arrival rate and the
inter-arrival CV, with the trace's provenance taken from the traces README. The output
is deterministic, so re-running it on the same trace leaves the file unchanged.

Usage (from the repository root)::

    python -m experiments.make_default_workload [--trace PATH] [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from tuner.common.atomic import write_bytes_atomic
from tuner.workloads.presets import DEFAULT_TABLE, SCHEMA_VERSION, traces_dir
from tuner.workloads.traces import load_trace

__all__ = ["build_table", "main", "provenance", "spearman", "write_atomic"]

TRACE_NAME = "azure-llm-2023-conv.csv"


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)
    return (last - (counts - 1) / 2.0)[inverse]


def spearman(x, y) -> float:
    """Spearman's rank correlation (Pearson correlation of tie-averaged ranks)."""
    rx = _average_ranks(np.asarray(x, dtype=np.float64))
    ry = _average_ranks(np.asarray(y, dtype=np.float64))
    return float(np.corrcoef(rx, ry)[0, 1])


def provenance(readme: Path, name: str) -> dict:
    """``source`` and ``licence`` of ``name`` from the traces README's table."""
    for line in readme.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] == f"`{name}`":
            return {"source": cells[1], "licence": cells[2]}
    raise ValueError(f"{readme}: no row for `{name}` in the traces table")


def build_table(trace_path: Path, readme: Path) -> dict:
    """The default-workload table for the trace at ``trace_path``."""
    trace = load_trace(trace_path)
    if trace.arrival_s is None or len(trace) < 3:
        raise ValueError(f"{trace_path}: need a trace with arrival times")
    gaps = np.diff(trace.arrival_s)
    q = np.arange(101)

    def pct(x):
        return [round(float(v), 4) for v in np.percentile(x, q)]

    return {
        "schema_version": SCHEMA_VERSION,
        **provenance(readme, trace_path.name),
        "generated_by": "experiments/make_default_workload.py",
        "input": trace_path.name,
        "input_sha256": hashlib.sha256(trace_path.read_bytes()).hexdigest(),
        "rows": len(trace),
        "duration_s": round(float(trace.arrival_s[-1]), 6),
        "rate_rps": round((len(trace) - 1) / float(trace.arrival_s[-1]), 6),
        "interarrival_cv": round(float(gaps.std() / gaps.mean()), 6),
        "spearman_prompt_output": round(
            spearman(trace.prompt_tokens, trace.output_tokens), 6),
        "percentiles": list(map(int, q)),
        "prompt_tokens": pct(trace.prompt_tokens),
        "output_tokens": pct(trace.output_tokens),
    }


def write_atomic(path: Path, table: dict) -> None:
    """Write ``table`` as JSON to ``path`` via a temporary file and a rename."""
    items = (f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items())
    text = "{\n" + ",\n".join(items) + "\n}\n"  # one field per line, lists inline
    write_bytes_atomic(path, text.encode("utf-8"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.make_default_workload",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=traces_dir() / TRACE_NAME)
    parser.add_argument("--readme", type=Path, default=None,
                        help="traces README with provenance (default: beside --trace)")
    parser.add_argument("--out", type=Path, default=DEFAULT_TABLE)
    args = parser.parse_args(argv)
    table = build_table(args.trace, args.readme or args.trace.parent / "README.md")
    write_atomic(args.out, table)
    print(f"wrote {args.out}: {table['rows']} rows, {table['rate_rps']:.3f} req/s, "
          f"CV {table['interarrival_cv']:.3f}, "
          f"Spearman {table['spearman_prompt_output']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
