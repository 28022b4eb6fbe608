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

The suite also compiles with XLA flags of its own (``SUITE_XLA_FLAGS`` below: quicker
compiles of slower programs; every test passes with them); the header line says which.
"""

import os
import shutil
import subprocess
import sys
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


# XLA's CPU compiler without its fusion emitters: the suite is mostly compiles (about two
# thirds of its worker time, measured per test file from JAX's compile events), and this
# flag cut the compile-bound tests by about a third (tests/test_invariants.py on three
# systems, 31 s -> 20 s; the whole suite 707 s -> 521-530 s, compile time summed over both
# workers 934 s -> 560 s; 2 cores) with every test still passing. Only the suite sets it:
# the command-line tools compile with XLA's defaults. A jaxlib that does not know the flag
# (XLA aborts on an unknown one) is detected by a one-line probe, and then the suite runs
# without it. ``KVTUNE_TEST_XLA_FLAGS=0`` turns it off. What it changes in results: on
# tests/test_sweep.py's six sweep points, every metric equal to XLA's default compile
# except a few latency percentiles in their last float32 unit (0.07079458 vs 0.070794605);
# the tests that compare two runs bit for bit compile both with the same flags.
#
# Two more flags cut XLA's CPU compile time again (2026-11-29, one core each, beside
# another job): LLVM's expensive passes off and the backend at optimisation level 0.
# tests/test_dropping.py's compile time (JAX's compile log) 46.7 s -> 18.3 s and its wall
# 70.9 s -> 54.1 s (the programs run slower, compiles dominate); tests/test_fit.py 126 s
# -> 84 s; tests/test_invariants.py 114 s -> 103 s. Either flag alone saved less (the
# first: test_dropping's compile time -10%; the second: test_invariants' wall -4%). The
# whole suite on a quiet machine, 2 workers: 659 s -> 599 s wall, worker CPU 1,257 s ->
# 1,120 s (user time), the same tests passing. The tests that compare
# two runs bit for bit compile both with the same flags; the references they are
# checked against are NumPy's, with the tolerances each test states.
SUITE_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false "
                   "--xla_llvm_disable_expensive_passes=true "
                   "--xla_backend_optimization_level=0")


def _suite_xla_flags() -> None:
    if os.environ.get("KVTUNE_TEST_XLA_FLAGS", "1") == "0" or os.environ.get(
            "PYTEST_XDIST_WORKER"):  # workers inherit the controller's environment
        return
    flags = (os.environ.get("XLA_FLAGS", "") + " " + SUITE_XLA_FLAGS).strip()
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import jax.numpy as j; j.zeros(1).block_until_ready()"],
            env={**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"},
            capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):  # no verdict: XLA's defaults
        return
    if probe.returncode == 0:
        os.environ["XLA_FLAGS"] = flags


_suite_xla_flags()


def pytest_report_header(config):
    return f"XLA_FLAGS: {os.environ.get('XLA_FLAGS') or '(none)'}"


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


# Test files in order of their wall time in one suite run (2 cores, 2026-11-27, with the
# XLA flag above, each file 13-120 s), longest first. The workers take whole files
# (``--dist loadfile``) in collection order (``--no-loadscope-reorder``), so the longest
# start first and no worker is left finishing a long file alone at the end
# (longest-processing-time scheduling). The order only moves time; a file missing here
# runs after these.
LONGEST_FIRST = (
    "test_invariants.py", "test_readme.py", "test_fit.py", "test_experiments_odma.py",
    "test_dropping.py", "test_tokenpd_reference.py", "test_bucketed_reference.py",
    "test_experiments_ellm.py", "test_bucketed_relaxed.py", "test_sweep.py",
    "test_experiments_stakes.py", "test_calibration.py", "test_family_plugin.py",
    "test_experiments_kunserve.py", "test_learned.py", "test_bench_tuners.py",
    "test_batched_eval.py",
    "test_highdim.py", "test_experiments_tokenpd.py", "test_kunserve_reference.py",
    "test_elastic.py", "test_bad_input.py", "test_tokenpd_tiers.py", "test_predictor.py",
    "test_eviction.py", "test_capacity.py", "test_elastic_reference.py",
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
