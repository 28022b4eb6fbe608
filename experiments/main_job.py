"""The README's main job, run as the README gives it, timed and committed as a result.

``python3 -m experiments.main_job --out experiments/results/main_job`` runs

    python3 -m tuner.fit <README_ARGS> --out DIR/policy.json --log DIR/fit.log

as a child process (the README's own arguments, :data:`README_ARGS`; only the output
paths differ, and ``tests/test_results.py`` checks that the README's command is this
one), times it as a whole process (wall, user + system CPU of the child, its peak
resident memory) and writes ``DIR/main_job.json`` (provenance, the command, the timing,
the exit code and a summary of the policy's verdict and held-out metrics) and
``DIR/main_job.md``. The policy and the log are the fit's own files. Progress: the fit's
own output, streamed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from experiments.results_io import stamp_markdown, stamped
from tuner.common.atomic import unwritable_reason, write_json_atomic, write_text_atomic

__all__ = ["README_ARGS", "run", "summarise", "main"]

#: the README's main-job command line after ``python3 -m tuner.fit`` (less ``--out``)
README_ARGS = ("--export-anyway",)
METRIC = "goodput_rps"


def summarise(policy: dict) -> dict:
    """What the README quotes: the verdict and each policy's held-out goodput."""
    met = policy.get("metrics") or {}
    rows = {}
    for name in ("tuned", "default"):
        if name in met:
            rows[name] = met[name]
    rows.update(met.get("baselines") or {})
    out = {}
    for name, m in rows.items():
        ci = (m.get("ci") or {}).get(METRIC)
        whole = (m.get("whole_trace") or {}).get(METRIC)
        out[name] = {"held_out": m.get(METRIC), "ci": ci, "whole_slice": whole,
                     "samples": m.get("samples")}
    v = policy.get("verdict") or {}
    return {"verdict": v.get("outcome"), "reason": v.get("reason") or v.get("sentence"),
            "best_baseline": v.get("best_baseline"), "goodput_rps": out,
            "params": policy.get("params")}


def run(out: Path) -> dict:
    cmd = [sys.executable, "-m", "tuner.fit", *README_ARGS,
           "--out", str(out / "policy.json"), "--log", str(out / "fit.log")]
    print("running:", " ".join(["python3", *cmd[1:]]), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = {"command": "python3 -m tuner.fit " + " ".join(
               [*README_ARGS, "--out", "DIR/policy.json", "--log", "DIR/fit.log"]),
           "readme_command": "python3 -m tuner.fit " + " ".join(README_ARGS)
           + " --out results/policy.json",
           "exit_code": proc.returncode,
           "timing": {"wall_s": round(wall, 1), "cpu_s": round(ru.ru_utime + ru.ru_stime, 1),
                      "peak_rss_mib": round(ru.ru_maxrss / 1024, 1),
                      "how": "the fit as one child process: wall clock around it, "
                             "getrusage(RUSAGE_CHILDREN) for CPU and peak memory"}}
    pol = out / "policy.json"
    if pol.is_file():
        res["summary"] = summarise(json.loads(pol.read_text(encoding="utf-8")))
    # the replay dataset the fit writes beside the policy (megabytes of one-token words)
    # is not kept: `python3 -m tuner.bench_dataset DIR/policy.json` writes it again
    data = out / "policy.dataset.jsonl"
    if data.is_file():
        blob = data.read_bytes()
        res["dataset_removed"] = {"file": data.name, "bytes": len(blob),
                                  "sha256": hashlib.sha256(blob).hexdigest()[:16],
                                  "rewrite": "python3 -m tuner.bench_dataset "
                                             "DIR/policy.json"}
        data.unlink()
    return res


def render(res: dict) -> str:
    t = res["timing"]
    s = res.get("summary") or {}
    L = ["# The main job", "", f"`{res['readme_command']}` (README), run by "
         "`python3 -m experiments.main_job`.", "",
         f"- exit code {res['exit_code']}; whole process {t['wall_s']:.0f} s wall, "
         f"{t['cpu_s']:.0f} s CPU, peak {t['peak_rss_mib']:.0f} MiB",
         f"- verdict: **{s.get('verdict')}**" + (f" ({s['reason']})" if s.get("reason")
                                                  else ""), "",
         "| policy | held-out goodput (req/s) | 95% interval | whole slice |",
         "|---|---:|---|---:|"]
    for name, r in (s.get("goodput_rps") or {}).items():
        ci = r.get("ci")
        ci_s = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci and None not in ci else "—"
        ho = f"{r['held_out']:.3f}" if r.get("held_out") is not None else "—"
        wh = f"{r['whole_slice']:.3f}" if r.get("whole_slice") is not None else "—"
        L.append(f"| {name} | {ho} | {ci_s} | {wh} |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.main_job",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="result folder")
    args = ap.parse_args(argv)
    why = unwritable_reason(args.out)
    if why:
        print(f"error: --out {args.out}: {why}", file=sys.stderr)
        return 2
    res = stamped(run(args.out))
    write_json_atomic(args.out / "main_job.json", res, sort_keys=False)
    write_text_atomic(args.out / "main_job.md", stamp_markdown(render(res),
                                                               res["provenance"]))
    print(render(res))
    return 0 if res["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
