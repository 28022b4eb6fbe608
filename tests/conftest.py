"""Suite-wide test hooks: the ``needs_traces`` marker.

``@pytest.mark.needs_traces("azure-llm-2023-conv.csv", "castillo-qwen2.5-7b")`` skips a
test unless every named file or folder exists in the shared traces directory
(:func:`tuner.workloads.presets.traces_dir`: ``$KVTUNE_TRACES``, else
``<repo>/../shared/traces``); with no names it needs only the directory. Mark just the
tests that read the shared traces (directly or through a fixture), never a whole module,
so that the trace-free tests beside them run everywhere.
"""

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_traces(*names): skip unless these files/folders exist in the "
        "shared traces directory ($KVTUNE_TRACES, else <repo>/../shared/traces)")


def pytest_collection_modifyitems(config, items):
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
