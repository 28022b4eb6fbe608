"""Plain JSON values and atomic file writes: the one implementation of both.

:func:`plain` turns NumPy/JAX scalars and arrays, tuples and dicts into plain JSON
values (non-finite floats become ``None``). Every writer goes through a temporary file
in the destination folder, flushed and fsynced, then ``os.replace`` onto the target: a
reader sees either the old file or the complete new one, never a partial write, and a
failed write leaves no temporary behind.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from pathlib import Path

__all__ = ["plain", "savefig_atomic", "unwritable_reason", "write_bytes_atomic", "write_json_atomic",
           "write_text_atomic"]


def plain(x):
    """``x`` as plain JSON values: dicts (keys as ``str``), lists (from lists and
    tuples), and scalars; NumPy/JAX scalars and arrays unwrapped via ``tolist()``;
    NaN and +-inf become ``None``. Other values are returned unchanged."""
    if isinstance(x, dict):
        return {k if isinstance(k, str) else str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, float):  # also np.float64, a float subclass
        return float(x) if math.isfinite(x) else None
    if isinstance(x, (str, bytes, int)) or x is None:
        return x
    if hasattr(x, "tolist"):  # NumPy arrays and scalars, JAX arrays
        return plain(x.tolist())
    return x


def write_bytes_atomic(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` (parents created) so readers see the old file or the
    whole new one. The file gets the mode ``open()`` would give it (0o666 less the
    umask), not ``mkstemp``'s 0o600."""
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


def write_text_atomic(path, text: str) -> Path:
    """UTF-8 text written atomically."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path, doc, *, sort_keys: bool = True,
                      indent: int | None = 2) -> Path:
    """JSON (one trailing newline) written atomically. Strict: NaN/inf and values JSON
    cannot encode raise ``ValueError``/``TypeError`` before anything is written; pass
    ``plain(doc)`` to map NumPy values to plain ones and non-finite floats to null."""
    text = json.dumps(doc, indent=indent, sort_keys=sort_keys, allow_nan=False) + "\n"
    return write_text_atomic(path, text)


def savefig_atomic(fig, path, **kw) -> Path:
    """Render a matplotlib figure to bytes (format from the suffix, else PNG; ``kw`` go
    to ``fig.savefig``) and write them atomically."""
    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, **{"format": path.suffix.lstrip(".") or "png", **kw})
    return write_bytes_atomic(path, buf.getvalue())


def unwritable_reason(d) -> str | None:
    """None when folder ``d`` is (or can be made) writable; else why not. Leaves
    nothing behind: the nearest existing ancestor must be a folder where a file can be
    created (check an output folder before long work starts). Permission bits are not
    enough: root passes ``os.access`` on the folders of pseudo-filesystems such as
    ``/proc`` (a read-only mount answers EROFS, for root too), so a temporary file is
    created there and removed."""
    import os
    from pathlib import Path

    d = Path(d)
    if d.exists():
        if not d.is_dir():
            return "exists and is not a directory"
        return _probe(d, "is not writable")
    p = d.parent
    while not p.exists():
        p = p.parent
    if not p.is_dir():
        return f"{p} is not a directory"
    return _probe(p, f"cannot be created ({p} is not writable)")


def _probe(folder: Path, why: str) -> str | None:
    """None when a file can be created in ``folder`` (one is, then removed), else
    ``why`` with the system's reason."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return why
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".probe."):
            pass
    except OSError as e:
        return f"{why}: creating a file there fails ({e.strerror or e})"
    return None
