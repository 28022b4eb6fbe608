"""Independent NumPy event-loop reference of the bucketed KV-memory server.

This file implements ``docs/server-semantics.md`` (exact mode) literally, with plain Python
loops over iterations, slots and candidates. It must not import anything from
``models/``: it exists to check the JAX implementation independently.

Interpretations
---------------
Where the spec leaves a choice open, this reference does the following. The JAX side
should be aligned with these.

1. Clock. The clock starts at ``np.float32(0)``; it is kept as ``np.float32`` and every
   iteration adds ``np.float32(dt)``. Arrivals are compared as ``arrival[i] <= t`` in
   float32. An iteration with no prefill and no decode costs 0 s and ``iteration_time``
   is not called. ``iteration_time`` gets Python ints for ``prefill_tokens``,
   ``decode_seqs``, ``decode_ctx_tokens`` and ``kv_chunk_tokens``, and
   ``float(copy_tokens * kv_bytes_per_token)`` for ``copy_bytes``.
2. Slot states. A slot is empty, *running* (holds memory; it may be *stalled* for one
   iteration) or *waiting* (preempted: holds no memory, keeps its generated count).
   "Running" in the spec (batch check, drop rule) means running-or-stalled slots.
3. Idle jump (step 1) only happens when no slot is occupied at all, i.e. a preempted
   slot waiting for re-admission also prevents the jump (it can be resumed now, so time
   must not skip ahead). The jump sets ``t = arrival[head]``.
4. Head and invalid rows. ``head`` is the first valid request not yet admitted or
   dropped; invalid rows are skipped when they are at the head. Candidates are the raw
   indices ``head .. head+A-1`` (clipped to N); an invalid candidate fails the checks and
   stops the walk. (Invalid rows are expected to be trailing padding, where this does
   not matter.) The loop ends when every valid request is finished or dropped, or after
   ``max_iters`` iterations.
5. Prefix rule in step 2 (all of paged, s3, odma). The free tokens of the target pool
   are taken at the start of step 2. Overflowing running slots are visited in slot
   order; each adds its demand (paged: k; s3/odma: prompt+max_len) to a running sum,
   denied ones included, and is granted iff the sum <= that free amount. Memory released
   in step 2 (preempted slots' blocks, migrated slots' old blocks) is returned to the
   pools only after all of step 2, so it is available to step-3 admissions of the same
   iteration but not to other step-2 grants. For s3 (single shared pool) this means a
   migration needs prompt+max_len free tokens while its old block is still held (the
   copy needs both blocks at once).
6. ODMA stall vs preempt. A denied odma slot stalls iff some running slot holds
   large-pool memory after this iteration's migrations were granted; otherwise it is
   preempted. (With the prefix rule, a preemption then implies its prompt+max_len
   exceeds the whole large pool; see 9.)
7. Re-admission of preempted slots (step 3). Only slots preempted in an *earlier*
   iteration are eligible. Eligible waiting slots are tried in slot order with
   head-of-line blocking; the checks are exactly "running + admitted-so-far < max_batch"
   and "reservation <= pool free minus reservations admitted so far this iteration".
   Resumes are not subject to the admission window A nor to max_prefill, and they do not
   count towards the cumulative-prompt cap nor use up the "first admission is exempt"
   allowance of new requests; they do count as admissions for the batch check, the pool
   free tokens, and for "nothing was admitted" in the drop rule. New requests are
   considered only when no slot is waiting after the resume walk (a slot preempted in
   this very iteration is waiting, so no new request is admitted in that iteration).
8. Resume reservations: paged ``ceil((ctx+1)/k)*k`` (normal pool); s3 ``prompt+max_len``
   (shared pool); odma ``prompt+max_len`` (large pool). A resumed slot prefills its
   ``ctx = prompt + generated`` tokens and produces one more token in that iteration;
   it keeps its first admission iteration, first-token time and ``r_admit``.
9. Dropping a waiting slot (extension; the spec only drops the head). If no slot is
   running or stalled, nothing was admitted or resumed this iteration, and the first
   eligible waiting slot failed to resume because its reservation exceeds its pool's
   whole size, that request is dropped (slot freed, counted in ``dropped`` and
   ``unserved``). Otherwise such a slot would block the server forever.
10. Dropping the head (step 3) is checked only when no slot is occupied at the start of
    step 3 and nothing was admitted; it uses the head's reservation under the current
    bounds. At most one request is dropped per iteration.
11. Reservations. s3 bounds and odma quantile bounds are used as they are (no clipping to
    max_len). s3 compares ``np.float32(b_j) >= np.float32(pred)``; odma computes
    ``e = pred * (1 + gamma*u)`` in float32 and compares ``u > tau`` and
    ``np.float32(b_j) >= e`` in float32. Paged admission: ``r = ceil((prompt+1)/k)*k -
    prompt``.
12. Pools. odma large pool size is ``floor(large_share * C)`` computed in float64 Python
    (``math.floor(float(large_share) * C)``); normal is the rest. Other systems: one pool
    of C tokens, the large pool has size 0.
13. ODMA window. The ring has exactly ``window`` entries. Prior: ``prior_lengths`` if
    given (the last ``window`` entries if longer, tiled with ``np.resize`` if shorter),
    else ``np.clip(np.round(pred[:window][valid[:window]]), 1, max_len)``, tiled to
    ``window`` with ``np.resize``; values are rounded and clipped to 0..max_len as ints.
    The write pointer starts at index 0 (position 0 is the oldest) and advances by one
    (mod ``window``) per completion. Completions enter in slot order within an
    iteration; the realised length is ``output[i]``. Quantile:
    ``hist = bincount(ring, minlength=max_len+1)``; ``cdf =
    np.cumsum(hist).astype(np.float32) / np.float32(window)``; ``b_j = sum(cdf <
    np.float32(p_j))``. The completion counter is reset only when a refresh happens.
14. Completion. A slot finishes at the end of the iteration in which its generated count
    reaches ``output``; ``finish_s`` is the clock after step 5 of that iteration, and
    ``first_token_s`` the clock after step 5 of its first admission iteration.
15. Metrics. ``reserved_final`` = the largest reservation (prompt included) a request held
    (0 if never admitted); ``r_admit`` = output reservation at first admission (-1 if
    never admitted); ``first_token_s``/``finish_s`` are float32 arrays, NaN when absent.
    ``kv_utilization`` and ``accuracy`` are NaN with no completed request. ``tps`` =
    completed output tokens / (float(clock) - float(first valid arrival)), 0.0 if that
    span is <= 0. ``peak_kv_tokens`` and ``max_pool_use_ratio`` are sampled after step
    3 of each iteration (all pools summed; ratio over pools of size > 0, 0.0 if none).
    ``stalls`` counts stalled slot-iterations; ``preemptions`` counts preemption events;
    ``migrations`` counts granted migrations; ``unserved`` = valid requests not completed.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["simulate_reference", "odma_quantiles", "initial_ring"]

NORMAL, LARGE = 0, 1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def odma_quantiles(ring, levels, max_len: int) -> list[int]:
    """b_j = min{x >= 0 : F(x) >= p_j} over the ring's empirical CDF (Interpretation 13)."""
    ring = np.asarray(ring, dtype=np.int64)
    hist = np.bincount(ring, minlength=max_len + 1)
    cdf = np.cumsum(hist).astype(np.float32) / np.float32(ring.shape[0])
    return [int(np.sum(cdf < np.float32(p))) for p in levels]


