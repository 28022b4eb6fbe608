"""Atomic file writes shared by the experiment scripts.

Every writer goes through a temporary file in the destination folder, flushed and
fsynced, then ``os.replace`` onto the target: a reader sees either the old file or the
complete new one, never a partial write, and a failed write leaves no temporary behind.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from tuner.atomic import write_bytes_atomic as _write_bytes

__all__ = ["jsonable", "savefig_atomic", "write_bytes_atomic", "write_json_atomic",
           "write_text_atomic"]


def _umask_mode() -> int:
    """0o666 less the process umask: the mode ``open()`` would give a new file
    (``mkstemp`` creates 0o600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_bytes_atomic(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` (parents created) via a temporary file and a rename."""
    return _write_bytes(path, data)


def write_text_atomic(path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def jsonable(x):
    """Plain JSON values: NumPy scalars/arrays unwrapped, non-finite floats -> None."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # NumPy / JAX values
        return jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json_atomic(path, obj, *, indent: int = 2) -> Path:
    text = json.dumps(jsonable(obj), indent=indent, sort_keys=False, allow_nan=False)
    return write_text_atomic(path, text + "\n")


def savefig_atomic(fig, path, **kw) -> Path:
    """``fig.savefig`` into a temporary file beside ``path``, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                               suffix=path.suffix or ".png")
    os.close(fd)
    try:
        os.chmod(tmp, _umask_mode())
        fig.savefig(tmp, format=(path.suffix.lstrip(".") or "png"), **kw)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
