"""Every committed result is traceable, and the README quotes only traceable figures.

Fast (no simulation): reads ``experiments/results/`` and ``README.md``.

The README rule (:func:`test_readme_figures_name_their_result`): the README is split
into paragraphs and list items (outside code blocks and the generated stale table). A
block that quotes a measured figure, by the patterns in ``MEASURED`` (rates in req/s or
iterations per second, ratios like ``1.28x``, signed percentages, bold outcomes such as
**win** or **stale**, timings "N s on 2 cores"), must name an existing path under
``experiments/results/``; a block naming a result whose status is not ``current`` must
say "stale".
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from experiments import stale
from experiments.main_job import README_ARGS
from tuner.common import provenance as pv

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

MEASURED = [
    r"\d[\d,.]*\s*(req/s|config-iterations/s|config-steps/s|it/s)\b",
    r"\d+\.\d+x\b",
    r"(?<![\w-])[+-]\d+(\.\d+)?%",
    r"\*\*(win|loss|tie|undetermined|supported|contradicted|not met|met|stale)\*\*",
    r"\d+(\.\d+)? (s|min) (on 2 cores|whole process|as a command|wall)",
]
RESULT_PATH = re.compile(r"experiments/results/[\w./*-]+")


def _blocks(text: str) -> list[str]:
    """Paragraphs and list items outside fenced code and the stale table."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(re.escape(stale.BEGIN) + ".*?" + re.escape(stale.END), "", text,
                  flags=re.S)
    out = []
    for para in re.split(r"\n\s*\n", text):
        items = re.split(r"\n(?=- )", para)
        out += [i.strip() for i in items if i.strip()]
    return out


def _paths(block: str) -> list[str]:
    return [m.group(0).rstrip(".,;:)") for m in RESULT_PATH.finditer(block)]


def _exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


@pytest.fixture(scope="module")
def results():
    return stale.scan()


def test_every_result_carries_commit_and_fingerprint(results):
    assert results, "no results found under experiments/results"
    problems = [p for r in results for p in stale._problems(r)]
    assert not problems, problems
    for r in results:
        assert r.commit and re.fullmatch(r"[0-9a-f]{40}", r.commit), r.path
        assert r.sha and re.fullmatch(r"[0-9a-f]{16}", r.sha), r.path


def test_readme_stale_table_is_the_listers(results):
    text = README.read_text(encoding="utf-8")
    i, j = text.index(stale.BEGIN), text.index(stale.END) + len(stale.END)
    assert text[i:j] == stale.readme_block(results), \
        "README's stale table is out of date: python3 -m experiments.stale --write-readme"


def test_readme_speed_table_is_the_generated_one():
    from experiments import speed_table

    text = README.read_text(encoding="utf-8")
    i = text.index(speed_table.BEGIN)
    j = text.index(speed_table.END) + len(speed_table.END)
    assert text[i:j] == speed_table.block(speed_table.rows()), \
        "README's speed table is out of date: python3 -m experiments.speed_table " \
        "--write-readme"


def test_readme_figures_name_their_result(results):
    status = {}
    for r in results:
        status.setdefault(stale._group(r), set()).add(r.status)
    bad = []
    for b in _blocks(README.read_text(encoding="utf-8")):
        paths = _paths(b)
        if any(re.search(p, b) for p in MEASURED) and not paths:
            bad.append(f"figure without a result file: {b[:90]!r}")
        for p in paths:
            if not _exists(p):
                bad.append(f"names a missing result {p}: {b[:60]!r}")
                continue
            rel = Path(p.replace("*", "x")).relative_to("experiments/results")
            top = ROOT / "experiments/results" / rel.parts[0]
            g = (f"experiments/results/{rel.parts[0]}/" if top.is_dir()
                 else f"experiments/results/{rel.stem}.*")
            assert g in status, f"{p} belongs to no listed result ({g})"
            if status[g] - {"current", "historical"} and "stale" not in b.lower():
                bad.append(f"quotes {g} ({status[g]}) without saying stale: {b[:60]!r}")
            if "historical" in status[g] and "historical" not in b.lower():
                bad.append(f"quotes {g} (historical) without saying so: {b[:60]!r}")
    assert not bad, "\n".join(bad)


