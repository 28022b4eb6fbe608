"""Write the measurement kit's dataset files beside an exported policy:
``python -m tuner.bench_dataset POLICY.json [--format F ...]`` (it rebuilds the policy's
scenario, so it needs the trace). The formats, what each file holds and the
``vllm bench serve`` command that reads it: :mod:`tuner.export.bench_dataset`.
"""

from __future__ import annotations

import argparse
import sys

from tuner.export.bench_dataset import FORMATS

__all__ = ["main"]


def main(argv=None) -> int:
    """``python -m tuner.bench_dataset POLICY.json``: write the measurement kit's dataset
    files beside an exported policy (rebuilding its scenario, so it needs the trace)."""
    ap = argparse.ArgumentParser(prog="python -m tuner.bench_dataset",
                                 description=main.__doc__)
    ap.add_argument("policy", help="exported policy JSON (python -m tuner.fit)")
    ap.add_argument("--format", action="append", choices=list(FORMATS), default=None,
                    help="dataset format(s) to write (default: all)")
    args = ap.parse_args(argv)
    try:
        from tuner.export.deployment import write_measure_kit
        from tuner.export.policy import load_policy
        from tuner.scenario import ScenarioSpec, build_scenario

        doc = load_policy(args.policy)
        sc = build_scenario(ScenarioSpec.from_dict(doc["scenario"]))
        paths = write_measure_kit(sc, args.policy, formats=args.format or tuple(FORMATS))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in paths.values():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
