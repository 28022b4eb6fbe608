"""The README's main job, run as the README gives it, timed and committed as a result.

``python3 -m experiments.main_job --out experiments/results/main_job`` runs

    python3 -m tuner.fit <README_ARGS> --out DIR/policy.json --log DIR/fit.log

as a child process (the README's own arguments, :data:`README_ARGS`; only the output
paths differ, and ``tests/test_results.py`` checks that the README's command is this
one), on a new empty JAX compilation cache (cold), then once more on that cache (warm;
its policy must equal the cold run's), times each as a whole process (wall, user + system CPU of the child, its peak
resident memory) and writes ``DIR/main_job.json`` (provenance, the command, the timing,
the exit code and a summary of the policy's verdict and held-out metrics) and
``DIR/main_job.md``. The policy and the log are the fit's own files. Progress: the fit's
own output, streamed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.out_folder import out_folder
from experiments.results_io import stamp_markdown, stamped
from tuner.common.atomic import write_json_atomic, write_text_atomic

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
    paired = {name: {k: c.get(k) for k in ("diff", "ci", "relative", "n", "status")}
              for name, c in (v.get("comparisons") or {}).items()}
    return {"verdict": v.get("outcome"), "reason": v.get("reason") or v.get("sentence"),
            "best_baseline": v.get("best_baseline"), "goodput_rps": out,
            "paired": paired, "system": policy.get("system"),
            "params": policy.get("params")}


PROGRAMS = re.compile(r"(\d+) simulator programs \(([^)]*)\); (\d+) programs built in "
                      r"([\d.]+) s: (\d+) compiled by XLA, (\d+) read from the persistent "
                      r"cache")


def _child(cmd: list[str], env: dict) -> dict:
    """Run ``cmd`` as a child process: its exit code, wall clock, CPU and peak memory."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru.ru_utime + ru.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"exit_code": proc.returncode, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "peak_rss_mib": round(ru.ru_maxrss / 1024, 1)}


def _programs(log: Path) -> dict | None:
    """The fit's own count of the programs it built (its last lines)."""
    m = PROGRAMS.search(log.read_text(encoding="utf-8")) if log.is_file() else None
    return None if m is None else {
        "simulator_programs": int(m[1]), "simulator_programs_by_entry": m[2],
        "programs": int(m[3]), "build_s": float(m[4]), "compiled": int(m[5]),
        "from_cache": int(m[6])}


def _comparable(policy: Path) -> dict:
    d = json.loads(policy.read_text(encoding="utf-8"))
    for k in ("created", "provenance", "wall_s"):
        d.pop(k, None)
    return d


def run(out: Path) -> dict:
    """The README's command twice, on a new empty compilation cache: cold (it compiles
    every program) and warm (it reads them); the cold run's policy and log are kept,
    the warm run's policy must equal it."""
    cmd = [sys.executable, "-m", "tuner.fit", *README_ARGS,
           "--out", str(out / "policy.json"), "--log", str(out / "fit.log")]
    print("running:", " ".join(["python3", *cmd[1:]]), file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="kvtune-main-job-") as tmp:
        env = dict(os.environ, KVTUNE_JAX_CACHE=str(Path(tmp) / "jax-cache"))
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        cold = _child(cmd, env)
        cold["programs"] = _programs(out / "fit.log")
        warm_dir = Path(tmp) / "warm"
        warm_cmd = [*cmd[:-4], "--out", str(warm_dir / "policy.json"),
                    "--log", str(warm_dir / "fit.log")]
        print("running again on the filled cache (warm)", file=sys.stderr, flush=True)
        warm = _child(warm_cmd, env)
        warm["programs"] = _programs(warm_dir / "fit.log")
        same = (cold["exit_code"] == warm["exit_code"] == 0
                and _comparable(out / "policy.json")
                == _comparable(warm_dir / "policy.json"))
    how = ("the fit as one child process: wall clock around it, getrusage(RUSAGE_CHILDREN) "
           "for CPU and peak memory; cold: a new empty JAX compilation cache "
           "(KVTUNE_JAX_CACHE), warm: the same command again on that cache")
    res = {"command": "python3 -m tuner.fit " + " ".join(
               [*README_ARGS, "--out", "DIR/policy.json", "--log", "DIR/fit.log"]),
           "readme_command": "python3 -m tuner.fit " + " ".join(README_ARGS)
           + " --out results/policy.json",
           "exit_code": cold["exit_code"],
           "timing": {**{k: cold[k] for k in ("wall_s", "cpu_s", "peak_rss_mib")},
                      "how": how},
           "cold": cold, "warm": warm, "warm_policy_equal": same}
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


