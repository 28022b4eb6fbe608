"""Registry of memory systems and their policy parameters.

Each system names its parameters with a domain (what values are legal), a unit, a paper
default and whether a gradient tuner may move it. The tuner turns domains into
unconstrained transforms; the CLI and tests enumerate systems from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ParamSpec", "SystemSpec", "register_system", "get_system", "list_systems",
           "validate_params"]


@dataclass(frozen=True)
class ParamSpec:
    name: str
    domain: str          # "ordered_unit" (increasing in (0,1)), "unit", "positive",
    #                      "interval", "ordered_positive", "integer"
    unit: str
    doc: str
    lower: float = 0.0
    upper: float = 1.0
    tunable: bool = True


@dataclass(frozen=True)
class SystemSpec:
    name: str
    family: str                    # which simulator implements it ("bucketed", ...)
    doc: str
    params: tuple[ParamSpec, ...]
    defaults: object               # callable(max_len) -> dict of numpy float32 arrays
    baseline: str                  # the paper's baseline system for comparisons
    sources: tuple[str, ...] = field(default=())

    def default_params(self, max_len: int) -> dict:
        return {k: np.asarray(v, np.float32) for k, v in self.defaults(max_len).items()}

    def tunable(self) -> tuple[ParamSpec, ...]:
        return tuple(p for p in self.params if p.tunable)


_SYSTEMS: dict[str, SystemSpec] = {}


def register_system(spec: SystemSpec) -> SystemSpec:
    _SYSTEMS[spec.name] = spec
    return spec


def get_system(name: str) -> SystemSpec:
    if name not in _SYSTEMS:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(sorted(_SYSTEMS))}")
    return _SYSTEMS[name]


def list_systems() -> list[str]:
    return sorted(_SYSTEMS)


def validate_params(spec: SystemSpec, params: dict, max_len: int) -> dict:
    """Check names, shapes and domains; return float32 arrays. Errors name the field."""
    defaults = spec.default_params(max_len)
    known = {p.name: p for p in spec.params}
    unknown = set(params) - set(known)
    if unknown:
        raise ValueError(f"{spec.name}: unknown parameter(s) {sorted(unknown)}; "
                         f"known: {sorted(known)}")
    out = {}
    for name, p in known.items():
        v = np.asarray(params.get(name, defaults[name]), np.float32)
        if v.shape != defaults[name].shape and not (p.domain.startswith("ordered")
                                                    and v.ndim == 1 and v.size >= 1):
            raise ValueError(f"{spec.name}: parameter {name!r} has shape {v.shape}, "
                             f"expected {defaults[name].shape}")
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{spec.name}: parameter {name!r} is not finite: {v}")
        lo, hi = p.lower, p.upper
        if p.domain in ("unit", "ordered_unit") and np.any((v <= 0) | (v >= 1)):
            raise ValueError(f"{spec.name}: parameter {name!r} must lie in (0, 1): {v}")
        if p.domain in ("positive", "ordered_positive", "integer") and np.any(v <= 0):
            raise ValueError(f"{spec.name}: parameter {name!r} must be > 0: {v}")
        if p.domain == "interval" and np.any((v < lo) | (v > hi)):
            raise ValueError(f"{spec.name}: parameter {name!r} must lie in [{lo}, {hi}]: {v}")
        if p.domain.startswith("ordered") and np.any(np.diff(v) <= 0):
            raise ValueError(f"{spec.name}: parameter {name!r} must be strictly increasing: {v}")
        if p.domain == "integer" and np.any(v != np.round(v)):
            raise ValueError(f"{spec.name}: parameter {name!r} must be an integer: {v}")
        out[name] = v
    return out
