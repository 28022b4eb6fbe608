"""The simulators' input: a fixed-shape, padded request table.

Every simulator consumes a :class:`Workload`. Requests are sorted by arrival time;
padding rows have ``valid == False`` and an arrival time of ``+inf`` so they are never
admitted. ``tuner/`` turns trace files into this type; simulators never read files.

``priority`` (optional) is each request's scheduling priority as vLLM V1's
``--scheduling-policy priority`` reads it: lower is served first, ties by arrival. None
(the default) is first-come-first-served; only the bucketed family reads it
(``models.bucketed.admission``), the others refuse a workload that carries it.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = ["Workload", "make_workload"]


@struct.dataclass
class Workload:
    arrival_s: jnp.ndarray      # [N] float32 seconds from the start, non-decreasing
    prompt_tokens: jnp.ndarray  # [N] int32 prompt length (>= 1)
    output_tokens: jnp.ndarray  # [N] int32 realised output length (>= 1)
    pred_tokens: jnp.ndarray    # [N] float32 predicted output length L_hat (> 0)
    pred_u: jnp.ndarray         # [N] float32 prediction uncertainty u in [0, 1]
    valid: jnp.ndarray          # [N] bool, False for padding rows
    priority: jnp.ndarray | None = None  # [N] float32 lower first; None: FCFS

    @property
    def size(self) -> int:
        return int(self.arrival_s.shape[-1])


def make_workload(
    arrival_s,
    prompt_tokens,
    output_tokens,
    pred_tokens=None,
    pred_u=None,
    *,
    priority=None,
    pad_to: int | None = None,
) -> Workload:
    """Build a :class:`Workload` from 1-D arrays, sorting by arrival and padding.

    Without predictions, ``pred_tokens`` defaults to the realised length (an oracle) and
    ``pred_u`` to zero; without ``priority`` the server is first-come-first-served.
    Raises ``ValueError`` naming the field on bad values.
    """
    arrival = np.asarray(arrival_s, dtype=np.float64)
    prompt = np.asarray(prompt_tokens)
    output = np.asarray(output_tokens)
    n = arrival.shape[0]
    pred = output.astype(np.float64) if pred_tokens is None else np.asarray(pred_tokens, np.float64)
    unc = np.zeros(n) if pred_u is None else np.asarray(pred_u, np.float64)
    fields = {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output,
              "pred_tokens": pred, "pred_u": unc}
    if priority is not None:
        fields["priority"] = np.asarray(priority, np.float64)
    for name, arr in fields.items():
        if arr.ndim != 1 or arr.shape[0] != n:
            raise ValueError(f"workload field {name!r}: expected shape ({n},), got {arr.shape}")
        if not np.all(np.isfinite(arr.astype(np.float64))):
            raise ValueError(f"workload field {name!r}: contains NaN or infinite values")
    if n == 0:
        raise ValueError("workload is empty: no requests")
    if np.any(prompt < 1) or np.any(output < 1):
        bad = "prompt_tokens" if np.any(prompt < 1) else "output_tokens"
        raise ValueError(f"workload field {bad!r}: token counts must be >= 1")
    if np.any(arrival < 0):
        raise ValueError("workload field 'arrival_s': arrival times must be >= 0")
    if np.any(pred <= 0):
        raise ValueError("workload field 'pred_tokens': predictions must be > 0")
    if np.any((unc < 0) | (unc > 1)):
        raise ValueError("workload field 'pred_u': uncertainty must lie in [0, 1]")
    order = np.argsort(arrival, kind="stable")
    size = n if pad_to is None else int(pad_to)
    if size < n:
        raise ValueError(f"pad_to={size} is smaller than the {n} requests")
    pad = size - n

    def col(a, dtype, fill):
        return jnp.asarray(np.concatenate([a[order].astype(dtype), np.full(pad, fill, dtype)]))

    return Workload(
        arrival_s=col(arrival, np.float32, np.inf),
        prompt_tokens=col(prompt, np.int32, 1),
        output_tokens=col(output, np.int32, 1),
        pred_tokens=col(pred, np.float32, 1.0),
        pred_u=col(unc, np.float32, 0.0),
        valid=jnp.asarray(np.concatenate([np.ones(n, bool), np.zeros(pad, bool)])),
        priority=None if priority is None else col(fields["priority"], np.float32, np.inf),
    )
