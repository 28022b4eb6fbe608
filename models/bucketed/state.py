"""State of the bucketed server: the scan carry, its bucket fields and the static options.

The shared slot table, accumulators and record (``models.server``) carry, in addition,
what bucketed allocation tracks: which pool a block lives in, the reservation at first
admission and the largest one held, bucket overflows and migrations (``BucketRecord``
subclasses the shared record; slots and accumulators repeat the shared fields to keep
the scan carry's field order, see ``BucketSlots``).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
from flax import struct

from models.server import Record, ServerConfig

__all__ = ["BucketAcc", "BucketOptions", "BucketRecord", "BucketSlots", "PROB_SCALE",
           "SimState", "Window"]

# Relaxation scales: a temperature T smooths token comparisons over T * token_scale tokens
# (ServerConfig) and probability comparisons (u vs tau, quantile levels vs the window's
# CDF) over T * PROB_SCALE.
PROB_SCALE = 0.05


@dataclass(frozen=True)
class BucketOptions:
    """Static options of the bucketed family: ODMA's sliding window of ``window``
    realised lengths and its refresh after ``refresh_every`` completions (checked at the
    end of every block). Defaults: the ODMA paper's 10,000 and 1,000. ``large_borrow``
    (systems with a large pool): large-pool requests may also use free normal-pool
    memory, so that a request waiting only for the large pool does not block the FCFS
    queue behind it (the papers leave the pool split open; default on)."""

    window: int = 10000
    refresh_every: int = 1000
    large_borrow: bool = True

    def __post_init__(self):
        if int(self.window) < 1 or int(self.refresh_every) < 1:
            raise ValueError(f"bucketed options: window and refresh_every must be >= 1, "
                             f"got {self.window}, {self.refresh_every}")


@struct.dataclass
class BucketSlots:
    """The shared slot table (:class:`models.server.Slots`, same fields) with what
    bucketed allocation tracks; the fields keep the order XLA's scan carry was tuned
    with (a subclass would move the bucket fields last: measurably slower sweeps)."""

    req: jax.Array        # [S] int32 request index, -1 when empty
    status: jax.Array     # [S] int32 0 empty, 1 running, 2 preempted (waiting)
    prompt: jax.Array     # [S] int32
    output: jax.Array     # [S] int32 realised output length
    gen: jax.Array        # [S] int32 tokens generated so far
    reserved: jax.Array   # [S] float32 KV tokens held (prompt + output reservation)
    peak_res: jax.Array   # [S] float32 largest reservation held so far
    r_admit: jax.Array    # [S] float32 output reservation at first admission
    large: jax.Array      # [S] float32 1 if the block lives in the large pool
    weight: jax.Array     # [S] float32 admission weight (1 forward; soft gradient)
    arrival: jax.Array    # [S] float32
    t_admit: jax.Array    # [S] float32 clock when first admitted
    t_first: jax.Array    # [S] float32 first-token time
    todo: jax.Array       # [S] int32 prefill tokens still to compute (chunked prefill)
    order: jax.Array      # [S] int32 position in vLLM's running or waiting queue (dense)


@struct.dataclass
class BucketAcc:
    """The shared accumulators (:class:`models.server.Acc`, same fields) with the
    bucket counters, in the carry's original order (see :class:`BucketSlots`)."""

    completed: jax.Array     # [] requests finished
    tokens: jax.Array        # [] output tokens of finished requests
    actual_kv: jax.Array     # [] sum of prompt + output of finished requests
    reserved_kv: jax.Array   # [] sum of finished requests' largest reservation
    fit: jax.Array           # [] finished requests whose output <= r_admit
    migrations: jax.Array    # [] migrations performed
    overflows: jax.Array     # [] (soft) admitted requests whose output outgrows their bucket
    preemptions: jax.Array   # []
    stalls: jax.Array        # [] slot-iterations without progress
    dropped: jax.Array       # []
    queue_s: jax.Array       # [] summed queueing delay (admission - arrival)
    ttft_ok: jax.Array       # [] (soft) finished requests within the TTFT SLO
    tpot_ok: jax.Array       # [] (soft) within the TPOT SLO
    slo_ok: jax.Array        # [] (soft) within both
    ttft_hist: jax.Array     # [141] latency histogram counts
    tpot_hist: jax.Array     # [141]
    peak_kv: jax.Array       # [] largest reserved KV tokens during an iteration
    max_use: jax.Array       # [] largest used/size over pools and iterations
    busy_s: jax.Array        # [] summed iteration time
    iters: jax.Array         # [] iterations with work
    res_token_s: jax.Array   # [] KV tokens held x seconds (time-weighted occupancy)
    used_token_s: jax.Array  # [] KV tokens in the cache (computed context) x seconds


@struct.dataclass
class BucketRecord(Record):
    reserved: jax.Array     # [N] float32 largest reservation (tokens, with prompt)
    r_admit: jax.Array      # [N] float32 output reservation at first admission


@struct.dataclass
class Window:
    """ODMA's sliding window of realised lengths and the current bucket bounds."""

    bounds: jax.Array  # [B-1] float32 tokens
    ring: jax.Array    # [W] int32 last W realised lengths (starts full with a prior)
    ptr: jax.Array     # [] int32 next ring position to overwrite
    hist: jax.Array    # [max_len + 1] float32 counts of the ring's lengths
    since: jax.Array   # [] int32 completions since the last refresh


@struct.dataclass
class SimState:
    slots: BucketSlots
    head: jax.Array    # [] int32 first request not yet admitted
    clock: jax.Array   # [] float32 seconds
    it: jax.Array      # [] int32 iteration counter
    win: Window
    acc: BucketAcc
    rec: BucketRecord | None
    # an engine system's server config (its parameters set capacity and batch limits;
    # models.bucketed.engine), None where the scenario's applies
    cfg: ServerConfig | None = None
    # with per-request priorities: [W] bool, request head + i was admitted or dropped
    # (models.bucketed.admission.Queue); None: first-come-first-served
    taken: jax.Array | None = None
