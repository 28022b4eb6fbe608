"""The stamped record of one ``experiments/gpu_check.sh`` run: the device, and each part's
wall time and exit status (``timeout`` exits 124), from the script's ``times.txt``.

Usage (the script's last step)::

    python -m experiments.gpu_summary --times OUT/times.txt --env OUT/env.txt --out DIR

Writes ``gpu_check.json`` and ``gpu_check.md`` to ``--out`` (atomically).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

__all__ = ["main", "parse_times"]

LINE = re.compile(r"^(?P<part>[^:]+): (?:exit (?P<rc>\d+)(?: \([^)]*\))?, )?"
                  r"(?P<secs>[\d.]+) s")


def parse_times(text: str) -> list[dict]:
    """Each ``part: [exit N, ]S s ...`` line as {part, exit, seconds}; a part's
    ``exit N (timeout ...)`` line without seconds sets its exit status; a ``part: skipped
    (why)`` line is a row with ``skipped`` and no exit or seconds."""
    rows, rcs = [], {}
    for line in text.splitlines():
        m = re.match(r"^(?P<part>[^:]+): exit (?P<rc>\d+) \(timeout", line)
        if m:
            rcs[m["part"]] = int(m["rc"])
            continue
        m = re.match(r"^(?P<part>[^:]+): skipped \((?P<why>[^)]*)\)", line)
        if m:  # a part the script chose not to run
            rows.append({"part": m["part"], "exit": None, "seconds": None,
                         "skipped": m["why"]})
            continue
        m = LINE.match(line)
        if m:
            rc = int(m["rc"]) if m["rc"] is not None else rcs.get(m["part"], 0)
            rows.append({"part": m["part"], "exit": rc, "seconds": float(m["secs"])})
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--times", required=True)
    ap.add_argument("--env", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    for f in (args.times, args.env):
        if not os.path.isfile(f):
            print(f"error: {f}: no such file", file=sys.stderr)
            raise SystemExit(2)
    rows = parse_times(open(args.times).read())
    env = open(args.env).read().strip().splitlines()
    from experiments.results_io import stamp_markdown, stamped
    from tuner.common.atomic import plain, write_json_atomic, write_text_atomic

    doc = stamped({"device": env, "parts": rows})
    md = "\n".join(["# gpu_check", "", *[f"- {e}" for e in env], "",
                    "| part | exit | wall s |", "|---|---:|---:|",
                    *[_row(r) for r in rows]]) + "\n"
    write_json_atomic(os.path.join(args.out, "gpu_check.json"), plain(doc),
                      sort_keys=False)
    write_text_atomic(os.path.join(args.out, "gpu_check.md"),
                      stamp_markdown(md, doc["provenance"]))
    print(md)
    return doc


def _row(r: dict) -> str:
    if r.get("skipped"):
        return f"| {r['part']} | skipped: {r['skipped']} | |"
    limit = " (time limit)" if r["exit"] == 124 else ""
    return f"| {r['part']} | {r['exit']}{limit} | {r['seconds']:.1f} |"


if __name__ == "__main__":
    main()
