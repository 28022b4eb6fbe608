"""Summarise a trace file or preset: ``python -m tuner.workloads.trace PATH_OR_PRESET [--json]``.

Prints request count, span, inter-arrival CV and token-length statistics; ``--json``
prints them as one JSON object. A bad trace prints one ``error: ...`` line on stderr
(naming the file, line and field), nothing on stdout, and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from tuner.workloads.presets import PRESETS, resolve_trace
from tuner.workloads.traces import summary

__all__ = ["format_summary", "main"]


def format_summary(stats: dict) -> str:
    """The human-readable form of :func:`tuner.workloads.traces.summary`'s dict."""
    def opt(value, fmt, unit=""):
        return "n/a (no arrival times)" if value is None else format(value, fmt) + unit

    rate = None
    if stats["duration_s"]:
        rate = (stats["requests"] - 1) / stats["duration_s"]
    lines = [f"{stats['source']} ({stats['format']})",
             f"  requests         {stats['requests']:,}",
             f"  duration         {opt(stats['duration_s'], ',.1f', ' s')}",
             f"  mean rate        {opt(rate, '.3f', ' req/s')}",
             f"  inter-arrival CV {opt(stats['interarrival_cv'], '.3f')}",
             f"  {'tokens':16} {'mean':>10} {'p50':>10} {'p99':>10} {'max':>10}"]
    for name in ("prompt_tokens", "output_tokens"):
        s = stats[name]
        lines.append(f"  {name:16} {s['mean']:10.1f} {s['p50']:10.1f} "
                     f"{s['p99']:10.1f} {s['max']:10,d}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tuner.workloads.trace", description="Summarise a request trace.",
        epilog="presets: " + ", ".join(f"{k} ({v[2]})" for k, v in PRESETS.items()))
    parser.add_argument("trace", help="trace file, CASTILLO directory or glob, "
                        "or a preset name")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("-n", type=int, default=None,
                        help="keep only the first N requests (size of 'default')")
    parser.add_argument("--seed", type=int, default=0, help="seed for 'default'")
    parser.add_argument("--sample", type=int, default=0,
                        help="CASTILLO generation used as the output length")
    args = parser.parse_args(argv)
    from tuner.common.argv import given_dests

    given = given_dests(parser, argv)
    try:
        # a flag the trace does not read is an error, not silently ignored
        if "seed" in given and args.trace != "default":  # known before any loading
            raise ValueError(f"--seed {args.seed}: only the 'default' trace is drawn "
                             f"from a seed, not {args.trace!r}")
        trace = resolve_trace(args.trace, seed=args.seed, n=args.n, sample=args.sample)
        if "sample" in given and trace.output_samples is None:
            raise ValueError(f"--sample {args.sample}: {args.trace!r} has one output "
                             "length per request (only CASTILLO holds several)")
        stats = summary(trace)
    except (ValueError, OSError) as e:  # TraceError is a ValueError
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"error: {message}", file=sys.stderr)
        return 2
    print(json.dumps(stats) if args.json else format_summary(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
