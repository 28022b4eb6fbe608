"""Package layering, read from the source with ``ast`` (nothing is imported).

Imports run one way: ``hardware`` <- ``models`` <- ``tuner`` <- ``experiments``.
Inside ``models``, every family sub-package (a folder ``models/<name>/`` with an
``__init__.py``) is a plug-in: it may use the core (the modules directly in ``models/``)
but no other family, and the core uses no family except at the registration point
(``models/__init__.py``, ``models/systems.py``). Every import counts: ``import x``,
``from x import y``, relative imports, imports inside functions, and
``importlib.import_module("x")`` / ``__import__("x")`` with a literal name.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hardware", "models", "tuner", "experiments")
FORBIDDEN = {  # package -> packages it must not import (the layers above it)
    "hardware": ("models", "tuner", "experiments"),
    "models": ("tuner", "experiments"),
    "tuner": ("experiments",),
    "experiments": (),
}
REGISTRATION = ("models/__init__.py", "models/systems.py")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package in this repository."""
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _literal_import(node: ast.Call) -> str | None:
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    if name in ("import_module", "__import__") and node.args \
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value if not node.args[0].value.startswith(".") else None
    return None


def imports(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module)`` for every import in ``path``. ``from p import n``
    yields ``p.n`` when that is a module of this repository, else ``p``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 > len(parts) - 1:
                    found.append((node.lineno, "<relative import beyond the top package>"))
                    continue
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.append((node.lineno, sub if a.name != "*" and _is_module(sub)
                              else mod))
        elif isinstance(node, ast.Call):
            mod = _literal_import(node)
            if mod:
                found.append((node.lineno, mod))
    return sorted(set(found))


def _sources(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py")
                  if "__pycache__" not in p.parts)


