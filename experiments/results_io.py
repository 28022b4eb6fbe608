"""Stamping an experiment's results with where they came from.

Every result an experiment writes carries the provenance record of
:func:`tuner.common.provenance.provenance` (command, commit, source fingerprint): the JSON at
its top level under ``"provenance"``, the markdown as its last line, a PNG in its text
metadata. ``python -m experiments.stale`` reads them back.
"""

from __future__ import annotations

import math

from pathlib import Path
from typing import Callable

from tuner.common.atomic import write_json_atomic, write_text_atomic
from tuner.common.provenance import provenance, stamp_text

__all__ = ["pick_cases", "positive_floats", "positive_ints", "stamped", "stamp_markdown", "png_metadata",
           "provenance", "stamp_text", "write_result"]


def stamped(doc: dict, prov: dict | None = None) -> dict:
    """``doc`` with ``"provenance"`` first (computed now unless given)."""
    prov = prov if prov is not None else provenance()
    return {"provenance": prov, **{k: v for k, v in doc.items() if k != "provenance"}}


def stamp_markdown(md: str, prov: dict) -> str:
    """The markdown with its provenance line as the last paragraph."""
    return md.rstrip("\n") + "\n\n" + stamp_text(prov) + "\n"


def png_metadata(prov: dict) -> dict:
    """``fig.savefig(..., metadata=png_metadata(prov))``: the same line in the PNG."""
    return {"Description": stamp_text(prov), "Source": prov["sources"]["sha256"]}


def write_result(out: Path, stem: str, res: dict, render: Callable[[dict], str]) -> dict:
    """Write ``out/stem.json`` (``res`` stamped with its provenance) and ``out/stem.md``
    (``render(res)`` with the same provenance line), each atomically; the stamped
    document."""
    doc = stamped(res)
    write_json_atomic(Path(out) / f"{stem}.json", doc, sort_keys=False)
    write_text_atomic(Path(out) / f"{stem}.md",
                      stamp_markdown(render(res), doc["provenance"]))
    return doc


def pick_cases(text: str, known) -> list[str]:
    """The case names of a ``--cases`` list (comma-separated), each one of ``known``;
    ValueError naming the unknown ones (or an empty list) and the known names."""
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad or not names:
        raise ValueError(f"--cases: unknown {bad or 'empty'}; cases: {', '.join(known)}")
    return names


def positive_floats(flag: str, text: str) -> tuple[float, ...]:
    """A comma-separated list of finite numbers > 0 given to ``flag``; ValueError
    naming the flag otherwise."""
    try:
        v = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        v = ()
    if not v or not all(math.isfinite(x) and x > 0 for x in v):
        raise ValueError(f"{flag} {text!r}: a comma-separated list of finite numbers > 0")
    return v


def positive_ints(flag: str, text: str) -> list[int]:
    """A comma-separated list of integers >= 1 given to ``flag``; ValueError naming the
    flag otherwise."""
    try:
        v = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: not a comma-separated list of integers") \
            from None
    if not v or min(v) < 1:
        raise ValueError(f"{flag} {text!r}: needs integers >= 1")
    return v
