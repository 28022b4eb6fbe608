"""A workload at another rate: every arrival time multiplied by one factor (its burst
pattern kept; 0 puts every request at t = 0). Used to move a scenario along a rate ladder
(:meth:`tuner.scenario.Scenario.at_rate`) and, traced, by the capacity objectives.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["scale_arrivals", "scale_workload"]


def scale_workload(wl, factor):
    """The workload with its arrival times multiplied by ``factor`` (0: all at once);
    padding rows keep ``+inf``."""
    return wl.replace(arrival_s=jnp.where(wl.valid, wl.arrival_s * factor, jnp.inf))


def scale_arrivals(inputs, factor):
    """Inputs whose workload's arrival times are multiplied by ``factor``."""
    return inputs.replace(wl=scale_workload(inputs.wl, factor))