def _programs_text(run: dict | None) -> str:
    p = (run or {}).get("programs")
    return "" if not p else (f"; {p['simulator_programs']} simulator programs "
                             f"({p['simulator_programs_by_entry']}) among "
                             f"{p['programs']} programs built in {p['build_s']:.1f} s "
                             f"({p['compiled']} compiled, {p['from_cache']} from the cache)")


def render(res: dict) -> str:
    t = res["timing"]
    s = res.get("summary") or {}
    wh_any = any(r.get("whole_slice") is not None
                 for r in (s.get("goodput_rps") or {}).values())
    L = ["# The main job", "", f"`{res['readme_command']}` (README), run by "
         "`python3 -m experiments.main_job`.", "",
         f"- exit code {res['exit_code']}; whole process {t['wall_s']:.0f} s wall, "
         f"{t['cpu_s']:.0f} s CPU, peak {t['peak_rss_mib']:.0f} MiB (cold: an empty "
         "compilation cache)" + _programs_text(res.get("cold")),
         *([f"- warm (the same command again, programs read from the cache): "
            f"{res['warm']['wall_s']:.0f} s wall, {res['warm']['cpu_s']:.0f} s CPU"
            + _programs_text(res["warm"]) + "; policy "
            + ("identical" if res.get("warm_policy_equal") else "**different**")]
           if res.get("warm") else []),
         f"- verdict: **{s.get('verdict')}**" + (f" ({s['reason']})" if s.get("reason")
                                                  else ""), "",
         "| policy | held-out goodput (req/s) | 95% interval |"
         + (" whole slice (in-sample) |" if wh_any else ""),
         "|---|---:|---|" + ("---:|" if wh_any else "")]
    for name, r in (s.get("goodput_rps") or {}).items():
        ci = r.get("ci")
        ci_s = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci and None not in ci else "—"
        ho = f"{r['held_out']:.3f}" if r.get("held_out") is not None else "—"
        wh = f"{r['whole_slice']:.3f}" if r.get("whole_slice") is not None else "—"
        L.append(f"| {name} | {ho} | {ci_s} |" + (f" {wh} |" if wh_any else ""))
    if s.get("paired"):
        L += ["", "Paired held-out differences (tuned minus each, same window and seed):",
              "", "| against | tuned - it (req/s) | 95% interval | relative | samples | "
              "status |", "|---|---:|---|---:|---:|---|"]
        for name, c in s["paired"].items():
            ci = c.get("ci")
            ci_s = (f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci and None not in ci
                    and ci[0] == ci[0] else "—")
            rel = f"{c['relative']:+.1%}" if c.get("relative") is not None else "—"
            diff = f"{c['diff']:+.3f}" if c.get("diff") is not None else "—"
            L.append(f"| {name} | {diff} | {ci_s} | {rel} | {c.get('n')} | "
                     f"{c.get('status')} |")
    if s.get("params"):
        L += ["", f"Tuned {s.get('system')} parameters: " + ", ".join(
            f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}"
            for k, v in s["params"].items())]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    out = out_folder("python -m experiments.main_job", __doc__, argv)
    if out is None:
        return 2
    res = stamped(run(out))
    write_json_atomic(out / "main_job.json", res, sort_keys=False)
    write_text_atomic(out / "main_job.md", stamp_markdown(render(res),
                                                          res["provenance"]))
    print(render(res))
    return 0 if res["exit_code"] == 0 and res["warm_policy_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
