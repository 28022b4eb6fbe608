"""Where a result came from: the command that made it, the commit, and a fingerprint of
every source file it was computed by.

A fingerprint covers every file of ``hardware/`` and ``models/`` (the simulators and the
numbers they use) plus every module of ``tuner/`` and ``experiments/`` loaded in the
process when the result is written (what the script actually ran), and the default
workload tables under ``tuner/workloads/data``. It stores one sha256 per file, so
:func:`changed` can say which files no longer match (``python -m experiments.stale``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "source_files", "fingerprint", "git_commit", "provenance", "changed",
           "stamp_text"]

ROOT = Path(__file__).resolve().parents[2]
_ALWAYS = ("hardware", "models", "tuner/workloads/data")
_LOADED = ("tuner", "experiments")
_SKIP_PARTS = {"__pycache__"}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def source_files(extra: tuple[str, ...] = ()) -> list[str]:
    """Repository-relative paths of the sources a result in this process depends on."""
    files: set[Path] = set()
    for d in _ALWAYS:
        base = ROOT / d
        if base.is_dir():
            files.update(p for p in base.rglob("*")
                         if p.is_file() and not _SKIP_PARTS & set(p.parts)
                         and p.suffix not in (".pyc",))
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f:
            continue
        p = Path(f).resolve()
        try:
            rel = p.relative_to(ROOT)
        except ValueError:
            continue
        if rel.parts and rel.parts[0] in _LOADED and p.suffix == ".py" and p.is_file():
            files.add(p)
    for e in extra:
        p = (ROOT / e).resolve()
        if p.is_file():
            files.add(p)
    return sorted(str(p.relative_to(ROOT)) for p in files)


def fingerprint(files: list[str]) -> dict:
    """``{"sha256": total, "files": {path: sha256}}`` (16 hex digits each)."""
    per = {f: _digest((ROOT / f).read_bytes()) for f in files}
    total = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in sorted(per.items())).encode())
    return {"sha256": total.hexdigest()[:16], "files": per}


def git_commit() -> dict:
    """The checkout's HEAD and whether its tracked sources differ from it (a result made
    before its commit has ``dirty`` true: the fingerprint, not the commit, identifies the
    sources then)."""
    def run(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True, timeout=30)
    try:
        head = run("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        st = run("status", "--porcelain", "--", "hardware",
                 "models", "tuner", "experiments/*.py")
        return {"commit": head.stdout.strip(), "dirty": bool(st.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def provenance(command: list[str] | None = None, extra: tuple[str, ...] = ()) -> dict:
    """The provenance record a result carries under the key ``"provenance"``."""
    if command is None:
        command = [Path(sys.executable).name, *sys.argv]
        if sys.argv and sys.argv[0].endswith(".py"):
            mod = _module_of(sys.argv[0])
            if mod:
                command = ["python3", "-m", mod, *sys.argv[1:]]
    return {"command": " ".join(str(c) for c in command), **git_commit(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "sources": fingerprint(source_files(extra))}


def _module_of(path: str) -> str | None:
    try:
        rel = Path(path).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return ".".join(rel.with_suffix("").parts)


def changed(prov: dict) -> list[str]:
    """Source files whose content differs from the fingerprint (missing files too);
    empty when the result still belongs to these sources. Files added since (a new
    module of ``hardware/`` or ``models/``) count as changed."""
    files = (prov.get("sources") or {}).get("files") or {}
    out = []
    for f, h in sorted(files.items()):
        p = ROOT / f
        if not p.is_file():
            out.append(f"{f} (removed)")
        elif _digest(p.read_bytes()) != h:
            out.append(f)
    for d in _ALWAYS:
        base = ROOT / d
        if base.is_dir():
            for p in sorted(base.rglob("*")):
                if p.is_file() and not _SKIP_PARTS & set(p.parts) and p.suffix != ".pyc":
                    rel = str(p.relative_to(ROOT))
                    if rel not in files:
                        out.append(f"{rel} (added)")
    return out


def stamp_text(prov: dict) -> str:
    """One line for a markdown or log file: the command, commit and fingerprint."""
    commit = prov.get("commit") or "unknown"
    dirty = " + uncommitted changes" if prov.get("dirty") else ""
    return (f"Made by `{prov['command']}` at commit {commit[:12]}{dirty}, sources "
            f"{prov['sources']['sha256']} ({len(prov['sources']['files'])} files), "
            f"{prov['created']}.")
