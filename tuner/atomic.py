"""Atomic file writes: a temporary file in the target folder, fsync, then rename."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

__all__ = ["write_bytes_atomic", "write_json_atomic"]


def write_bytes_atomic(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are not secrets
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path, doc) -> Path:
    """Indented, key-sorted JSON (NaN refused) written atomically."""
    text = json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"
    return write_bytes_atomic(path, text.encode("utf-8"))
