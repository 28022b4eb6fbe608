"""The tuner: workloads and traces, the length predictor, objectives, gradient fitting,
exact-mode validation, black-box search (Optuna TPE, CMA-ES, random), sweeps and config
export.

Submodules are imported on demand so that light commands
(``python -m tuner.workloads.trace``) start without loading JAX. Entry points:
``python -m tuner.fit`` (the main job), ``tuner.evaluate``, ``tuner.sweep``,
``tuner.workloads.trace``, ``tuner.workloads.predictor``. ``tuner.workloads`` holds what
is simulated (traces, arrivals, presets, predictor, error model); the rest is tuning.
"""

__all__ = [
    "atomic", "evaluate", "fit", "fitting", "gradcheck", "objectives", "policy", "problem",
    "scenario", "search", "space", "sweep", "workloads",
]
