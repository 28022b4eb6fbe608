"""Search: finding a policy.

- :mod:`~tuner.search.fitting`: gradient fitting (Adam on the relaxed objective,
  exact checks, checkpoints);
- :mod:`~tuner.search.gradcheck`: gradient checks against exact differences;
- :mod:`~tuner.search.blackbox`: Optuna TPE, CMA-ES and random search baselines;
- :mod:`~tuner.search.sweep` and :mod:`~tuner.search.pareto`: batched sweeps and their
  Pareto front.

Modules are imported on demand (``tuner.search.sweep`` must be importable before JAX
starts its backend).
"""
