"""Suite-wide test hooks: the ``needs_traces`` marker.

``@pytest.mark.needs_traces("azure-llm-2023-conv.csv", "castillo-qwen2.5-7b")`` skips a
test unless every named file or folder exists in the shared traces directory
(:func:`tuner.workloads.presets.traces_dir`: ``$KVTUNE_TRACES``, else
``<repo>/../shared/traces``); with no names it needs only the directory. Mark just the
tests that read the shared traces (directly or through a fixture), never a whole module,
so that the trace-free tests beside them run everywhere.

The experiment scripts' persistent XLA cache (``KVTUNE_JAX_CACHE``) stays off inside the
test process unless the environment sets it: enabled midway through the suite (by the
first experiment test), JAX's cache read/write crashed the process with a segmentation
fault in later tests (twice, in ``test_readme``'s tour).

Instead, the suite runs with JAX's own persistent compilation cache set from its start
(environment variables read when jax is imported, so it is never switched on midway): a
fresh folder per run, shared by the xdist workers and removed at the end. The suite
compiles the same simulators in many modules (compiled executables are dropped after
each module, see below) and in both workers; with the cache a repeated compile is a
read. ``KVTUNE_TEST_JAX_CACHE=0`` turns it off; a ``JAX_COMPILATION_CACHE_DIR`` already
in the environment is used as it is (and kept).
"""

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("KVTUNE_JAX_CACHE", "0")

_CREATED_CACHE = None
if (os.environ.get("KVTUNE_TEST_JAX_CACHE", "1") != "0"
        and "JAX_COMPILATION_CACHE_DIR" not in os.environ):
    # the controller sets it before the workers start; they inherit the environment
    _CREATED_CACHE = tempfile.mkdtemp(prefix="kvtune-test-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CREATED_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_unconfigure(config):
    if _CREATED_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(_CREATED_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_executables():
    """Drop JAX's compiled executables after each test module: the suite compiles
    hundreds of simulators in one process, and past ~55% of it XLA's CPU compiler
    crashed with a segmentation fault (the process's memory maps grow with every live
    executable)."""
    yield
    import jax

    jax.clear_caches()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_traces(*names): skip unless these files/folders exist in the "
        "shared traces directory ($KVTUNE_TRACES, else <repo>/../shared/traces)")


# Test files in order of their wall time in one suite run (2 cores, 2026-11-26, each file
# 25-170 s), longest first. The workers take whole files (``--dist loadfile``) in
# collection order (``--no-loadscope-reorder``), so the longest start first and no worker
# is left finishing a two-minute file alone at the end (longest-processing-time
# scheduling). The order only moves time; a file missing here runs after these.
LONGEST_FIRST = (
    "test_invariants.py", "test_readme.py", "test_experiments_odma.py",
    "test_dropping.py", "test_fit.py", "test_bucketed_relaxed.py",
    "test_bucketed_reference.py", "test_tokenpd_reference.py", "test_sweep.py",
    "test_experiments_ellm.py", "test_family_plugin.py", "test_calibration.py",
    "test_bench_tuners.py", "test_search.py", "test_bad_input.py", "test_highdim.py",
    "test_experiments_stakes.py", "test_experiments_tokenpd.py",
    "test_experiments_kunserve.py", "test_batched_eval.py", "test_elastic.py",
    "test_kunserve_reference.py", "test_tokenpd_tiers.py",
)


def _longest_first(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), order[id(item)]))


def pytest_collection_modifyitems(config, items):
    _longest_first(items)
    marked = [(item, [n for m in item.iter_markers("needs_traces") for n in m.args])
              for item in items if item.get_closest_marker("needs_traces")]
    if not marked:
        return
    from tuner.workloads.presets import traces_dir

    root = traces_dir()
    for item, names in marked:
        missing = [n for n in dict.fromkeys(names) if not (root / n).exists()]
        if missing or not root.is_dir():
            what = ", ".join(missing) if missing else "the directory"
            item.add_marker(pytest.mark.skip(reason=f"shared traces: {what} not found "
                                             f"under {root}"))
