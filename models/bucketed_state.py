"""State of the bucketed server (``models.bucketed``): the scan carry and what it emits.

Also the constants every part of the bucketed simulator shares: the system kinds, which
of them preempt, and the relaxation scale of probability comparisons.
"""

from __future__ import annotations

import jax
from flax import struct

from models.server import Acc, Slots

__all__ = [
    "KINDS",
    "PREEMPTING",
    "PROB_SCALE",
    "Finished",
    "Record",
    "SimState",
    "Window",
]

KINDS = ("static", "paged", "s3", "odma")
PREEMPTING = ("paged", "s3", "odma")
# Relaxation scales: a temperature T smooths token comparisons over T * token_scale tokens
# (ServerConfig) and probability comparisons (u vs tau, quantile levels vs the window's
# CDF) over T * PROB_SCALE.
PROB_SCALE = 0.05


@struct.dataclass
class Window:
    """ODMA's sliding window of realised lengths and the current bucket bounds."""

    bounds: jax.Array  # [B-1] float32 tokens
    ring: jax.Array    # [W] int32 last W realised lengths (starts full with a prior)
    ptr: jax.Array     # [] int32 next ring position to overwrite
    hist: jax.Array    # [max_len + 1] float32 counts of the ring's lengths
    since: jax.Array   # [] int32 completions since the last refresh


@struct.dataclass
class Record:
    """Per-request outcomes (only kept for single-config evaluations)."""

    admit_iter: jax.Array   # [N] int32, -1 never admitted
    finish_iter: jax.Array  # [N] int32, -1 not finished
    first_s: jax.Array      # [N] float32 first-token time
    finish_s: jax.Array     # [N] float32 finish time
    reserved: jax.Array     # [N] float32 largest reservation (tokens, with prompt)
    r_admit: jax.Array      # [N] float32 output reservation at first admission


@struct.dataclass
class Finished:
    """One iteration's completions per slot (stacked per block by the scan)."""

    length: jax.Array  # [S] int32 realised length (<= max_len) entering the window; 0: none
    ttft: jax.Array    # [S] float32 seconds
    tpot: jax.Array    # [S] float32 seconds
    bits: jax.Array    # [ceil(S/32)] uint32 the completion mask, 32 slots per word


@struct.dataclass
class SimState:
    slots: Slots
    head: jax.Array    # [] int32 first request not yet admitted
    clock: jax.Array   # [] float32 seconds
    it: jax.Array      # [] int32 iteration counter
    win: Window
    acc: Acc
    rec: Record | None
