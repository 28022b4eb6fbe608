"""Which options a command line gave explicitly (argparse keeps only the values), so an
entry point can refuse a flag that its other arguments make it ignore."""

from __future__ import annotations

import argparse

__all__ = ["given_dests"]


def given_dests(parser: argparse.ArgumentParser, argv) -> dict[str, str]:
    """``{dest: option as typed in full}`` for every option in ``argv``, abbreviations
    resolved as argparse resolves them (a unique prefix of one option string) and
    ``--opt=value`` included."""
    by_opt = {o: a.dest for a in parser._actions for o in a.option_strings}
    out: dict[str, str] = {}
    for tok in argv:
        if not tok.startswith("--") or tok == "--":
            continue
        name = tok.split("=", 1)[0]
        hits = [name] if name in by_opt else [o for o in by_opt if o.startswith(name)]
        if len(hits) == 1:
            out[by_opt[hits[0]]] = hits[0]
    return out
