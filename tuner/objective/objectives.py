"""Objectives in physical units, composed from simulator metrics (higher is better).

An objective is written as a spec string: a goal, then constraints, comma-separated::

    goodput_rps                          # the default: capacity under SLOs
    tps,migration_rate<=0.005            # the ODMA papers' target (preset tps_mig)
    tps+2000*kv_utilization,ttft_slo_attainment>=0.9

The goal is a weighted sum of metrics: any metric a registered family declares
(``models.metric_specs``; every family reports ``completed`` and ``unserved``) or a
capacity metric (``tuner.objective.capacity``: goodput, saturation throughput, computed over a
ladder of arrival rates). Every value is multiplied by the share of requests served (an
unserved request is a failure, not a saving; not for capacity objectives, which count it
already) and by ``exp(-v / scale)`` for each
constraint violated by ``v`` (scale: the bound itself, or 1 for a zero bound), so a
feasible policy scores its goal in the goal's own unit and the penalty is smooth.

``Objective.with_margin(m)`` tightens every bound by the share ``m`` of its slack (a
``<=`` bound ``b`` becomes ``(1 - m) b``; a ``>=`` bound moves ``m`` of the way to the
metric's ceiling, 1 for shares, else to ``(1 + m) b``) while keeping each penalty's scale:
the fit trains against it so that a policy tuned on one slice of a trace keeps the real
bound on the next one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import jax.numpy as jnp

from tuner.objective.capacity import CAPACITY_METRICS, EXPECTED

__all__ = ["Objective", "parse_objective", "DEFAULT_OBJECTIVE", "PRESETS", "metric_names",
           "is_share", "metric_spec"]

DEFAULT_OBJECTIVE = "goodput_rps"
LOG_FLOOR = 1e-9  # a goal below this (nothing served) counts as log(1e-9) in log_value
PRESETS = {
    "default": DEFAULT_OBJECTIVE,
    "goodput": DEFAULT_OBJECTIVE,
    "saturation": "saturation_tps",
    "tps": "tps",
    "tps_mig": "tps,migration_rate<=0.005",  # the ODMA papers' target
    "utilization": "kv_utilization",
    "tps_slo": "tps,ttft_slo_attainment>=0.9,tpot_slo_attainment>=0.9",
    "slo": "ttft_slo_attainment+tpot_slo_attainment",
    # the parameter-dropping family's default: p99 TTFT (as its inverse, maximised)
    # while 99% of the requests meet the TPOT SLO
    "ttft_tail": "inv_ttft_p99,tpot_slo_attainment>=0.99",
}


def metric_names(system: str | None = None) -> list[str]:
    """Metrics an objective may name: those ``system``'s family declares, or (None)
    those of any registered family, plus the capacity metrics (``tuner.objective.capacity``)."""
    from models import metric_specs

    return sorted(set(metric_specs(system)) | set(CAPACITY_METRICS))


def is_share(name: str) -> bool:
    """A share in [0, 1] (a tightened ``>=`` bound moves toward 1)."""
    from models import metric_specs

    spec = metric_specs().get(name)
    return bool(spec is not None and spec.share)


def metric_spec(name: str):
    """The declared unit and meaning of a metric (a family's or a capacity metric)."""
    from models import metric_specs

    return CAPACITY_METRICS.get(name) or metric_specs().get(name)


_TERM = re.compile(r"^\s*(?:([0-9.eE+-]+)\s*\*\s*)?([a-z_0-9]+)\s*$")
_CONS = re.compile(r"^\s*([a-z_0-9]+)\s*(<=|>=)\s*([0-9.eE+-]+)\s*$")


@dataclass(frozen=True)
class Objective:
    spec: str
    goal: tuple[tuple[float, str], ...]
    constraints: tuple[tuple[str, str, float], ...]
    margin: float = 0.0  # share of each bound's slack removed (see with_margin)

    def with_margin(self, margin: float) -> "Objective":
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"objective margin {margin!r}: must be in [0, 1)")
        return replace(self, margin=float(margin))

    def bound(self, name: str, op: str, bound: float) -> float:
        """The bound in force after the margin."""
        if op == "<=":
            return bound * (1.0 - self.margin) if bound > 0 else bound
        if is_share(name):
            return bound + self.margin * max(1.0 - bound, 0.0)
        return (1.0 + self.margin) * bound if bound > 0 else bound

    def _scaled_violations(self, m: dict):
        for name, op, bound in self.constraints:
            b = self.bound(name, op, bound)
            viol = m[name] - b if op == "<=" else b - m[name]
            scale = abs(bound) if bound != 0 else 1.0  # the user's bound sets the scale
            yield jnp.maximum(viol, 0.0) / scale

    @property
    def capacity(self) -> bool:
        """Whether the objective needs a rate ladder (names a capacity metric)."""
        return bool(self.metrics_used() & set(CAPACITY_METRICS))

    @property
    def needs_record(self) -> bool:
        """Whether the objective reads a metric computed from the per-request record
        (the expected attainment, ``tuner.objective.capacity.EXPECTED``): its runs must
        keep the record."""
        return bool(self.metrics_used() & EXPECTED)

    def _served(self, m: dict):
        # a capacity metric already counts what is not served in time (and a ladder's
        # rungs are cut at a fixed horizon, so their unserved requests are no failure)
        if self.capacity:
            return 1.0
        return m["completed"] / jnp.maximum(m["completed"] + m["unserved"], 1e-9)

    def __call__(self, m: dict):
        value = sum(w * m[name] for w, name in self.goal)
        value = value * self._served(m)
        for v in self._scaled_violations(m):
            value = value * jnp.exp(-v)
        return value

    def log_value(self, m: dict):
        """``log`` of the objective, computed term by term so that it stays finite and
        informative deep inside a penalty region (where the value itself underflows):
        log goal + log served - sum of scaled violations. The gradient tuner climbs this
        (same maximisers; a constraint's pull is linear in its violation)."""
        value = sum(w * m[name] for w, name in self.goal)
        out = jnp.log(jnp.maximum(value * self._served(m), LOG_FLOOR))
        for v in self._scaled_violations(m):
            out = out - v
        return out

    def metrics_used(self) -> set[str]:
        return {n for _, n in self.goal} | {n for n, _, _ in self.constraints}

    def check_metrics(self, system: str) -> None:
        """Raise unless ``system``'s family reports every metric the objective names."""
        missing = self.metrics_used() - set(metric_names(system))
        if missing:
            raise ValueError(f"objective {self.spec!r}: system {system!r} does not report "
                             f"{sorted(missing)}; it reports {', '.join(metric_names(system))}")

    def describe(self) -> str:
        if self.margin and self.constraints:
            return f"{self.spec} (bounds tightened by {self.margin:.0%} of their slack)"
        return self.spec


def parse_objective(spec: str | None) -> Objective:
    """Parse a spec or preset name; errors name the offending part."""
    spec = PRESETS.get(spec or "default", spec)
    parts = [p for p in spec.split(",") if p.strip()]
    if not parts:
        raise ValueError("objective: empty specification")
    goal, known = [], metric_names()
    for term in parts[0].split("+"):
        m = _TERM.match(term)
        if not m or m.group(2) not in known:
            raise ValueError(f"objective: bad goal term {term.strip()!r}; metrics: "
                             f"{', '.join(known)}; presets: {', '.join(PRESETS)}")
        goal.append((float(m.group(1) or 1.0), m.group(2)))
    cons = []
    for c in parts[1:]:
        m = _CONS.match(c)
        if not m or m.group(1) not in known:
            raise ValueError(f"objective: bad constraint {c.strip()!r} "
                             "(expected metric<=value or metric>=value)")
        cons.append((m.group(1), m.group(2), float(m.group(3))))
    return Objective(spec, tuple(goal), tuple(cons))
