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
    """The repair of one system on one deployment (see the module). Calling it with
    ``(theta, grad)`` returns ``(theta, moved)``: ``theta`` unchanged and ``moved`` empty
    where the system starts there or no flat coordinate alone makes it start; else the
    repaired theta and ``[(name, index, delta)]`` of the one coordinate moved."""

    def __init__(self, space, refusal, deployment, flat_tol: float = FLAT_TOL):
        if not flat_tol >= 0:
            raise ValueError(f"feasibility repair: flat_tol {flat_tol!r} must be >= 0")
        self.space, self.refusal, self.deployment = space, refusal, deployment
        self.flat_tol = float(flat_tol)

    def refused(self, theta) -> bool:
        params = self.space.human(self.space.to_params(theta))
        return self.refusal(self.deployment, params) is not None

    @staticmethod
    def _moved(theta, name, i, delta):
        x = np.array(theta[name], np.float32)
        flat = x.reshape(-1)
        flat[i] += delta
        return {**theta, name: jnp.asarray(flat.reshape(x.shape), jnp.float32)}

    def _distance(self, theta, name, i, sign) -> float | None:
        """The least theta distance along ``sign`` that starts, or None."""
        lo = 0.0
        for d in DISTANCES:
            if not self.refused(self._moved(theta, name, i, sign * d)):
                hi = d
                for _ in range(BISECTIONS):
                    mid = 0.5 * (lo + hi)
                    if self.refused(self._moved(theta, name, i, sign * mid)):
                        lo = mid
                    else:
                        hi = mid
                return hi
            lo = d
        return None

    def __call__(self, theta, grad) -> tuple[dict, list]:
        if not self.refused(theta):
            return theta, []
        coords = self.space.coords()
        mags = {c: abs(float(np.asarray(grad[c[0]]).reshape(-1)[c[1]])) for c in coords}
        top = max(mags.values(), default=0.0)
        if not np.isfinite(top):
            return theta, []
        best = None
        for (name, i), m in mags.items():
            if m > self.flat_tol * top:
                continue
            for sign in (-1.0, 1.0):
                d = self._distance(theta, name, i, sign)
                if d is not None and (best is None or d < best[0]):
                    best = (d, name, i, sign)
        if best is None:
            return theta, []
        d, name, i, sign = best
        return self._moved(theta, name, i, sign * d), [(name, i, sign * d)]


def for_problem(prob, system) -> Repair | None:
    """The repair of ``prob`` (a training problem; its ``deployment``) for ``system``
    (a ``SystemSpec``), or None where the system predicts no refusal."""
    if system.refusal is None or getattr(prob, "deployment", None) is None:
        return None
    return Repair(prob.space, system.refusal, prob.deployment)
