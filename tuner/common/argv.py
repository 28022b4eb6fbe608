"""Which options a command line gave explicitly (argparse keeps only the values), so an
entry point can refuse a flag that its other arguments make it ignore."""

from __future__ import annotations

import argparse
import sys

__all__ = ["given_dests", "relaxed_temperature"]

DEFAULT_TEMPERATURE = 0.05  # --mode relaxed without --temperature


def given_dests(parser: argparse.ArgumentParser, argv=None) -> dict[str, str]:
    """``{dest: option as typed in full}`` for every option in ``argv`` (None: the
    process's arguments, as ``parse_args`` reads them), abbreviations resolved as
    argparse resolves them (a unique prefix of one option string) and ``--opt=value``
    included."""
    argv = sys.argv[1:] if argv is None else argv
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


def relaxed_temperature(mode: str, temperature: float | None) -> float:
    """The run's temperature from ``--mode`` and ``--temperature`` (None when not
    given): 0 for an exact run, where a given temperature is an error rather than
    dropped; :data:`DEFAULT_TEMPERATURE` or the one given (> 0) for a relaxed one."""
    if mode != "relaxed":
        if temperature is not None:
            raise ValueError(f"--temperature {temperature:g}: read with --mode relaxed "
                             "only (an exact run has no temperature)")
        return 0.0
    temp = DEFAULT_TEMPERATURE if temperature is None else temperature
    if not temp > 0:
        raise ValueError("--temperature must be > 0 in relaxed mode")
    return temp
