"""Calibrate the step-time model to your own server: ``python -m tuner.calibrate``.

Fit (writes a device profile that ``tuner.evaluate``, ``tuner.fit`` and ``tuner.sweep``
take as ``--hardware PROFILE.json``)::

    python -m tuner.calibrate --measured RUN.json [RUN2.json ...] --hardware a100-80gb \\
        --model Qwen/Qwen3-8B --out profile.json

Check a profile against measurements, without fitting::

    python -m tuner.calibrate --no-fit --hardware profile.json --measured RUN.json

``--measured`` files are serving-benchmark results (vLLM ``--save-result
--save-detailed`` JSON, SGLang ``--output-details`` JSONL; see
``tuner.workloads.bench_results``). Their requests are replayed at their own send times
on the simulated paged server; the engine settings come from a ``.manifest.json``
beside the file when there is one, else from the flags (vLLM's own flag names).
The last ``--holdout`` share of each file's requests (by send time) is left out of the
fit and only predicted; ``--heldout`` files are predicted, never fitted.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # progress from the first second: the imports take ~2 s
    print("tuner.calibrate: loading ...", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from tuner.calibration import roofline_fit as cal  # noqa: E402
from tuner.calibration.measured import SYSTEM, compare, measured_target, spec_for  # noqa: E402
from tuner.common import compile_cache  # noqa: E402
from tuner.common.atomic import plain, write_json_atomic  # noqa: E402
from tuner.cli import add_scenario_args, spec_from_args  # noqa: E402
from tuner.scenario import ScenarioSpec, build_scenario, resolve_hardware  # noqa: E402
from tuner.workloads.traces import TraceError  # noqa: E402

__all__ = ["main", "compare", "spec_for"]


def _table(title: str, rows: dict) -> str:
    lines = [title, f"  {'metric':12s} {'measured':>10s} {'before':>10s} {'after':>10s} "
             f"{'err before':>10s} {'err after':>10s}"]
    for k in cal.METRICS:
        b, a = rows["before"], rows["after"]
        ms = lambda v: f"{1e3 * v:9.2f}ms" if math.isfinite(v) else f"{'-':>11s}"  # noqa
        pc = lambda v: f"{100 * v:+9.1f}%" if math.isfinite(v) else f"{'-':>10s}"  # noqa
        lines.append(f"  {k:12s} {ms(a[k + '_measured'])}{ms(b[k + '_predicted'])}"
                     f"{ms(a[k + '_predicted'])} {pc(b[k + '_rel_error'])} "
                     f"{pc(a[k + '_rel_error'])}")
    return "\n".join(lines)


def _device_record(name: str) -> dict:
    """``{"device_record": ...}`` for a device that is not a preset (read from a device
    file): the profile then loads in a process that never read that file."""
    from hardware._device_presets import PRESETS
    from hardware.devices import device_record, get_device

    if name.lower() in {d.name.lower() for d in PRESETS}:
        return {}
    return {"device_record": device_record(get_device(name))}


# the flags only a fit reads, and those only one fitting method reads
FIT_ONLY = ("fit", "method", "starts", "budget", "fit_seed")
METHOD_ONLY = {"starts": "gradient", "budget": "cma"}


def _check_unread(ap, argv, args) -> None:
    """ValueError naming a flag the run would ignore (a fit's flag with --no-fit, a
    method's flag with the other method), not a silent default."""
    from tuner.common.argv import given_dests

    given = given_dests(ap, argv)
    if args.no_fit:
        unread = [o for d, o in given.items() if d in FIT_ONLY]
        if unread:
            raise ValueError(f"{', '.join(unread)}: not read with --no-fit (nothing is "
                             "fitted)")
    for dest, method in METHOD_ONLY.items():
        if dest in given and args.method != method:
            raise ValueError(f"{given[dest]}: read by --method {method} only, not "
                             f"{args.method}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", nargs="+", required=True, metavar="FILE",
                    help="benchmark result files to fit (one device)")
    ap.add_argument("--heldout", nargs="*", default=[], metavar="FILE",
                    help="result files only predicted (another rate or run)")
    ap.add_argument("--out", help="device profile to write (JSON)")
    ap.add_argument("--no-fit", action="store_true",
                    help="only compare the --hardware (preset or profile) with the files")
    ap.add_argument("--fit", default=None,
                    help=f"parameters to fit, comma-separated, of {', '.join(cal.PARAMS)} "
                    f"(default {','.join(cal.DEFAULT_FIT)}, plus tp_comm_eff at tp > 1)")
    ap.add_argument("--holdout", type=float, default=0.3,
                    help="share of each fitted file's last requests left out of the fit "
                    "and predicted (default 0.3)")
    ap.add_argument("--method", choices=("gradient", "cma"), default="gradient",
                    help="gradient (default) or the black-box baseline CMA-ES")
    ap.add_argument("--starts", type=int, default=8, help="gradient: starting points")
    ap.add_argument("--budget", type=int, default=200, help="cma: evaluations at most")
    ap.add_argument("--fit-seed", type=int, default=0, help="starting points' seed")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    add_scenario_args(ap)
    args = ap.parse_args(argv)
    compile_cache.enable()
    given = {k for k, v in vars(args).items() if v is not None}
    try:
        if not 0.0 <= args.holdout < 1.0:
            raise ValueError(f"--holdout must be a share in [0, 1), got {args.holdout}")
        if not args.no_fit and not args.out:
            raise ValueError("--out PROFILE.json is required to fit (or pass --no-fit)")
        _check_unread(ap, argv, args)
        if args.out:
            from tuner.cli import check_out

            check_out(Path(args.out))
        names = None
        if args.fit:
            names = [n.strip() for n in args.fit.split(",") if n.strip()]
            bad = set(names) - set(cal.PARAMS)
            if bad:
                raise ValueError(f"--fit: unknown parameter(s) {sorted(bad)}; known: "
                                 f"{', '.join(cal.PARAMS)}")
        base = spec_from_args(args, ScenarioSpec(hardware=args.hardware or "",
                                                 n_requests=None))
        if not args.hardware:
            raise ValueError("--hardware is required: a device preset or a profile file")
        device, calibrated, _ = resolve_hardware(args.hardware)
        files = [(f, True) for f in args.measured] + [(f, False) for f in args.heldout]
        pairs, all_ = [], []
        for path, fitted in files:
            print(f"tuner.calibrate: {path}: building the scenario", file=sys.stderr,
                  flush=True)
            spec, meas = spec_for(path, base, given)
            sc = build_scenario(spec)
            if len(meas.ttft_s) != sc.workload.size:
                raise ValueError(f"{path}: {len(meas.ttft_s)} measured requests but the "
                                 f"scenario has {sc.workload.size}")
            for w in meas.warnings + tuple(sc.warnings):
                print(f"tuner.calibrate: {path}: warning: {w}", file=sys.stderr)
            target = measured_target(meas, args.holdout, fitted)
            all_.append((path, sc, meas, target, fitted))
            if fitted:
                pairs.append((sc, target))
    except (ValueError, TraceError, OSError) as e:
        print(f"tuner.calibrate: error: {e}", file=sys.stderr)
        return 2

    before = cal.current(all_[0][1].hw)
    after, res = before, None
    if not args.no_fit:
        def progress(row):
            print(f"tuner.calibrate: {row}", file=sys.stderr, flush=True)
        if args.method == "gradient":
            res = cal.fit(pairs, system=SYSTEM, fit_names=names, starts=args.starts,
                          seed=args.fit_seed, progress=progress)
        else:
            res = cal.fit_cma(pairs, system=SYSTEM, fit_names=names, budget=args.budget,
                              seed=args.fit_seed, progress=progress)
        after = res.params
    report = {"files": []}
    for path, sc, meas, target, fitted in all_:
        parts = {"all": np.ones(len(target.fit_mask), bool)}
        if fitted and not target.fit_mask.all():
            parts["fit"], parts["heldout"] = target.fit_mask, ~target.fit_mask
        row = {"file": str(path), "fitted": fitted, "n_requests": int(sc.workload.size)}
        for part, mask in parts.items():
            row[part] = {"before": compare(sc, meas, before, mask),
                         "after": compare(sc, meas, after, mask)}
        report["files"].append(row)
    if res is not None:
        report["fit"] = {"method": args.method, "fitted": list(res.fitted),
                         "loss_start": res.loss_start, "loss": res.loss,
                         "exact_runs": res.exact_runs,
                         "gradient_steps": res.gradient_steps,
                         "seconds": round(res.seconds, 2), "rounds": res.rounds}
    report["params_before"], report["params_after"] = before, after
    if args.out:
        sc0 = all_[0][1]
        profile = {"format": cal.PROFILE_FORMAT, "device": device,
                   "model": sc0.deployment.model.name, "tp": int(sc0.deployment.tp),
                   "params": after,
                   **_device_record(device),
                   "meaning": {k: cal.PARAMS[k][2] for k in after},
                   "calibrated_from": [str(f) for f in args.measured],
                   "engine": {"scheduler": sc0.spec.scheduler,
                              "max_num_batched_tokens": sc0.spec.max_prefill,
                              "max_num_seqs": sc0.spec.max_batch},
                   "report": report}
        try:  # checked before the work; a full disk can still refuse it
            write_json_atomic(args.out, plain(profile), sort_keys=False, indent=1)
        except OSError as e:
            print(f"tuner.calibrate: error: --out {args.out}: writing it failed "
                  f"({e.strerror or e}); nothing written", file=sys.stderr)
            return 2
        print(f"tuner.calibrate: wrote {args.out}", file=sys.stderr)
    if args.json:
        print(json.dumps(plain(_flat(report) if args.no_fit else report), indent=1))
    else:
        for row in report["files"]:
            for part in ("all", "fit", "heldout"):
                if part in row:
                    print(_table(f"{row['file']} [{part}] ({'fitted' if row['fitted'] else 'predicted'})",
                                 row[part]))
        if res is not None:
            print(f"fit ({args.method}): loss {res.loss_start:.4g} -> {res.loss:.4g} in "
                  f"{res.seconds:.1f} s, {res.exact_runs} exact runs")
            for k in res.fitted:
                print(f"  {k:20s} {before[k]:.4g} -> {after[k]:.4g}")
    return 0


def _flat(report: dict) -> dict:
    """--no-fit --json: the first file's all-request comparison at the top level."""
    first = report["files"][0]["all"]["before"]
    return {**first, "files": report["files"]}


if __name__ == "__main__":
    sys.exit(main())