def _within(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


def _report(bad: list[str], rule: str) -> str:
    return f"{rule}; offending imports (file:line -> module):\n  " + "\n  ".join(bad)


def families() -> list[str]:
    """The family sub-packages of ``models``: folders with an ``__init__.py``."""
    return sorted(p.parent.name for p in (ROOT / "models").glob("*/__init__.py"))


def _family_of(mod: str, fams: list[str]) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "models" and parts[1] in fams \
        else None


def test_every_package_is_parsed():
    for package in PACKAGES:
        assert (ROOT / package / "__init__.py").is_file(), package
        assert _sources(package), package


def test_imports_run_one_way():
    bad = []
    for package, above in FORBIDDEN.items():
        for path in _sources(package):
            for line, mod in imports(path):
                if any(_within(mod, up) for up in above) or mod.startswith("<"):
                    bad.append(f"{path.relative_to(ROOT)}:{line} -> {mod}")
    assert not bad, _report(bad, "imports must run hardware <- models <- tuner <- "
                                 "experiments")


def test_model_families_are_plug_ins():
    fams = families()
    bad = []
    for path in _sources("models"):
        rel = path.relative_to(ROOT).as_posix()
        own = _family_of(_module_name(path), fams)  # None: a core module
        for line, mod in imports(path):
            other = _family_of(mod, fams)
            if other is None or other == own:
                continue
            if own is not None:
                bad.append(f"{rel}:{line} -> {mod} (family {own!r} imports family "
                           f"{other!r})")
            elif rel not in REGISTRATION:
                bad.append(f"{rel}:{line} -> {mod} (core module imports family "
                           f"{other!r}; only {', '.join(REGISTRATION)} may)")
    assert not bad, _report(bad, "model families must not import each other, and the "
                                 "models core imports a family only at registration")


def test_the_checker_sees_every_import_form(tmp_path, monkeypatch):
    """The rules above are only as good as :func:`imports`: check it on a fake tree."""
    fam = tmp_path / "models" / "fam_a"
    fam.mkdir(parents=True)
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "core.py").write_text("")
    (tmp_path / "models" / "fam_b").mkdir()
    (tmp_path / "models" / "fam_b" / "__init__.py").write_text("")
    (fam / "__init__.py").write_text("from . import step\n")
    (fam / "step.py").write_text(
        "import hardware.llm as llm\n"
        "from ..core import thing\n"
        "from .. import fam_b\n"
        "from models.fam_b import x\n"
        "def f():\n"
        "    from tuner.scenario import S\n"
        "    import importlib\n"
        "    return importlib.import_module('experiments.bench_sim')\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert imports(fam / "__init__.py") == [(1, "models.fam_a.step")]
    assert imports(fam / "step.py") == [
        (1, "hardware.llm"), (2, "models.core"), (3, "models.fam_b"), (4, "models.fam_b"),
        (6, "tuner.scenario"), (7, "importlib"), (8, "experiments.bench_sim")]
    assert families() == ["fam_a", "fam_b"]


# --- no import circles; the tuner's own layers -------------------------------------

# tuner's library folders and their rank: a folder imports only folders of lower rank
# (and itself); equal ranks are independent of each other
TUNER_LAYERS = {"common": 0, "workloads": 1, "scenario": 2, "objective": 3,
                "calibration": 3, "search": 4, "export": 4}
TUNER_CLI = "tuner.cli"  # the flags the entry points share; imported only by them


def import_graph(packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the repository modules it imports (every form, see :func:`imports`)."""
    paths = [p for package in packages for p in _sources(package)]
    nodes = {_module_name(p) for p in paths}
    graph = {}
    for p in paths:
        graph[_module_name(p)] = {m for _, m in imports(p) if m in nodes}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as ``[a, b, ..., a]``, or None."""
    import graphlib

    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def test_no_import_circles():
    cycle = find_cycle(import_graph())
    assert cycle is None, ("import circle (each imports the next, counting imports "
                           "inside functions): " + " -> ".join(cycle or []))


def _tuner_place(mod: str) -> tuple[str, str | None]:
    """('package' | 'layer' | 'cli' | 'entry', folder) of a tuner module."""
    parts = mod.split(".")
    if mod == "tuner":
        return "package", None
    if mod == TUNER_CLI:
        return "cli", None
    if len(parts) == 2 and not (ROOT / "tuner" / parts[1] / "__init__.py").is_file():
        return "entry", None
    return "layer", parts[1]


def tuner_layer_violations() -> list[str]:
    bad = []
    for path in _sources("tuner"):
        me = _module_name(path)
        kind, folder = _tuner_place(me)
        rel = path.relative_to(ROOT).as_posix()
        for line, mod in imports(path):
            if not _within(mod, "tuner") or mod == me:
                continue
            okind, ofolder = _tuner_place(mod)
            why = None
            if kind == "package":
                why = "the package's __init__ imports nothing of the tuner (lazy)"
            elif okind == "entry":
                why = "an entry point is imported by no module"
            elif okind == "cli" and kind != "entry":
                why = f"{TUNER_CLI} is imported only by entry points"
            elif okind == "package":
                why = "import the module that defines the name, not the package"
            elif kind == "layer" and ofolder not in TUNER_LAYERS:
                why = f"unknown tuner folder {ofolder!r} (add it to TUNER_LAYERS)"
            elif kind == "layer" and ofolder != folder and \
                    TUNER_LAYERS[ofolder] >= TUNER_LAYERS[folder]:
                why = (f"layer {folder!r} (rank {TUNER_LAYERS[folder]}) imports "
                       f"{ofolder!r} (rank {TUNER_LAYERS[ofolder]})")
            if why:
                bad.append(f"{rel}:{line} -> {mod} ({why})")
    return bad


def test_tuner_layers_and_thin_entry_points():
    folders = {p.parent.name for p in (ROOT / "tuner").glob("*/__init__.py")}
    assert folders == set(TUNER_LAYERS), (
        f"tuner's folders {sorted(folders)} are not the layers {sorted(TUNER_LAYERS)}")
    bad = tuner_layer_violations()
    assert not bad, _report(bad, "tuner layers: common <- workloads <- scenario <- "
                                 "objective, calibration <- search, export <- cli <- "
                                 "entry points")


def test_the_circle_and_layer_checks_can_fail(tmp_path, monkeypatch):
    """A circle through a function-level import, and a library module importing an
    entry point and a higher layer, are each reported."""
    for d in ("tuner", "tuner/objective", "tuner/search"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "tuner" / "fit.py").write_text("")
    (tmp_path / "tuner" / "objective" / "problem.py").write_text(
        "def f():\n    from tuner.search.fitting import x\n    from tuner import fit\n")
    (tmp_path / "tuner" / "search" / "fitting.py").write_text(
        "from tuner.objective.problem import Problem\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    cycle = find_cycle(import_graph(("tuner",)))
    assert cycle and set(cycle) == {"tuner.objective.problem", "tuner.search.fitting"}
    bad = tuner_layer_violations()
    assert any("problem.py:2 -> tuner.search.fitting (layer 'objective'" in b for b in bad)
    assert any("problem.py:3 -> tuner.fit (an entry point" in b for b in bad)
    assert len(bad) == 2, bad


def test_the_suites_longest_first_order_names_existing_files():
    """``tests/conftest.py`` starts the longest test files first; a renamed or deleted
    file left in its list would silently fall back to collection order."""
    from tests.conftest import LONGEST_FIRST

    here = Path(__file__).parent
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    missing = [n for n in LONGEST_FIRST if not (here / n).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names missing files {missing}"
