"""Which committed results still belong to the sources: ``python -m experiments.stale``.

Every JSON under ``experiments/results/`` is a result and must carry a ``"provenance"``
record (:mod:`tuner.common.provenance`: command, commit, a sha256 per source file). Every other
file there (markdown, PNG, log, JSONL) belongs to the JSON of the same stem in its
folder, else to the folder's results, and must carry the fingerprint of one of them (the
markdown's and log's provenance line, the PNG's text metadata). A result is

- ``current``: every source file it records is unchanged (and none was added to
  ``hardware/``, ``models/`` or the default workload tables);
- ``stale``: some changed; the files are listed;
- ``unverified``: its provenance was reconstructed from git history (results made
  before results carried their own), so it cannot be shown current;
- ``historical``: stale, and kept on purpose as the "before" of a before/after pair
  (:data:`HISTORICAL` names each such folder and why): it belongs to the sources of the
  commit that made it and cannot be made again at a later one;
- ``no provenance``: a defect (exit 1 with ``--strict``).

``--readme`` prints the block the README quotes between ``<!-- stale -->`` and
``<!-- /stale -->``; ``--write-readme`` puts it there (``tests/test_results.py`` checks
that the README's block is the one this command prints). ``--reconstruct FILE ...``
stamps legacy JSON results from git history (see :func:`reconstruct`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tuner.common.atomic import write_json_atomic, write_text_atomic
from tuner.common.provenance import ROOT, changed

__all__ = ["RESULTS", "Result", "scan", "readme_block", "reconstruct", "main"]

RESULTS = ROOT / "experiments" / "results"
COMPANIONS = (".md", ".png", ".log", ".jsonl", ".txt", ".csv")
BEGIN, END = "<!-- stale -->", "<!-- /stale -->"
# result folders kept as the state before a change (stale by construction), and why
HISTORICAL = {
    "experiments/results/profile_gpu_before/":
        "the GPU profile of Token-PD and KunServe before their steps were rewritten "
        "(issue 30), kept beside profile_gpu_after/",
}


@dataclass
class Result:
    path: str                      # repository-relative
    status: str                    # current | stale | historical | unverified | no provenance
    commit: str | None = None
    sha: str | None = None
    command: str | None = None
    changed: list = field(default_factory=list)
    companions: dict = field(default_factory=dict)  # path -> "ok" | problem


def _load(p: Path):
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _status(prov) -> tuple[str, list]:
    if not isinstance(prov, dict) or not (prov.get("sources") or {}).get("sha256") \
            or "commit" not in prov:
        return "no provenance", []
    if prov.get("reconstructed"):
        return "unverified", changed(prov)
    ch = changed(prov)
    return ("stale" if ch else "current"), ch


def scan(root: Path = RESULTS) -> list[Result]:
    """Every result under ``root`` with its status and its companions' status."""
    results: dict[Path, Result] = {}
    for p in sorted(root.rglob("*.json")):
        doc = _load(p)
        prov = doc.get("provenance") if isinstance(doc, dict) else None
        st, ch = _status(prov)
        if st == "stale" and _group_of(str(p.relative_to(ROOT))) in HISTORICAL:
            st = "historical"
        results[p] = Result(str(p.relative_to(ROOT)), st, changed=ch,
                            commit=(prov or {}).get("commit") if st != "no provenance"
                            else None,
                            sha=((prov or {}).get("sources") or {}).get("sha256"),
                            command=(prov or {}).get("command"))
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.suffix == ".json" or p.name.startswith(".") \
                or "__pycache__" in p.parts:
            continue
        owners = [r for q, r in results.items() if q.parent == p.parent
                  and q.stem == p.stem] or \
                 [r for q, r in results.items() if q.parent == p.parent]
        rel = str(p.relative_to(ROOT))
        if not owners:
            orphan = Result(rel, "no provenance")
            orphan.companions[rel] = "no JSON result beside it"
            results[p] = orphan
            continue
        data = p.read_bytes()
        ok = any(r.sha and r.sha.encode() in data for r in owners)
        owners[0].companions[rel] = "ok" if ok else \
            "does not carry its result's fingerprint"
    return sorted(results.values(), key=lambda r: r.path)


def _problems(r: Result) -> list[str]:
    out = [] if r.status != "no provenance" else [f"{r.path}: no provenance record"]
    out += [f"{c}: {why}" for c, why in r.companions.items() if why != "ok"]
    return out


def _group(r: Result) -> str:
    """The folder a result lives in (a top-level file: its own stem)."""
    return _group_of(r.path)


def _group_of(path: str) -> str:
    rel = Path(path).relative_to("experiments/results")
    return (f"experiments/results/{rel.parts[0]}/" if len(rel.parts) > 1
            else f"experiments/results/{rel.stem}.*")


