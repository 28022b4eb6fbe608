"""Registry of memory systems and their policy parameters.

A system belongs to a family (the simulator that runs it, ``models.family``) and names
its parameters with a domain (``models.domains``: legal values, the gradient tuner's
transforms, sampling), a unit, a paper default and whether a tuner may move it. The
CLI, the tuner and the tests enumerate systems from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from models.domains import get_domain
from models.family import bind_system, get_family

__all__ = ["ParamSpec", "SystemSpec", "register_system", "get_system", "list_systems",
           "validate_params"]


@dataclass(frozen=True)
class ParamSpec:
    name: str
    domain: str          # a key of models.domains.DOMAINS
    unit: str
    doc: str
    lower: float = 0.0
    upper: float = 1.0
    tunable: bool = True

    def __post_init__(self):
        get_domain(self.domain)


@dataclass(frozen=True)
class SystemSpec:
    name: str
    family: str                    # the registered family that simulates it
    doc: str
    params: tuple[ParamSpec, ...]
    defaults: object               # callable(max_len, hw=None) -> dict of values
    baselines: tuple[str, ...]     # the papers' baseline systems for comparisons
    sources: tuple[str, ...] = field(default=())
    # defaults that depend on the deployment (an engine's own defaults for the device):
    # ``defaults`` is then callable(max_len, hw, deployment)
    device_defaults: bool = False
    # callable(deployment, params) -> (field, reason) where the real server would refuse
    # to start with ``params``, else None (None: the system never refuses)
    refusal: object = None

    def default_params(self, max_len: int, hw=None, deployment=None) -> dict:
        """Paper defaults as float32 arrays; ``hw`` (``hardware.RooflineParams``) lets a
        default depend on the device (None: a device-free default); a system with
        ``device_defaults`` needs ``deployment`` (``hardware.Deployment``)."""
        if self.device_defaults:
            if deployment is None:
                raise ValueError(f"{self.name}: its defaults are the engine's own for the "
                                 "device; they need the scenario's deployment")
            values = self.defaults(max_len, hw, deployment)
        else:
            values = self.defaults(max_len, hw)
        return {k: np.asarray(v, np.float32) for k, v in values.items()}

    def tunable(self) -> tuple[ParamSpec, ...]:
        return tuple(p for p in self.params if p.tunable)


_SYSTEMS: dict[str, SystemSpec] = {}


def register_system(spec: SystemSpec) -> SystemSpec:
    """Register a system (its family must be registered first, see ``models.family``)."""
    get_family(spec.family)  # fails with the known families' names
    if not isinstance(spec.baselines, tuple) or not spec.baselines:
        raise ValueError(f"{spec.name}: baselines must be a non-empty tuple of systems")
    bind_system(spec.name, spec.family)
    _SYSTEMS[spec.name] = spec
    return spec


def get_system(name: str) -> SystemSpec:
    if name not in _SYSTEMS:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(sorted(_SYSTEMS))}")
    return _SYSTEMS[name]


def list_systems() -> list[str]:
    return sorted(_SYSTEMS)


def validate_params(spec: SystemSpec, params: dict, max_len: int, hw=None,
                    deployment=None) -> dict:
    """Check names, shapes and domains; return float32 arrays. Errors name the field.
    A system with ``device_defaults`` needs ``deployment`` unless ``params`` gives every
    parameter."""
    known = {p.name: p for p in spec.params}
    if spec.device_defaults and deployment is None and set(params) >= set(known):
        defaults = {k: np.asarray(params[k], np.float32) for k in known}  # shapes only
    else:
        defaults = spec.default_params(max_len, hw, deployment)
    unknown = set(params) - set(known)
    if unknown:
        raise ValueError(f"{spec.name}: unknown parameter(s) {sorted(unknown)}; "
                         f"known: {sorted(known)}")
    out = {}
    for name, p in known.items():
        dom = get_domain(p.domain)
        v = np.asarray(params.get(name, defaults[name]), np.float32)
        if v.shape != defaults[name].shape and not (dom.ordered and v.ndim == 1
                                                    and v.size >= 1):
            raise ValueError(f"{spec.name}: parameter {name!r} has shape {v.shape}, "
                             f"expected {defaults[name].shape}")
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{spec.name}: parameter {name!r} is not finite: {v}")
        msg = dom.check(v, p)
        if msg:
            raise ValueError(f"{spec.name}: parameter {name!r} {msg}: {v}")
        out[name] = v
    return out