def initial_ring(pred, valid, *, max_len: int, window: int, prior_lengths=None) -> np.ndarray:
    """The starting contents of the ODMA window ring (Interpretation 13)."""
    if prior_lengths is None:
        pred = np.asarray(pred, dtype=np.float32)
        valid = np.asarray(valid, dtype=bool)
        sample = np.clip(np.round(pred[:window][valid[:window]]), 1, max_len)
    else:
        sample = np.asarray(prior_lengths, dtype=np.float64).reshape(-1)
        if sample.shape[0] > window:
            sample = sample[-window:]
    if sample.shape[0] == 0:
        sample = np.array([max_len])
    sample = np.clip(np.round(sample), 0, max_len).astype(np.int64)
    return np.resize(sample, window).astype(np.int64)


class _Slot:
    """One occupied slot."""

    def __init__(self, req: int):
        self.req = req
        self.state = "run"  # "run" (holds memory) or "wait" (preempted)
        self.gen = 0  # generated tokens
        self.reserved = 0  # reserved KV tokens (prompt included) while running
        self.pool = NORMAL
        self.preempted_iter = -1
        self.resume_reserved = 0
        self.resume_pool = NORMAL


def simulate_reference(arrival, prompt, output, pred, u, valid, *, kind, params, n_slots,
                       capacity, max_batch, max_prefill, admit_window, max_len,
                       iteration_time, kv_bytes_per_token, contiguous_chunk_tokens,
                       prior_lengths=None, window=10000, refresh_every=1000,
                       refresh_check=16, max_iters=100000) -> dict:
    if kind not in ("static", "paged", "s3", "odma"):
        raise ValueError(f"unknown kind {kind!r}")
    arrival = np.asarray(arrival, dtype=np.float32)
    prompt = np.asarray(prompt).astype(np.int64)
    output = np.asarray(output).astype(np.int64)
    pred = np.asarray(pred, dtype=np.float32)
    u = np.asarray(u, dtype=np.float32)
    valid = np.asarray(valid, dtype=bool)
    n = arrival.shape[0]
    S = int(n_slots)
    C = int(capacity)
    max_len = int(max_len)

    # ---- policy parameters and pools -------------------------------------------------
    k = int(params["block_size"]) if kind == "paged" else None
    s3_bounds = [int(b) for b in params["bounds"]] if kind == "s3" else None
    if kind == "odma":
        levels = [float(p) for p in params["levels"]]
        gamma = np.float32(params["gamma"])
        tau = np.float32(params["tau"])
        large_size = int(math.floor(float(params["large_share"]) * C))
        pool_size = [C - large_size, large_size]
        ring = initial_ring(pred, valid, max_len=max_len, window=int(window),
                            prior_lengths=prior_lengths)
        ring_ptr = 0
        odma_bounds = odma_quantiles(ring, levels, max_len)
        since_refresh = 0
    else:
        pool_size = [C, 0]
    used = [0, 0]
    kv_chunk = k if kind == "paged" else int(contiguous_chunk_tokens)
    # s3 migrates into its single (normal) pool, odma into the large pool.
    target_pool = LARGE if kind == "odma" else NORMAL

    def reserve(i: int) -> tuple[int, int]:
        """Output reservation r and pool for a new admission of request i."""
        if kind == "static":
            return max_len, NORMAL
        if kind == "paged":
            return _ceil_div(int(prompt[i]) + 1, k) * k - int(prompt[i]), NORMAL
        if kind == "s3":
            fitting = [b for b in s3_bounds if np.float32(b) >= pred[i]]
            return (min(fitting) if fitting else max_len), NORMAL
        # odma
        if u[i] > tau:
            return max_len, LARGE
        e = np.float32(pred[i] * (np.float32(1.0) + gamma * u[i]))
        fitting = [b for b in odma_bounds if np.float32(b) >= e]
        if fitting:
            return min(fitting), NORMAL
        return max_len, LARGE

    # ---- per-request outputs ---------------------------------------------------------
    admit_iter = np.full(n, -1, dtype=np.int64)
    finish_iter = np.full(n, -1, dtype=np.int64)
    first_token_s = np.full(n, np.nan, dtype=np.float32)
    finish_s = np.full(n, np.nan, dtype=np.float32)
    reserved_final = np.zeros(n, dtype=np.int64)
    r_admit = np.full(n, -1, dtype=np.int64)

    migrations = preemptions = stalls = dropped = 0
    peak_kv = 0
    max_ratio = 0.0

    slots: list[_Slot | None] = [None] * S
    t = np.float32(0.0)
    head = 0
    remaining = int(valid.sum())  # valid requests neither finished nor dropped
    it = 0

    def set_reserved(sl: _Slot, amount: int, pool: int) -> None:
        sl.reserved = amount
        sl.pool = pool
        used[pool] += amount
        reserved_final[sl.req] = max(reserved_final[sl.req], amount)

    while it < max_iters and remaining > 0:
        while head < n and not valid[head]:
            head += 1

        # ---- 1. idle jump -----------------------------------------------------------
        occupied = any(sl is not None for sl in slots)
        if not occupied and head < n and arrival[head] > t:
            t = arrival[head]

        # ---- 2. overflow ------------------------------------------------------------
        stalled: set[int] = set()
        copy_tokens = 0
        releases: list[tuple[int, int]] = []  # (pool, tokens) returned after step 2
        overflowing = [s for s in range(S)
                       if slots[s] is not None and slots[s].state == "run"
                       and int(prompt[slots[s].req]) + slots[s].gen + 1 > slots[s].reserved]
        if kind == "paged":
            free = pool_size[NORMAL] - used[NORMAL]
            demand = 0
            for s in overflowing:
                sl = slots[s]
                demand += k
                if demand <= free:
                    used[NORMAL] += k
                    sl.reserved += k
                    reserved_final[sl.req] = max(reserved_final[sl.req], sl.reserved)
                else:
                    ctx = int(prompt[sl.req]) + sl.gen
                    releases.append((sl.pool, sl.reserved))
                    sl.state = "wait"
                    sl.reserved = 0
                    sl.preempted_iter = it
                    sl.resume_reserved = _ceil_div(ctx + 1, k) * k
                    sl.resume_pool = NORMAL
                    preemptions += 1
        elif kind in ("s3", "odma"):
            free = pool_size[target_pool] - used[target_pool]
            demand = 0
            denied = []
            for s in overflowing:
                sl = slots[s]
                need = int(prompt[sl.req]) + max_len
                demand += need
                if demand <= free:
                    ctx = int(prompt[sl.req]) + sl.gen
                    releases.append((sl.pool, sl.reserved))
                    set_reserved(sl, need, target_pool)
                    copy_tokens += ctx
                    migrations += 1
                else:
                    denied.append(s)
            holds_large = any(sl is not None and sl.state == "run" and sl.pool == LARGE
                              for sl in slots)
            for s in denied:
                sl = slots[s]
                if kind == "odma" and holds_large:
                    stalled.add(s)
                    stalls += 1
                else:
                    releases.append((sl.pool, sl.reserved))
                    sl.state = "wait"
                    sl.reserved = 0
                    sl.preempted_iter = it
                    sl.resume_reserved = int(prompt[sl.req]) + max_len
                    sl.resume_pool = target_pool
                    preemptions += 1
        for pool, amount in releases:
            used[pool] -= amount

        # ---- 3. admission -----------------------------------------------------------
        n_running = sum(1 for sl in slots if sl is not None and sl.state == "run")
        n_admitted = 0
        resumed: list[int] = []
        resumed_ctx = 0
        blocked_wait = None
        for s in range(S):
            sl = slots[s]
            if sl is None or sl.state != "wait" or sl.preempted_iter >= it:
                continue
            P = sl.resume_pool
            if (n_running + n_admitted < max_batch
                    and sl.resume_reserved <= pool_size[P] - used[P]):
                sl.state = "run"
                set_reserved(sl, sl.resume_reserved, P)
                resumed.append(s)
                resumed_ctx += int(prompt[sl.req]) + sl.gen
                n_admitted += 1
            else:
                blocked_wait = s
                break
        any_waiting = any(sl is not None and sl.state == "wait" for sl in slots)

        new_slots: list[int] = []
        new_prefill = 0
        if not any_waiting:
            free_slots = [s for s in range(S) if slots[s] is None]
            for i in range(head, min(head + int(admit_window), n)):
                if not valid[i]:
                    break
                if not (arrival[i] <= t):
                    break
                if len(new_slots) >= len(free_slots):
                    break
                if not (n_running + n_admitted < max_batch):
                    break
                if new_slots and new_prefill + int(prompt[i]) > max_prefill:
                    break
                r, P = reserve(i)
                need = int(prompt[i]) + r
                if need > pool_size[P] - used[P]:
                    break
                s = free_slots[len(new_slots)]
                sl = _Slot(i)
                slots[s] = sl
                set_reserved(sl, need, P)
                admit_iter[i] = it
                r_admit[i] = r
                new_slots.append(s)
                new_prefill += int(prompt[i])
                n_admitted += 1
            head += len(new_slots)

        # drop rules (Interpretations 9 and 10)
        if n_running == 0 and n_admitted == 0:
            if blocked_wait is not None:
                sl = slots[blocked_wait]
                if sl.resume_reserved > pool_size[sl.resume_pool]:
                    slots[blocked_wait] = None
                    dropped += 1
                    remaining -= 1
            elif not any_waiting:
                while head < n and not valid[head]:
                    head += 1
                if head < n and arrival[head] <= t:
                    r, P = reserve(head)
                    if int(prompt[head]) + r > pool_size[P]:
                        dropped += 1
                        remaining -= 1
                        head += 1

        peak_kv = max(peak_kv, used[NORMAL] + used[LARGE])
        for p in (NORMAL, LARGE):
            if pool_size[p] > 0:
                max_ratio = max(max_ratio, used[p] / pool_size[p])

        # ---- 4. work ----------------------------------------------------------------
        prefill_tokens = new_prefill + resumed_ctx
        decode_seqs = 0
        decode_ctx = 0
        for s in range(S):
            sl = slots[s]
            if sl is None or sl.state != "run":
                continue
            if s in new_slots:
                sl.gen = 1
            elif s in resumed:
                sl.gen += 1
            elif s in stalled:
                pass
            else:
                decode_seqs += 1
                decode_ctx += int(prompt[sl.req]) + sl.gen
                sl.gen += 1

        # ---- 5. clock ---------------------------------------------------------------
        if prefill_tokens > 0 or decode_seqs > 0:
            dt = iteration_time(int(prefill_tokens), int(decode_seqs), int(decode_ctx),
                                int(kv_chunk), float(copy_tokens * kv_bytes_per_token))
            t = np.float32(t + np.float32(dt))
        for s in new_slots:
            first_token_s[slots[s].req] = t

        # ---- 6. completion ----------------------------------------------------------
        for s in range(S):
            sl = slots[s]
            if sl is None or sl.state != "run" or s in stalled:
                continue
            i = sl.req
            if sl.gen == int(output[i]):
                finish_iter[i] = it
                finish_s[i] = t
                used[sl.pool] -= sl.reserved
                slots[s] = None
                remaining -= 1
                if kind == "odma":
                    ring[ring_ptr] = min(max(int(output[i]), 0), max_len)
                    ring_ptr = (ring_ptr + 1) % ring.shape[0]
                    since_refresh += 1

        # ---- 7. odma refresh --------------------------------------------------------
        if kind == "odma" and (it + 1) % int(refresh_check) == 0:
            if since_refresh >= int(refresh_every):
                odma_bounds = odma_quantiles(ring, levels, max_len)
                since_refresh = 0

        it += 1

    # ---- metrics ----------------------------------------------------------------------
    done = finish_iter >= 0
    if done.any():
        kv_util = float((prompt[done] + output[done]).sum() / reserved_final[done].sum())
        accuracy = float(np.mean(output[done] <= r_admit[done]))
    else:
        kv_util = float("nan")
        accuracy = float("nan")
    first_arrival = float(arrival[valid].min()) if valid.any() else 0.0
    span = float(t) - first_arrival
    tps = float(output[done].sum()) / span if span > 0 else 0.0
    return {
        "admit_iter": admit_iter,
        "finish_iter": finish_iter,
        "first_token_s": first_token_s,
        "finish_s": finish_s,
        "reserved_final": reserved_final,
        "r_admit": r_admit,
        "migrations": migrations,
        "preemptions": preemptions,
        "stalls": stalls,
        "dropped": dropped,
        "unserved": int((valid & ~done).sum()),
        "kv_utilization": kv_util,
        "tps": tps,
        "accuracy": accuracy,
        "peak_kv_tokens": int(peak_kv),
        "clock": float(t),
        "iterations": it,
        "max_pool_use_ratio": float(max_ratio),
    }