def readme_block(results: list[Result]) -> str:
    """The README's statement of what is stale, one line per result folder."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(_group(r), []).append(r)
    order = {"no provenance": 0, "stale": 1, "unverified": 2, "historical": 3,
             "current": 4}
    lines = [BEGIN, "", "| results | status |", "|---|---|"]
    for g, rs in sorted(groups.items()):
        worst = min((r.status for r in rs), key=order.get)
        commit = next((r.commit for r in rs if r.commit), None)
        at = f"commit {commit[:7]}" if commit else "an unknown commit"
        if worst == "stale":
            why = (f"stale: sources changed since it was made ({at}; "
                   "`python3 -m experiments.stale` lists the files)")
        elif worst == "unverified":
            why = ("stale (unverified): made before results carried provenance; "
                   f"{at} from git history")
        elif worst == "historical":
            why = f"historical ({at}): {HISTORICAL[g]}"
        elif worst == "current":
            why = "current"
        else:
            why = "NO PROVENANCE"
        lines.append(f"| `{g}` | {why} |")
    lines += ["", "(written by `python3 -m experiments.stale --write-readme`)", "", END]
    return "\n".join(lines)


def _readme_path() -> Path:
    return ROOT / "README.md"


def write_readme(block: str, begin: str = BEGIN, end: str = END) -> bool:
    """Replace the README's ``begin ... end`` block (markers included) with ``block``;
    whether the file changed."""
    p = _readme_path()
    text = p.read_text(encoding="utf-8")
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"error: {p}: no {begin} ... {end} block")
    new = text[:i] + block + text[j + len(end):]
    if new != text:
        write_text_atomic(p, new)
    return new != text


# ----------------------------------------------------------------- legacy results
def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                          timeout=60)


def reconstruct(path: Path, script: str | None = None) -> dict:
    """A provenance record for a result written before results carried one: the commit
    that last wrote the file, and the sha256 of every file of ``hardware/``,
    ``models/``, ``tuner/`` and the experiment ``script`` as they were at that commit.
    The run may have used older sources than that commit, so the record says
    ``reconstructed`` and :func:`scan` never reports it current."""
    import hashlib

    from tuner.common.provenance import _digest  # the same per-file hash

    rel = str(Path(path).resolve().relative_to(ROOT))
    c = _git("log", "-1", "--format=%H", "--", rel).stdout.decode().strip()
    if not c:
        raise SystemExit(f"error: {rel}: not in git history")
    names = _git("ls-tree", "-r", "--name-only", c, "--", "hardware", "models",
                 "tuner").stdout.decode().split()
    if script:
        names.append(script)
    per = {}
    for n in sorted(set(names)):
        if n.endswith(".pyc") or "__pycache__" in n:
            continue
        blob = _git("show", f"{c}:{n}")
        if blob.returncode == 0:
            per[n] = _digest(blob.stdout)
    total = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in sorted(per.items()))
                           .encode()).hexdigest()[:16]
    return {"command": None, "commit": c, "dirty": None, "created": None,
            "reconstructed": ("made before results carried provenance: commit = the "
                              "last commit that wrote this file, sources = every file "
                              "of hardware/, models/, tuner/ (and the script) at that "
                              "commit; the run may predate them"),
            "sources": {"sha256": total, "files": per}}


def _stamp_legacy(path: Path, script: str | None) -> None:
    from tuner.common.provenance import stamp_text

    doc = _load(path)
    if not isinstance(doc, dict):
        raise SystemExit(f"error: {path}: not a JSON object")
    if "provenance" in doc:
        prov = doc["provenance"]
    else:
        prov = reconstruct(path, script)
        doc.pop("simulator_source", None)  # the old family-folder hash it replaces
        write_json_atomic(path, {"provenance": prov, **doc}, sort_keys=False, indent=2)
    line = stamp_text({**prov, "command": "unknown (reconstructed)",
                       "created": "date unknown"})
    for comp in path.parent.iterdir():
        if comp.suffix == ".md" and (comp.stem == path.stem or not any(
                q.stem == comp.stem for q in path.parent.glob("*.json"))):
            text = comp.read_text(encoding="utf-8")
            if prov["sources"]["sha256"] not in text:
                write_text_atomic(comp, text.rstrip("\n") + "\n\n" + line + "\n")
        elif comp.suffix == ".png" and (comp.stem == path.stem or not any(
                q.stem == comp.stem for q in path.parent.glob("*.json"))):
            from PIL import Image
            from PIL.PngImagePlugin import PngInfo

            img = Image.open(comp)
            info = PngInfo()
            for k, v in (img.text or {}).items():
                info.add_text(k, v)
            info.add_text("Description", line)
            info.add_text("Source", prov["sources"]["sha256"])
            tmp = comp.with_name("." + comp.name + ".tmp")
            img.save(tmp, format="PNG", pnginfo=info)
            tmp.replace(comp)


# ----------------------------------------------------------------------- command
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.stale",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="machine-readable listing")
    ap.add_argument("--readme", action="store_true", help="print the README block")
    ap.add_argument("--write-readme", action="store_true",
                    help="replace the README's block with the current one")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when any result lacks provenance")
    ap.add_argument("--reconstruct", nargs="+", metavar="FILE",
                    help="stamp legacy JSON results from git history")
    ap.add_argument("--script", help="with --reconstruct: the experiment script")
    args = ap.parse_args(argv)
    if args.reconstruct:
        for f in args.reconstruct:
            p = Path(f)
            if not p.is_file():
                print(f"error: {f}: no such file", file=sys.stderr)
                return 2
        for f in args.reconstruct:
            _stamp_legacy(Path(f).resolve(), args.script)
        return 0
    res = scan()
    if args.json:
        print(json.dumps([r.__dict__ for r in res], indent=1))
    elif args.readme or args.write_readme:
        block = readme_block(res)
        if args.write_readme:
            print("README updated" if write_readme(block) else "README already current")
        else:
            print(block)
    else:
        for r in res:
            extra = f" ({len(r.changed)} changed: {', '.join(r.changed[:3])})" \
                if r.changed and r.status == "stale" else ""
            print(f"{r.status:14s} {r.path}{extra}")
            for c, why in r.companions.items():
                if why != "ok":
                    print(f"{'':14s}   {c}: {why}")
    problems = [p for r in res for p in _problems(r)]
    if problems and not args.json:
        print(f"{len(problems)} problem(s): " + "; ".join(problems[:5]), file=sys.stderr)
    return 1 if (args.strict and problems) else 0


if __name__ == "__main__":
    sys.exit(main())
