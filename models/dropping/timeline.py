"""A run of the cluster with its memory over time (for plots): per step the round's
start, the cluster's held KV, its capacity, the queued demand, the number of groups and
every instance's group."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from models.dropping.cluster import loads
from models.family import family_of
from models.simulate import init_state

__all__ = ["timeline"]


@partial(jax.jit, static_argnames=("opts", "n"))
def _scan(state, inputs, hw, params, opts, n):
    fam = family_of(opts.system)
    ni = state.gid.shape[0]

    def body(s, _):
        s, _ = fam.step(s, inputs, params, hw=hw, t=jnp.float32(0.0), opts=opts)
        ld = loads(s, ni)
        g = ld.size > 0
        row = (s.clock, jnp.sum(jnp.where(g, ld.held, 0.0)),
               jnp.sum(jnp.where(g, s.capw, 0.0)), jnp.sum(ld.queued),
               jnp.sum(g.astype(jnp.int32)), s.gid)
        return s, row

    return jax.lax.scan(body, state, None, length=n)


def timeline(inputs, hw, params, opts, max_steps: int, chunk: int = 4096):
    """Run until done (or ``max_steps``); returns ``(state, dict of numpy arrays)`` with
    ``t`` (the latest round end so far, s), ``held``, ``cap``, ``queued`` (KV tokens),
    ``groups`` and ``gid`` ([steps, N], each instance's group) per step. The latency
    histograms are not filled (use ``record``)."""
    fam = family_of(opts.system)
    state = init_state(inputs, params, jnp.float32(0.0), opts)
    rows, steps = [], 0
    while steps < max_steps:
        state, out = _scan(state, inputs, hw, params, opts, chunk)
        rows.append([np.asarray(v) for v in out])
        steps += chunk
        if bool(fam.done(state, inputs)):
            break
    keys = ("t", "held", "cap", "queued", "groups", "gid")
    data = {k: np.concatenate([r[i] for r in rows]) for i, k in enumerate(keys)}
    return state, data
