"""Scenarios: what is simulated. A :class:`ScenarioSpec` (trace, device or calibrated
profile, model, engine settings, SLOs) is checked and built into a :class:`Scenario`
(the workload with its length predictions, the deployment, the server configuration).

:mod:`tuner.scenario.build` builds it; :mod:`tuner.scenario.rates` rescales its
arrivals. The names below are re-exported from there.
"""

from tuner.scenario.build import *  # noqa: F401,F403
from tuner.scenario.build import __all__  # noqa: F401
