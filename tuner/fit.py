"""Tune a memory policy by gradient and export it: ``python -m tuner.fit``.

Trains on the first ``--n-train`` requests of the trace, validates in exact mode on the
next ``--n-holdout`` requests under held-out seeds, and writes ``--out`` only if the tuned
policy is at least as good as the papers' default on the objective.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from tuner.atomic import write_json_atomic
from tuner.evaluate import add_scenario_args, spec_from_args
from tuner.fitting import FitSettings, fit, validate
from tuner.problem import FD_SCHEMES
from tuner.objectives import parse_objective
from tuner.policy import make_policy
from tuner.scenario import ScenarioSpec, build_scenario

__all__ = ["main"]


def _args(argv):
    d = FitSettings()
    ap = argparse.ArgumentParser(prog="python -m tuner.fit", description=__doc__)
    ap.add_argument("--system", default=d.system)
    ap.add_argument("--objective", default=d.objective,
                    help="preset or spec, e.g. 'tps,migration_rate<=0.005'")
    ap.add_argument("--margin", type=float, default=d.margin,
                    help="train against constraint bounds tightened by this share of "
                    "their slack (0: the bounds as given); held-out validation and the "
                    "export gate use the real bounds")
    ap.add_argument("--budget", type=int, default=d.budget, help="optimiser steps")
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--crn", type=int, default=d.crn, help="CRN workloads per evaluation")
    ap.add_argument("--explore", type=int, default=d.explore,
                    help="exact random samples that compete with the start point")
    ap.add_argument("--check-every", type=int, default=d.check_every,
                    help="steps between exact-mode checks")
    ap.add_argument("--fd-scheme", choices=FD_SCHEMES, default=d.fd_scheme,
                    help="exact finite differences: central (default) or forward (half "
                    "the evaluations, less robust on jagged objectives)")
    ap.add_argument("--n-train", type=int, default=600)
    ap.add_argument("--n-holdout", type=int, default=600)
    ap.add_argument("--holdout-seeds", type=int, default=d.holdout_seeds)
    ap.add_argument("--out", default="policy.json")
    ap.add_argument("--resume", action="store_true", help="continue from OUT.ckpt")
    ap.add_argument("--quiet", action="store_true")
    add_scenario_args(ap)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _args(argv)
    out = Path(args.out)
    ckpt = out.with_name(out.name + ".ckpt")
    log = (lambda s: None) if args.quiet else (lambda s: tqdm.write(s, file=sys.stderr))
    try:
        if args.budget < 1 or args.n_train < 1 or args.n_holdout < 1:
            raise ValueError("--budget, --n-train and --n-holdout must be >= 1")
        base = spec_from_args(args, ScenarioSpec())
        seed = base.seed
        train = base.replace(offset=base.offset, n_requests=args.n_train)
        n_total = build_scenario(base.replace(n_requests=None)).summary["requests"] \
            if base.n_requests is None else base.n_requests
        hold_off = base.offset + args.n_train
        if hold_off + args.n_holdout <= base.offset + n_total:
            holdout = base.replace(offset=hold_off, n_requests=args.n_holdout)
            hold_note = f"requests [{hold_off}, {hold_off + args.n_holdout})"
        else:
            holdout = train
            hold_note = "the training slice (trace too short for a held-out slice)"
        st = FitSettings(system=args.system, objective=args.objective, margin=args.margin,
                         budget=args.budget, lr=args.lr, crn=args.crn, explore=args.explore,
                         check_every=args.check_every, fd_scheme=args.fd_scheme,
                         holdout_seeds=args.holdout_seeds, seed=seed)
        st.check()
        bar = tqdm(total=args.budget, desc="fit", file=sys.stderr, disable=args.quiet)
        last = {}

        def progress(rec):
            last.update(rec)
            post = {"T": f"{rec['temperature']:.3g}", "relaxed": f"{rec['relaxed']:.4g}"}
            if "exact" in last:
                post["exact"] = f"{last['exact']:.4g}"
            bar.set_postfix(post)
            bar.n = rec["step"]
            bar.refresh()

        res = fit(train, st, checkpoint=ckpt, resume=args.resume, log=log,
                  progress=progress)
        bar.close()
        log(f"validating in exact mode on {hold_note}, {args.holdout_seeds} held-out seeds")
        mets = validate(train, args.system, res.params, res.default_params, args.objective,
                        holdout=holdout, seeds=args.holdout_seeds)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tuned, default = mets["tuned"]["objective"], mets["default"]["objective"]
    gain = (tuned - default) / abs(default) if default else float("inf")
    bases = ", ".join(f"{b} {m['objective']:.6g}" for b, m in mets["baselines"].items())
    print(f"objective ({args.objective}) on held-out data: tuned {tuned:.6g}, "
          f"default {default:.6g} ({gain:+.2%}); baselines: {bases}")
    print("tuned params: " + ", ".join(f"{k}={v}" for k, v in res.params.items()))
    if tuned < default:
        print(f"not exported: the tuned policy is worse than the default by {-gain:.2%}",
              file=sys.stderr)
        return 3
    sc = build_scenario(train)
    doc = make_policy(
        system=args.system, params=res.params, scenario=train,
        workload={"fingerprint": sc.fingerprint, "summary": sc.summary,
                  "predictions": sc.prediction_source, "holdout": hold_note},
        metrics=mets, objective=args.objective,
        tuner={"settings": st.to_dict(), "estimators": res.estimators,
               "temperature_floor": res.floor, "steps": res.steps,
               "train_objective": parse_objective(args.objective).with_margin(
                   args.margin).describe(),
               "simulated_request_iterations": res.cost, "history": res.history,
               "best_exact_train": res.best_exact, "gain_vs_default": gain},
        seed=seed)
    write_json_atomic(out, doc)
    ckpt.unlink(missing_ok=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
