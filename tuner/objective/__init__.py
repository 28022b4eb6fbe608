"""Objectives and their evaluation: what a policy is judged by.

- :mod:`~tuner.objective.objectives`: objective expressions (``goodput_rps``,
  weighted sums, constraints) and their metrics;
- :mod:`~tuner.objective.capacity`: goodput and saturation on a rate ladder (relaxed:
  one vmapped call; exact: bisection of the first crossing);
- :mod:`~tuner.objective.evaluate`: the exact (or relaxed) evaluation of one policy;
- :mod:`~tuner.objective.space`: the tunable parameters as one unconstrained vector;
- :mod:`~tuner.objective.problem`: the differentiable objective a search optimises over it;
- :mod:`~tuner.objective.validation`: held-out windows and seeds, verdicts.

Modules are imported on demand (nothing is imported here).
"""