def test_readme_main_job_is_the_committed_one():
    text = README.read_text(encoding="utf-8")
    cmds = [ln for ln in text.splitlines() if "python3 -m tuner.fit" in ln
            and "pip install -e ." in ln]
    assert len(cmds) == 1, cmds
    fit = shlex.split(cmds[0].split("&&", 1)[1])
    assert fit[:3] == ["python3", "-m", "tuner.fit"]
    args = fit[3:]
    k = args.index("--out")
    assert tuple(args[:k] + args[k + 2:]) == README_ARGS
    res = json.loads((ROOT / "experiments/results/main_job/main_job.json").read_text())
    assert res["readme_command"] == " ".join(fit)
    assert res["exit_code"] == 0 and res["timing"]["wall_s"] > 0
    two = text[text.index("## Two commands"):text.index("## What it optimises")]
    assert "experiments/results/main_job/" in two


def test_fingerprint_covers_hardware_and_models():
    files = pv.source_files()
    for d in ("hardware", "models"):
        every = sorted(str(p.relative_to(ROOT)) for p in (ROOT / d).rglob("*.py")
                       if "__pycache__" not in p.parts)
        assert every and set(every) <= set(files), d
    import tuner.fit  # noqa: F401  (a loaded tuner module is covered)

    assert "tuner/fit.py" in pv.source_files()


def test_changed_names_the_edited_file(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    (tmp_path / "hardware").mkdir()
    (tmp_path / "models" / "a.py").write_text("x = 1\n")
    (tmp_path / "hardware" / "b.py").write_text("y = 2\n")
    monkeypatch.setattr(pv, "ROOT", tmp_path)
    prov = {"commit": "0" * 40, "sources": pv.fingerprint(pv.source_files())}
    assert set(prov["sources"]["files"]) == {"models/a.py", "hardware/b.py"}
    assert pv.changed(prov) == []
    (tmp_path / "models" / "a.py").write_text("x = 3\n")
    assert pv.changed(prov) == ["models/a.py"]
    (tmp_path / "models" / "c.py").write_text("z = 0\n")
    assert "models/c.py (added)" in pv.changed(prov)
    (tmp_path / "hardware" / "b.py").unlink()
    assert "hardware/b.py (removed)" in pv.changed(prov)


def test_scan_classifies(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(pv, "ROOT", tmp_path)
    monkeypatch.setattr(stale, "ROOT", tmp_path)
    res = tmp_path / "experiments" / "results"
    (res / "good").mkdir(parents=True)
    prov = {"commit": "1" * 40, "command": "c", "created": "t",
            "sources": pv.fingerprint(pv.source_files())}
    (res / "good" / "r.json").write_text(json.dumps({"provenance": prov}))
    (res / "good" / "r.md").write_text("text\n\n" + pv.stamp_text(prov) + "\n")
    (res / "bad").mkdir()
    (res / "bad" / "r.json").write_text(json.dumps({"x": 1}))
    (res / "bad" / "pasted.log").write_text("a transcript\n")
    got = {r.path: r for r in stale.scan(res)}
    assert got["experiments/results/good/r.json"].status == "current"
    assert got["experiments/results/good/r.json"].companions == {
        "experiments/results/good/r.md": "ok"}
    assert got["experiments/results/bad/r.json"].status == "no provenance"
    assert "does not carry" in got["experiments/results/bad/r.json"].companions[
        "experiments/results/bad/pasted.log"]
    (tmp_path / "models" / "a.py").write_text("x = 2\n")
    again = {r.path: r for r in stale.scan(res)}
    assert again["experiments/results/good/r.json"].status == "stale"
    assert again["experiments/results/good/r.json"].changed == ["models/a.py"]
    # a folder kept as the "before" of a before/after pair: historical, not stale, and
    # the README block says why; only while its sources have changed
    monkeypatch.setitem(stale.HISTORICAL, "experiments/results/good/", "the before")
    kept = {r.path: r for r in stale.scan(res)}
    assert kept["experiments/results/good/r.json"].status == "historical"
    assert "| `experiments/results/good/` | historical (commit 1111111): the before |" \
        in stale.readme_block(list(kept.values()))
    (tmp_path / "models" / "a.py").write_text("x = 1\n")
    assert {r.path: r for r in stale.scan(res)}[
        "experiments/results/good/r.json"].status == "current"
