"""Hand-worked scenarios for the NumPy reference of the bucketed server.

Every expected value below is worked out by hand in the comments (see
docs/server-semantics.md and the Interpretations list in tests/reference_bucketed.py).
Unless a test says otherwise, one iteration with any work costs exactly 1.0 s (a
power of two, so float32 clock arithmetic is exact) and an iteration with no work 0 s.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from reference_bucketed import initial_ring, odma_quantiles, simulate_reference  # noqa: E402


class Recorder:
    """iteration_time = base + per_seq * decode_seqs; records every call."""

    def __init__(self, base=1.0, per_seq=0.0):
        self.base, self.per_seq = base, per_seq
        self.calls = []

    def __call__(self, prefill, decode_seqs, decode_ctx, kv_chunk, copy_bytes):
        self.calls.append((prefill, decode_seqs, decode_ctx, kv_chunk, copy_bytes))
        return self.base + self.per_seq * decode_seqs


def run(kind, prompt, output, *, arrival=None, pred=None, u=None, valid=None, params=None,
        n_slots=4, capacity=100, max_batch=None, max_prefill=10_000, admit_window=None,
        max_len=10, timer=None, kv_bytes_per_token=2, chunk=1 << 20, **kw):
    n = len(prompt)
    arrival = np.zeros(n, np.float32) if arrival is None else np.asarray(arrival, np.float32)
    pred = np.asarray(output, np.float32) if pred is None else np.asarray(pred, np.float32)
    u = np.zeros(n, np.float32) if u is None else np.asarray(u, np.float32)
    valid = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    timer = Recorder() if timer is None else timer
    out = simulate_reference(
        arrival, np.asarray(prompt), np.asarray(output), pred, u, valid,
        kind=kind, params={} if params is None else params, n_slots=n_slots,
        capacity=capacity, max_batch=n_slots if max_batch is None else max_batch,
        max_prefill=max_prefill, admit_window=n_slots if admit_window is None else admit_window,
        max_len=max_len, iteration_time=timer, kv_bytes_per_token=kv_bytes_per_token,
        contiguous_chunk_tokens=chunk, **kw)
    return out, timer


def odma_params(b=4, **extra):
    # prior ring of four lengths == b, level 0.5 -> the single bound is exactly b.
    p = {"levels": [0.5], "gamma": 0.0, "tau": 0.5, "large_share": 0.5}
    p.update(extra)
    return p, {"prior_lengths": [b] * 4, "window": 4, "refresh_every": 10**9}


# --------------------------------------------------------------------------------------
def test_static_reservation_blocks_until_completion():
    # C=100, max_len=40: static reserves prompt+40 = 50 per request -> only two fit.
    # iter0 t=0: admit r0 (slot0), r1 (slot1): used 100; r2 needs 50 > 0 -> stop.
    #   prefill 20, no decode; dt = 0.5 -> t=0.5. first tokens: gen 1, 1.
    # iter1: decode r0, r1 (ctx 11 + 11 = 22), dt = 0.5 + 0.25*2 = 1.0 -> t=1.5;
    #   r1 reaches gen 2 == output -> finishes (iter 1, 1.5); frees 50.
    # iter2: admit r2 into slot1 (lowest free); r0 decodes (ctx 12); prefill 10;
    #   dt = 0.75 -> t=2.25; r0 gen 3 == output -> finishes (iter 2). r2 first token 2.25.
    # iter3: r2 decodes (ctx 11), dt = 0.75 -> t=3.0; r2 finishes (iter 3).
    timer = Recorder(base=0.5, per_seq=0.25)
    out, _ = run("static", [10, 10, 10], [3, 2, 2], capacity=100, max_len=40,
                 timer=timer, chunk=4096)
    assert out["admit_iter"].tolist() == [0, 0, 2]
    assert out["finish_iter"].tolist() == [2, 1, 3]
    assert out["first_token_s"].tolist() == [0.5, 0.5, 2.25]
    assert out["finish_s"].tolist() == [2.25, 1.5, 3.0]
    assert timer.calls == [(20, 0, 0, 4096, 0.0), (0, 2, 22, 4096, 0.0),
                           (10, 1, 12, 4096, 0.0), (0, 1, 11, 4096, 0.0)]
    assert out["iterations"] == 4 and out["clock"] == 3.0
    assert out["reserved_final"].tolist() == [50, 50, 50]
    assert out["r_admit"].tolist() == [40, 40, 40]
    assert out["peak_kv_tokens"] == 100 and out["max_pool_use_ratio"] == 1.0
    assert out["kv_utilization"] == pytest.approx(37 / 150)
    assert out["tps"] == pytest.approx(7 / 3.0)
    assert out["accuracy"] == 1.0
    assert (out["migrations"], out["preemptions"], out["stalls"], out["dropped"],
            out["unserved"]) == (0, 0, 0, 0, 0)


def test_fcfs_head_of_line_blocking():
    # static, C=100, max_len=20. r0: prompt 50 (res 70), r1: prompt 50 (res 70),
    # r2: prompt 5 (res 25). r2 would fit next to r0 (95) but r1 blocks the line.
    # iter0: admit r0; r1 70 > 30 -> stop. iter1: r0 gen 2. iter2: r0 gen 3 -> done.
    # iter3: admit r1 (70) and r2 (25, total 95); both output 1 -> finish at iter3.
    out, timer = run("static", [50, 50, 5], [3, 1, 1], capacity=100, max_len=20)
    assert out["admit_iter"].tolist() == [0, 3, 3]
    assert out["finish_iter"].tolist() == [2, 3, 3]
    assert timer.calls[3][0] == 55
    assert out["peak_kv_tokens"] == 95


def test_paged_growth_preemption_and_resume():
    # paged k=4, C=20. Two requests prompt 2, output 8; first block ceil(3/4)=1 -> 4 tok,
    # r_admit = 4-2 = 2.
    # iter0: admit both (used 8), prefill 4; gen 1 (ctx 3).
    # iter1: ctx+1 = 4 <= 4, decode both -> gen 2 (ctx 4).
    # iter2: ctx+1 = 5 > 4: both need a block, free 12 -> both granted (used 16); gen 3.
    # iter3..5: gen 4, 5, 6 (ctx 8 = reserved).
    # iter6: both need a block, free 4: slot0 granted (12), slot1 denied -> preempted,
    #   releases 8 (used 12); slot1 keeps gen 6, resume reservation ceil(9/4)*4 = 12.
    #   Preempted this iteration -> not resumed this iteration. slot0 gen 7.
    # iter7: slot1 resume needs 12, free 8 -> blocked. slot0 gen 8 == output -> done (12 freed).
    # iter8: slot1 resumes (12), recomputes ctx = 2+6 = 8 as prefill, gen 7.
    # iter9: slot1 ctx+1 = 10 <= 12, gen 8 -> done.
    out, timer = run("paged", [2, 2], [8, 8], params={"block_size": 4}, capacity=20,
                     n_slots=2, max_len=16)
    assert out["admit_iter"].tolist() == [0, 0]
    assert out["finish_iter"].tolist() == [7, 9]
    assert out["preemptions"] == 1
    assert out["r_admit"].tolist() == [2, 2]
    assert out["reserved_final"].tolist() == [12, 12]
    assert out["peak_kv_tokens"] == 16
    assert out["max_pool_use_ratio"] == pytest.approx(0.8)
    assert out["kv_utilization"] == pytest.approx(20 / 24)
    assert out["accuracy"] == 0.0
    assert [c[3] for c in timer.calls] == [4] * 10  # kv_chunk_tokens = k
    assert timer.calls[0] == (4, 0, 0, 4, 0.0)
    assert timer.calls[6] == (0, 1, 8, 4, 0.0)  # only slot0 decodes (ctx 8)
    assert timer.calls[7] == (0, 1, 9, 4, 0.0)  # slot1 still waiting
    assert timer.calls[8] == (8, 0, 0, 4, 0.0)  # recompute of ctx 8
    assert timer.calls[9] == (0, 1, 9, 4, 0.0)
    assert out["first_token_s"].tolist() == [1.0, 1.0]
    assert out["finish_s"].tolist() == [8.0, 10.0]


def test_odma_routing():
    # bound b_1 = 4 (prior all 4), gamma 1, tau 0.6, max_len 10, C 100, large 50.
    # r0: u 0.9 > tau -> large, r = 10.
    # r1: pred 3, u 0.1 -> e = 3.3 <= 4 -> normal, r = 4.
    # r2: pred 3, u 0.5 -> e = 4.5 > 4 -> large, r = 10.
    # r3: pred 8, u 0 -> e = 8 -> large, r = 10.
    # r4: pred 4, u 0 -> e = 4 <= 4 -> normal, r = 4.
    params, kw = odma_params(gamma=1.0, tau=0.6)
    out, _ = run("odma", [2, 2, 2, 2, 2], [1, 1, 1, 1, 1], pred=[3, 3, 3, 8, 4],
                 u=[0.9, 0.1, 0.5, 0.0, 0.0], params=params, n_slots=5, **kw)
    assert out["r_admit"].tolist() == [10, 4, 10, 10, 4]
    # normal pool 6 + 6, large pool 3*12 = 36 out of 50.
    assert out["peak_kv_tokens"] == 48
    assert out["max_pool_use_ratio"] == pytest.approx(36 / 50)
    assert out["finish_iter"].tolist() == [0] * 5


def test_odma_migration_and_stall():
    # C 40, large_share 0.3 -> large pool floor(12.0) = 12, normal 28. bound 4, max_len 10.
    # r0, r1: prompt 2, pred 3 -> r 4, normal, 6 tokens each; output 6 (under-predicted).
    # iter0: both admitted, gen 1. iter1..3: gen 4 (ctx 6 = reserved).
    # iter4: both overflow. Large free 12: slot0 demand 12 <= 12 -> migrates (copy 6 tok
    #   * 2 B = 12 B); slot1 cumulative 24 > 12 -> denied; slot0 holds large -> stall.
    #   slot0 decodes (ctx 6) -> gen 5.
    # iter5: slot1 retries, large free 0 -> stall again. slot0 gen 6 -> done, frees large.
    # iter6: slot1 migrates (copy 12 B), gen 5. iter7: gen 6 -> done.
    params, kw = odma_params(large_share=0.3)
    out, timer = run("odma", [2, 2], [6, 6], pred=[3, 3], params=params, capacity=40,
                     n_slots=2, chunk=4096, **kw)
    assert out["finish_iter"].tolist() == [5, 7]
    assert out["finish_s"].tolist() == [6.0, 8.0]
    assert (out["migrations"], out["stalls"], out["preemptions"]) == (2, 2, 0)
    assert out["reserved_final"].tolist() == [12, 12]
    assert out["r_admit"].tolist() == [4, 4]
    assert out["accuracy"] == 0.0
    assert timer.calls[4] == (0, 1, 6, 4096, 12.0)
    assert timer.calls[5] == (0, 1, 7, 4096, 0.0)
    assert timer.calls[6] == (0, 1, 6, 4096, 12.0)
    # iter4 after step 2: slot0 12 (large) + slot1 6 (normal) = 18; large pool full.
    assert out["peak_kv_tokens"] == 18
    assert out["max_pool_use_ratio"] == 1.0
    assert out["kv_utilization"] == pytest.approx(16 / 24)


def test_odma_preempt_when_large_pool_cannot_help_then_drop():
    # C 40, large_share 0.25 -> large 10 < prompt+max_len = 12.
    # r0: r 4 (normal), output 6 -> overflows at iter4; demand 12 > 10 and no slot holds
    # large memory -> preempted (not stalled). iter5: resume needs 12 in the large pool
    # > its whole size, nothing runs -> dropped (Interpretation 9). 6 iterations.
    params, kw = odma_params(large_share=0.25)
    out, _ = run("odma", [2], [6], pred=[3], params=params, capacity=40, n_slots=2, **kw)
    assert (out["preemptions"], out["stalls"], out["dropped"], out["unserved"]) == (1, 0, 1, 1)
    assert out["admit_iter"].tolist() == [0] and out["finish_iter"].tolist() == [-1]
    assert out["iterations"] == 6
    assert math.isnan(out["finish_s"][0]) and math.isnan(out["kv_utilization"])


def test_s3_preemption_on_overflow():
    # s3 bounds [4], max_len 10, C 20.
    # r0: prompt 2, pred 3 -> r 4 (6 tok), output 6. r1: pred 9 -> r = b_L = 10 (12 tok),
    # output 8. iter0: both admitted (18 used).
    # iter1..3: gen 4 for both (r0 ctx 6 = reserved).
    # iter4: r0 overflows, needs 12 in the shared pool, free 2 -> preempted, frees 6.
    #   r1 gen 5. iter5..6: r0 resume needs 12, free 8 -> blocked; r1 gen 6, 7.
    # iter7: still blocked; r1 gen 8 -> done, frees 12.
    # iter8: r0 resumes (12), recomputes ctx 6 -> gen 5. iter9: gen 6 -> done.
    out, timer = run("s3", [2, 2], [6, 8], pred=[3, 9], params={"bounds": [4]},
                     capacity=20, n_slots=2)
    assert out["r_admit"].tolist() == [4, 10]
    assert out["finish_iter"].tolist() == [9, 7]
    assert (out["preemptions"], out["migrations"], out["stalls"]) == (1, 0, 0)
    assert out["reserved_final"].tolist() == [12, 12]
    assert timer.calls[8][:3] == (6, 0, 0)
    assert out["accuracy"] == 0.5


def test_s3_migration_in_shared_pool():
    # Same as above with C 30: at iter4 free = 30-18 = 12 >= 12 -> migration granted
    # (old block still held during the check), copy 6 tokens * 2 B; old 6 released.
    # r0 then runs to gen 6 at iter5; r1 gen 8 at iter7.
    out, timer = run("s3", [2, 2], [6, 8], pred=[3, 9], params={"bounds": [4]},
                     capacity=30, n_slots=2)
    assert out["finish_iter"].tolist() == [5, 7]
    assert (out["preemptions"], out["migrations"]) == (0, 1)
    assert timer.calls[4][4] == 12.0
    assert out["peak_kv_tokens"] == 24  # after step 2 of iter4: 12 + 12


def test_max_prefill_and_max_batch_caps():
    # static, max_len 5, C 1000, 4 slots, max_batch 3, max_prefill 10, outputs 2.
    # prompts [12, 4, 2, 3, 1].
    # iter0: r0 (12 > 10 but the first admission is exempt); r1: 12+4 > 10 -> stop.
    # iter1: r1 (4), r2 (4+2=6 <= 10); r3: running 1 + admitted 2 = 3, not < 3 -> stop.
    #   r0 gen 2 -> done.
    # iter2: running 2: r3 admitted (2+0 < 3); r4: 2+1 not < 3 -> stop. r1, r2 done.
    # iter3: running 1: r4 admitted; r3 done. iter4: r4 done.
    out, timer = run("static", [12, 4, 2, 3, 1], [2] * 5, capacity=1000, max_len=5,
                     n_slots=4, max_batch=3, max_prefill=10)
    assert out["admit_iter"].tolist() == [0, 1, 1, 2, 3]
    assert out["finish_iter"].tolist() == [1, 2, 2, 3, 4]
    assert [c[0] for c in timer.calls] == [12, 6, 3, 1, 0]


def test_admit_window_cap():
    # A = 1: one admission per iteration even though everything fits.
    out, _ = run("static", [1, 1, 1], [3, 3, 3], capacity=1000, admit_window=1)
    assert out["admit_iter"].tolist() == [0, 1, 2]
    assert out["finish_iter"].tolist() == [2, 3, 4]


def test_free_slot_cap():
    # 2 slots: r2 waits for a slot even though memory and batch would allow it.
    out, _ = run("static", [1, 1, 1], [2, 2, 1], capacity=1000, n_slots=2)
    assert out["admit_iter"].tolist() == [0, 0, 2]
    assert out["finish_iter"].tolist() == [1, 1, 2]


def test_idle_jump():
    # r0 arrives at 5, r1 at 20; 1 s per iteration.
    # iter0: t 0 -> jump to 5; admit r0; t=6 (first token). iter1: r0 done at t=7.
    # iter2: nothing occupied, r1 arrives at 20 > 7 -> jump to 20; admit; t=21, done.
    out, _ = run("static", [1, 1], [2, 1], arrival=[5.0, 20.0])
    assert out["admit_iter"].tolist() == [0, 2]
    assert out["first_token_s"].tolist() == [6.0, 21.0]
    assert out["finish_s"].tolist() == [7.0, 21.0]
    assert out["clock"] == 21.0 and out["iterations"] == 3
    assert out["tps"] == pytest.approx(3 / 16)


def test_arrival_while_busy_waits_for_iteration_start():
    # r1 arrives at 1.5 while r0 runs: iteration starts at 0, 1, 2 -> admitted at iter2.
    out, _ = run("static", [1, 1], [4, 1], arrival=[0.0, 1.5])
    assert out["admit_iter"].tolist() == [0, 2]
    assert out["finish_s"].tolist() == [4.0, 3.0]


def test_drop_request_that_never_fits():
    # static C 30, max_len 20: r0 prompt 5 (25), r1 prompt 15 (35 > 30: never fits),
    # r2 prompt 1 (21).
    # iter0: admit r0; r1 35 > 5 -> stop. t=1. iter1: r0 done (t=2); r1 not dropped yet
    #   (r0 was running at step 3).
    # iter2: nothing running, nothing admitted, r1 arrived and 35 > 30 -> dropped;
    #   no work -> 0 s (t stays 2). iter3: admit r2, done at t=3.
    out, timer = run("static", [5, 15, 1], [2, 1, 1], capacity=30, max_len=20)
    assert out["admit_iter"].tolist() == [0, -1, 3]
    assert out["finish_iter"].tolist() == [1, -1, 3]
    assert (out["dropped"], out["unserved"]) == (1, 1)
    assert out["iterations"] == 4 and out["clock"] == 3.0
    assert len(timer.calls) == 3
    assert out["reserved_final"].tolist() == [25, 0, 21]
    assert out["r_admit"].tolist() == [20, -1, 20]


def test_invalid_padding_rows_are_ignored():
    out, _ = run("static", [1, 1, 1], [1, 1, 1], valid=[True, True, False],
                 arrival=[0.0, 0.0, np.inf])
    assert out["finish_iter"].tolist() == [0, 0, -1]
    assert out["unserved"] == 0 and out["iterations"] == 1


def test_odma_refresh_changes_later_admissions():
    # prior ring [4,4,4,4], level 0.5 -> b = 4. refresh_check 1, refresh_every 2.
    # iter0: r0, r1 (pred 3) -> r 4 normal; both output 1 -> done; ring [1,1,4,4];
    #   (0+1) % 1 == 0 and 2 completions -> b = Q_0.5 = 1 (cdf(1) = 0.5).
    # iter1: jump to 10, r2 (pred 3) -> e 3 > 1 -> large, r = max_len = 10.
    params = {"levels": [0.5], "gamma": 0.0, "tau": 0.5, "large_share": 0.5}
    out, _ = run("odma", [2, 2, 2], [1, 1, 1], pred=[3, 3, 3], arrival=[0, 0, 10],
                 params=params, prior_lengths=[4, 4, 4, 4], window=4, refresh_every=2,
                 refresh_check=1)
    assert out["r_admit"].tolist() == [4, 4, 10]
    # refresh_every 3 -> no refresh, r2 stays normal.
    out, _ = run("odma", [2, 2, 2], [1, 1, 1], pred=[3, 3, 3], arrival=[0, 0, 10],
                 params=params, prior_lengths=[4, 4, 4, 4], window=4, refresh_every=3,
                 refresh_check=1)
    assert out["r_admit"].tolist() == [4, 4, 4]


def test_odma_quantiles_and_default_prior():
    # pred [2.4, 3.6, 5, 7] -> rounded [2, 4, 5, 7]; window 6 tiles to [2,4,5,7,2,4].
    ring = initial_ring(np.array([2.4, 3.6, 5.0, 7.0], np.float32), np.ones(4, bool),
                        max_len=10, window=6)
    assert ring.tolist() == [2, 4, 5, 7, 2, 4]
    # cdf(2) = 2/6, cdf(4) = 4/6, cdf(5) = 5/6, cdf(7) = 1.
    assert odma_quantiles(ring, [0.3, 0.5, 0.8, 0.9], 10) == [2, 4, 5, 7]
    # window 4: cdf(2) = 0.25 < 0.3 -> 4.
    ring4 = initial_ring(np.array([2.4, 3.6, 5.0, 7.0], np.float32), np.ones(4, bool),
                         max_len=10, window=4)
    assert odma_quantiles(ring4, [0.3, 0.25], 10) == [4, 2]
    # default prior inside the simulator: window 6, level 0.3 -> b = 2: pred 2 -> normal
    # with r 2; pred 2.4 -> e 2.4 > 2 -> large.
    params = {"levels": [0.3], "gamma": 0.0, "tau": 0.5, "large_share": 0.5}
    out, _ = run("odma", [1, 1, 1, 1], [1, 1, 1, 1], pred=[2.4, 3.6, 5.0, 7.0],
                 params=params, window=6)
    assert out["r_admit"].tolist() == [10, 10, 10, 10]
    out, _ = run("odma", [1, 1, 1, 1], [1, 1, 1, 1], pred=[2.0, 3.6, 5.0, 7.0],
                 params=params, window=6)
    assert out["r_admit"].tolist() == [2, 10, 10, 10]
