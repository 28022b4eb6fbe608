"""The version of a simulator family an experiment's results belong to."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["source_fingerprint"]


def source_fingerprint(package: str, doc: str) -> dict:
    """sha256 (16 hex digits) of ``models/<package>/*.py`` and ``docs/<doc>``, with the
    files hashed (others edit them: a run's results belong to this version)."""
    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "models" / package).glob("*.py")) + [root / "docs" / doc]
    h = hashlib.sha256()
    for f in files:
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return {"files": [str(f.relative_to(root)) for f in files],
            "sha256": h.hexdigest()[:16]}
