"""The tuner: workloads and traces, the length predictor, objectives, gradient fitting,
exact-mode validation, sweeps and config export.

Submodules are imported on demand so that light commands (``python -m tuner.trace``)
start without loading JAX. Entry points: ``python -m tuner.fit`` (the main job),
``tuner.evaluate``, ``tuner.sweep``, ``tuner.trace``, ``tuner.predictor``.
"""

__all__ = [
    "arrivals", "error_model", "evaluate", "features", "fit", "fitting", "gradcheck",
    "objectives", "policy", "predictor", "presets", "scenario", "space", "sweep", "trace",
    "traces",
]
