"""Feasibility repair of a gradient step: where a step lands on a setting the system
refuses to start, the coordinates the objective is flat in move the least distance in
theta that makes it start (used by :func:`tuner.search.fitting.fit`).

Why: a system may refuse settings by a rule that couples parameters (``SystemSpec.
refusal``; for ``vllm-v1``, vLLM's start-up check ``max_num_batched_tokens >=
max_num_seqs`` and its memory profile). At vLLM's H100 defaults (1,024 sequences, an
8,192-token budget) on a deployment whose concurrency stays below 1,024, goodput is
flat in ``max_num_seqs``, while it rises as the token budget falls. Each step that
takes the budget below 1,024 is refused (nothing is served there), its exact check
fails and the fit reverts, so the gradient stops at the wall: `experiments/
engine_tune` recorded 1,045 tokens with 1,024 sequences, where 512 tokens with any
number of sequences from 128 to 512 serve 1.4x more (`experiments/engine_stakes`).
Moving a coordinate the objective is flat in costs no value to first order, so moving
only those is a projection onto the set of settings that start which keeps the step's
gain, and it needs no knowledge of the rule: only the system's own refusal, asked on
the host (no simulation).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

__all__ = ["FLAT_TOL", "Repair", "for_problem"]

# a coordinate is flat where its |gradient| is at most this share of the largest one
FLAT_TOL = 1e-3
# theta distances tried outwards from the refused point (then bisected); the black-box
# box is +-5, so 8 reaches across any parameter's useful range
DISTANCES = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0)
BISECTIONS = 8  # the boundary to 1/256 of the last bracket


class Repair:
    """The repair of one system on one deployment, or on each replica's of a fleet
    (``deployment`` a list, one per replica of a fleet space; see the module). Calling
    it with ``(theta, grad)`` returns ``(theta, moved)``: ``theta`` unchanged and
    ``moved`` empty where the system starts there or no flat coordinate alone makes it
    start; else the repaired theta and ``[(name, index, delta)]`` of the coordinates
    moved (a fleet: at most one per refused replica, among that replica's own)."""

    def __init__(self, space, refusal, deployment, flat_tol: float = FLAT_TOL):
        if not flat_tol >= 0:
            raise ValueError(f"feasibility repair: flat_tol {flat_tol!r} must be >= 0")
        self.space, self.refusal = space, refusal
        self.deployments = (list(deployment) if isinstance(deployment, (list, tuple))
                            else [deployment])
        n = max(1, getattr(space, "replicas", 0))
        if len(self.deployments) != n:
            raise ValueError(f"feasibility repair: {len(self.deployments)} deployments "
                             f"for {n} replicas")
        self.flat_tol = float(flat_tol)

    def _refused(self, theta, r: int) -> bool:
        params = self.space.to_params(theta)
        if getattr(self.space, "replicas", 0):
            params = self.space.replica(params, r)
        else:
            params = self.space.human(params)
        return self.refusal(self.deployments[r], params) is not None

    def refused(self, theta) -> bool:
        return any(self._refused(theta, r) for r in range(len(self.deployments)))

    @staticmethod
    def _moved(theta, name, i, delta):
        x = np.array(theta[name], np.float32)
        flat = x.reshape(-1)
        flat[i] += delta
        return {**theta, name: jnp.asarray(flat.reshape(x.shape), jnp.float32)}

    def _distance(self, theta, name, i, sign, r: int) -> float | None:
        """The least theta distance along ``sign`` that starts replica ``r``, or None."""
        lo = 0.0
        for d in DISTANCES:
            if not self._refused(self._moved(theta, name, i, sign * d), r):
                hi = d
                for _ in range(BISECTIONS):
                    mid = 0.5 * (lo + hi)
                    if self._refused(self._moved(theta, name, i, sign * mid), r):
                        lo = mid
                    else:
                        hi = mid
                return hi
            lo = d
        return None

    def _owner(self, name: str, i: int) -> int:
        """The replica coordinate ``(name, i)`` belongs to (0 for one policy)."""
        n = len(self.deployments)
        return i // max(1, int(np.size(self.space.base[name])) // n) if n > 1 else 0

    def __call__(self, theta, grad) -> tuple[dict, list]:
        refused = [r for r in range(len(self.deployments)) if self._refused(theta, r)]
        if not refused:
            return theta, []
        coords = self.space.coords()
        mags = {c: abs(float(np.asarray(grad[c[0]]).reshape(-1)[c[1]])) for c in coords}
        top = max(mags.values(), default=0.0)
        if not np.isfinite(top):
            return theta, []
        moved = []
        for r in refused:
            best = None
            for (name, i), m in mags.items():
                if m > self.flat_tol * top or self._owner(name, i) != r:
                    continue
                for sign in (-1.0, 1.0):
                    d = self._distance(theta, name, i, sign, r)
                    if d is not None and (best is None or d < best[0]):
                        best = (d, name, i, sign)
            if best is not None:
                d, name, i, sign = best
                theta = self._moved(theta, name, i, sign * d)
                moved.append((name, i, sign * d))
        return theta, moved


def for_problem(prob, system) -> Repair | None:
    """The repair of ``prob`` (a training problem; its ``deployment``, or a fleet's
    ``deployments``) for ``system`` (a ``SystemSpec``), or None where the system
    predicts no refusal."""
    if system.refusal is None or getattr(prob, "deployment", None) is None:
        return None
    if getattr(prob.space, "replicas", 0):
        return Repair(prob.space, system.refusal, prob.deployments)
    return Repair(prob.space, system.refusal, prob.deployment)
