"""The ``--out`` argument of an experiment that takes nothing else, checked before any
work starts (one ``error:`` line and exit 2 when the folder cannot be written)."""

from __future__ import annotations

__all__ = ["out_folder"]


def out_folder(prog: str, doc: str, argv=None):
    """The ``--out`` result folder of an experiment that takes only that argument,
    checked before any work: None (after one ``error:`` line) when it cannot be
    written."""
    import argparse
    import sys
    from pathlib import Path

    from tuner.common.atomic import unwritable_reason

    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="result folder")
    out = ap.parse_args(argv).out
    why = unwritable_reason(out)
    if why:
        print(f"error: --out {out}: {why}", file=sys.stderr)
        return None
    return out
