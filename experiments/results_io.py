"""Stamping an experiment's results with where they came from.

Every result an experiment writes carries the provenance record of
:func:`tuner.common.provenance.provenance` (command, commit, source fingerprint): the JSON at
its top level under ``"provenance"``, the markdown as its last line, a PNG in its text
metadata. ``python -m experiments.stale`` reads them back.
"""

from __future__ import annotations

from tuner.common.provenance import provenance, stamp_text

__all__ = ["stamped", "stamp_markdown", "png_metadata", "provenance", "stamp_text"]


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
