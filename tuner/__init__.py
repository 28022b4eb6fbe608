"""The tuner, in layers (each imports only the ones above it in this list):

- ``tuner.common``: atomic writes, result provenance;
- ``tuner.workloads``: traces, arrivals, benchmark results, the length predictor;
- ``tuner.scenario``: a scenario spec built into what is simulated;
- ``tuner.objective`` and ``tuner.calibration``: objectives and their exact evaluation,
  held-out validation and verdicts; the roofline fitted to measured runs;
- ``tuner.search`` and ``tuner.export``: gradient fitting, black-box baselines, sweeps;
  the policy file, vLLM arguments and the measurement kit;
- command-line entry points, thin, on top: ``python -m tuner.fit`` (the main job),
  ``tuner.evaluate``, ``tuner.sweep``, ``tuner.calibrate``, ``tuner.memory``,
  ``tuner.explain``, ``tuner.bench_dataset`` (their shared flags: ``tuner.cli``), and
  ``tuner.workloads.trace`` / ``tuner.workloads.predictor`` for workloads.

``tests/test_layout.py`` checks the layering. Submodules are imported on demand, so
light commands (``python -m tuner.workloads.trace``) start without loading JAX.
"""

__all__ = [
    "calibration", "common", "export", "objective", "scenario", "search", "workloads",
]
