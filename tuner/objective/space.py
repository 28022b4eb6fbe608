"""Unconstrained parameter space with explicit transforms per parameter domain.

The optimiser works on ``theta`` (a dict of float32 arrays, any real values);
``to_params`` maps it to physical parameters that always satisfy the system's domains
(ordered quantile levels in (0, 1), intervals, positive sizes) by the transforms of the
domain table ``models.domains``; ``to_theta`` inverts it.
Fixed (non-tunable) parameters pass through unchanged.

A *fleet* space (base parameters given as a list, one dict per replica) holds one
policy per replica: every leaf of ``theta`` and of the parameters gains a leading axis
of the replicas (the scenarios of a problem, one replica each), and the transforms map
each replica's slice alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from models.domains import get_domain
from models.registry import SystemSpec

__all__ = ["Space"]


class Space:
    """Transforms between ``theta`` and the physical parameters of one system."""

    def __init__(self, spec: SystemSpec, base_params, names=None):
        tunable = [p for p in spec.tunable() if names is None or p.name in names]
        if names is not None:
            unknown = set(names) - {p.name for p in spec.tunable()}
            if unknown:
                raise ValueError(f"{spec.name}: not tunable: {sorted(unknown)}")
        self.spec = spec
        self.params = {p.name: p for p in tunable}
        # replicas: 0 for one policy; R for a fleet (one policy per replica)
        if isinstance(base_params, (list, tuple)):
            if not base_params:
                raise ValueError(f"{spec.name}: a fleet space needs >= 1 replica")
            keys = set(base_params[0])
            if any(set(b) != keys for b in base_params[1:]):
                raise ValueError(f"{spec.name}: the replicas' parameters differ in names")
            self.replicas = len(base_params)
            self.base = {k: jnp.stack([jnp.asarray(b[k], jnp.float32)
                                       for b in base_params]) for k in base_params[0]}
        else:
            self.replicas = 0
            self.base = {k: jnp.asarray(v, jnp.float32) for k, v in base_params.items()}

    def _key(self):
        return (self.spec.name, self.replicas,
                tuple((n, p.domain, p.lower, p.upper) for n, p in self.params.items()))

    def __hash__(self):  # hashable by structure: a static argument of jitted functions
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, Space) and self._key() == other._key()

    @property
    def names(self) -> list[str]:
        return list(self.params)

    @staticmethod
    def _domain(p):
        dom = get_domain(p.domain)
        if dom.fwd is None:
            raise ValueError(f"parameter {p.name!r}: domain {p.domain!r} cannot be tuned "
                             "by gradient")
        return dom

    def _fwd(self, p, z):
        fwd = self._domain(p).fwd
        return jax.vmap(lambda zi: fwd(zi, p))(z) if self.replicas else fwd(z, p)

    def _inv(self, p, x):
        inv = self._domain(p).inv
        x = jnp.asarray(x, jnp.float32)
        return jax.vmap(lambda xi: inv(xi, p))(x) if self.replicas else inv(x, p)

    def to_params(self, theta: dict, base: dict | None = None) -> dict:
        """Physical parameters: tuned ones from ``theta``, the rest from ``base``."""
        out = dict(self.base if base is None else base)
        for name, p in self.params.items():
            out[name] = self._fwd(p, theta[name]).astype(jnp.float32)
        return out

    def to_theta(self, params: dict) -> dict:
        return {n: self._inv(p, params[n]).astype(jnp.float32)
                for n, p in self.params.items()}

    def coords(self) -> list[tuple[str, int]]:
        """(name, index) of every scalar coordinate of theta, for per-coordinate checks."""
        return [(n, i) for n in self.names for i in range(int(np.size(self.base[n])))]

    def human(self, params: dict) -> dict:
        """Plain Python values for export (lists for vectors; a fleet's: one entry per
        replica first)."""
        return {k: np.asarray(v).tolist() for k, v in params.items()}

    def replica(self, params: dict, i: int) -> dict:
        """Replica ``i``'s parameters (plain values) of a fleet's ``params``; the
        parameters themselves for one policy."""
        if not self.replicas:
            return self.human(params)
        return {k: np.asarray(v)[i].tolist() for k, v in params.items()}
