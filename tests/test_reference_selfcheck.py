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
    """iteration_time = base + per_seq * decode_seqs; records every call (the first five
    arguments in ``calls``, the attended prefill query-key pairs in ``pairs``)."""

    def __init__(self, base=1.0, per_seq=0.0):
        self.base, self.per_seq = base, per_seq
        self.calls = []
        self.pairs = []

    def __call__(self, prefill, decode_seqs, decode_ctx, kv_chunk, copy_bytes, pairs=None):
        self.calls.append((prefill, decode_seqs, decode_ctx, kv_chunk, copy_bytes))
        self.pairs.append(pairs)
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
    # iter1: r2 needs 50 > 0 -> nothing admitted, so the running requests decode:
    #   r0, r1 (ctx 11 + 11 = 22), dt = 0.5 + 0.25*2 = 1.0 -> t=1.5;
    #   r1 reaches gen 2 == output -> finishes (iter 1, 1.5); frees 50.
    # iter2: admit r2 into slot1 (lowest free). v0: an iteration that prefills does not
    #   decode, so r0 waits (gen stays 2). prefill 10, dt = 0.5 -> t=2.0; r2 first token 2.0.
    # iter3: nothing to admit: r0 (ctx 12) and r2 (ctx 11) decode, ctx 23, dt = 1.0 -> t=3.0;
    #   r0 gen 3 == output and r2 gen 2 == output -> both finish (iter 3, 3.0).
    # kv_utilization = (13 + 12 + 12) / 150; tps = 7 tokens / 3.0 s.
    timer = Recorder(base=0.5, per_seq=0.25)
    out, _ = run("static", [10, 10, 10], [3, 2, 2], capacity=100, max_len=40,
                 timer=timer, chunk=4096)
    assert out["admit_iter"].tolist() == [0, 0, 2]
    assert out["finish_iter"].tolist() == [3, 1, 3]
    assert out["first_token_s"].tolist() == [0.5, 0.5, 2.0]
    assert out["finish_s"].tolist() == [3.0, 1.5, 3.0]
    assert timer.calls == [(20, 0, 0, 4096, 0.0), (0, 2, 22, 4096, 0.0),
                           (10, 0, 0, 4096, 0.0), (0, 2, 23, 4096, 0.0)]
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
    # iter0: r0 (12 > 10 but the walk's first item is exempt); r1: 12+4 > 10 -> stop.
    #   prefill 12; r0 gen 1.
    # iter1: r1 (4 <= 10; running 1 + 0 < 3), r2 (4+2 = 6 <= 10; 1 + 1 < 3); r3: running 1
    #   + admitted 2 = 3, not < 3 -> stop. Prefill-only iteration (6): r0 does not decode.
    # iter2: r3: running 3 + 0, not < 3 -> stop. Nothing admitted -> r0 (ctx 13), r1 (ctx 5),
    #   r2 (ctx 3) decode: 3 seqs, ctx 21; all reach gen 2 -> done.
    # iter3: running 0: r3 (3), r4 (3+1 = 4 <= 10, 0 + 1 < 3); prefill 4; gen 1 each.
    # iter4: r3 (ctx 4), r4 (ctx 2) decode -> done.
    out, timer = run("static", [12, 4, 2, 3, 1], [2] * 5, capacity=1000, max_len=5,
                     n_slots=4, max_batch=3, max_prefill=10)
    assert out["admit_iter"].tolist() == [0, 1, 1, 3, 3]
    assert out["finish_iter"].tolist() == [2, 2, 2, 4, 4]
    assert [c[:3] for c in timer.calls] == [(12, 0, 0), (6, 0, 0), (0, 3, 21), (4, 0, 0),
                                            (0, 2, 6)]


def test_admit_window_cap():
    # A = 1: one admission per iteration even though everything fits.
    # iter0: r0 admitted, gen 1. iter1: r1 admitted; prefill-only, r0 does not decode.
    # iter2: r2 admitted; again nobody decodes. gens 1, 1, 1.
    # iter3: all three decode (gen 2); iter4: gen 3 == output -> all finish at iter4.
    out, timer = run("static", [1, 1, 1], [3, 3, 3], capacity=1000, admit_window=1)
    assert out["admit_iter"].tolist() == [0, 1, 2]
    assert out["finish_iter"].tolist() == [4, 4, 4]
    assert [c[:2] for c in timer.calls] == [(1, 0), (1, 0), (1, 0), (0, 3), (0, 3)]


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
    # r1 arrives at 1.5 while r0 runs: iterations start at 0, 1, 2 -> r1 admitted at iter2.
    # iter0 (t 0 -> 1): r0 prefill, gen 1. iter1 (1 -> 2): r1 not arrived; r0 gen 2.
    # iter2 (2 -> 3): r1 admitted, prefill-only (r0 does not decode); r1 gen 1 == output,
    #   finishes at 3.0. iter3 (3 -> 4): r0 gen 3. iter4 (4 -> 5): r0 gen 4 -> done at 5.0.
    out, _ = run("static", [1, 1], [4, 1], arrival=[0.0, 1.5])
    assert out["admit_iter"].tolist() == [0, 2]
    assert out["finish_s"].tolist() == [5.0, 3.0]


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


# ---- vLLM scheduling rules (docs/server-semantics.md "Scheduler", "One iteration") ------
def test_v0_prefill_only_iteration_costs_the_decoders_one_iteration():
    # static, C 1000, max_len 10 (reservations 14, 14, 18), 1 s per iteration.
    # r0, r1: prompt 4, output 4, arrive 0. r2: prompt 8, output 1, arrives 1.5.
    # iter0 (t 0 -> 1): admit r0, r1 (r2 not arrived); prefill 8; gens 1, 1.
    # iter1 (1 -> 2): r2 1.5 > 1; nothing admitted -> r0, r1 decode (ctx 5 + 5); gens 2, 2.
    # iter2 (2 -> 3): r2 admitted (slot2): prefill-only iteration, r0 and r1 do not decode.
    #   r2 gen 1 == output -> finishes at 3.0 (first token 3.0).
    # iter3 (3 -> 4): r0, r1 decode (ctx 6 + 6); gens 3. iter4 (4 -> 5): ctx 7 + 7; gens 4
    #   -> both finish at iter4, t = 5.0.
    # Without r2 they would decode in iter1..3 and finish at 4.0: r2 cost them 1 s.
    out, timer = run("static", [4, 4, 8], [4, 4, 1], arrival=[0.0, 0.0, 1.5],
                     capacity=1000)
    assert out["admit_iter"].tolist() == [0, 0, 2]
    assert out["finish_iter"].tolist() == [4, 4, 2]
    assert out["first_token_s"].tolist() == [1.0, 1.0, 3.0]
    assert out["finish_s"].tolist() == [5.0, 5.0, 3.0]
    assert [c[:3] for c in timer.calls] == [(8, 0, 0), (0, 2, 10), (8, 0, 0), (0, 2, 12),
                                            (0, 2, 14)]
    alone, _ = run("static", [4, 4], [4, 4], capacity=1000)
    assert alone["finish_s"].tolist() == [4.0, 4.0]


@pytest.mark.parametrize("two_victims", [False, True])
def test_paged_tail_preemption_and_resume_order(two_victims):
    # paged k=8, C=24, 4 slots, watermark 0, 1 s per iteration. A block is 8 tokens; a
    # prompt p reserves ceil((p+1)/8)*8 = 8 for every prompt below.
    #   r0: prompt 1, output 2, arrives 0     (slot0, finishes early and frees slot0)
    #   r1: prompt 4, output 6, arrives 0.5   (slot1, the oldest running request)
    #   r2: prompt 1 (or 4 with two_victims), output 6 (or 5), arrives 1.5   (slot2)
    #   r3: prompt 2, output 4, arrives 3.5   (slot0: the newest, in the lowest slot)
    #   r4: prompt 1, output 1, arrives 7.5   (a new request while victims wait)
    # order = it * (S + A) + position = it * 8: r1 8, r2 16, r3 32.
    # iter0: r0 -> slot0 (used 8); gen 1.  iter1: r1 -> slot1 (16); prefill-only; gen 1.
    # iter2: r2 -> slot2 (24); gen 1.
    # iter3: r3 not arrived; decode r0 (ctx 2), r1 (5), r2 (2 | 5); r0 gen 2 -> done (16).
    # iter4: r3 -> slot0 (lowest free of 0, 3) (24); prefill-only; r3 gen 1.
    # iter5: decode r1 (6), r2 (3 | 6), r3 (3). iter6: r1 (7), r2 (4 | 7), r3 (4).
    #   Now gens r1 4, r2 4, r3 3; ctx r1 8, r2 5 | 8, r3 5; reserved 8 each, pool full.
    # iter7 (t 7; r4 arrives 7.5): r1 ctx+1 = 9 > 8 overflows (and r2 too with two_victims).
    #   Walk of the running queue [r1, r2, r3] (by order): r1 short of a block, free 0 <
    #   8 -> preempt the tail r3 (slot 0!) -> free 8 -> r1 grows to 16 (free 0).
    #   - one victim: r2 (ctx 5) does not overflow and is kept, though it sits in slot 2 (the
    #     slot-order prefix rule would have kept r3 and preempted r2). Decode r1 (8), r2 (5).
    #   - two victims: r2 overflows, free 0, and r2 is now the tail -> preempts itself.
    #     Decode r1 (ctx 8) only.
    #   r3 waits with gen 3 (ctx 5, resume 8); r2 (two victims) gen 4 (ctx 8, resume 16).
    if not two_victims:
        # iter8 (t 8): r3: 8 > room 0 -> blocked, so r4 is not tried. Decode r1 (9), r2 (6):
        #   r1 gen 6, r2 gen 6 -> both done (used 0).
        # iter9: r3 resumes (8; recompute ctx 5); no slot waits -> r4 -> slot1 (lowest free
        #   of 1, 2, 3) (8). prefill 5 + 1 = 6. r3 gen 4 == output, r4 gen 1 -> both done.
        out, timer = run("paged", [1, 4, 1, 2, 1], [2, 6, 6, 4, 1],
                         arrival=[0.0, 0.5, 1.5, 3.5, 7.5], params={"block_size": 8},
                         capacity=24, n_slots=4)
        assert out["admit_iter"].tolist() == [0, 1, 2, 4, 9]
        assert out["finish_iter"].tolist() == [3, 8, 8, 9, 9]
        assert out["preemptions"] == 1
        assert out["reserved_final"].tolist() == [8, 16, 8, 8, 8]
        assert [c[:3] for c in timer.calls] == [
            (1, 0, 0), (4, 0, 0), (1, 0, 0), (0, 3, 9), (2, 0, 0), (0, 3, 12), (0, 3, 15),
            (0, 2, 13), (0, 2, 15), (6, 0, 0)]
    else:
        # iter8 (t 8): waiting queue in admission order [r2 (order 16), r3 (order 32)]:
        #   r2 needs 16 > room 8 -> blocked. r3 (8 <= 8) and r4 (slot 3 free, 8 <= 8) would
        #   fit but stay behind it. Decode r1 (ctx 9): gen 6 -> done (used 0).
        # iter9: r2 resumes (16, ctx 8), r3 resumes (8, ctx 5; 16 + 8 = 24); no slot waits ->
        #   r4: 8 > room 0 -> stop. prefill 13; r2 gen 5, r3 gen 4 -> both done.
        # iter10: r4 -> slot0; done.
        out, timer = run("paged", [1, 4, 4, 2, 1], [2, 6, 5, 4, 1],
                         arrival=[0.0, 0.5, 1.5, 3.5, 7.5], params={"block_size": 8},
                         capacity=24, n_slots=4)
        assert out["admit_iter"].tolist() == [0, 1, 2, 4, 10]
        assert out["finish_iter"].tolist() == [3, 8, 9, 9, 10]
        assert out["preemptions"] == 2
        assert out["reserved_final"].tolist() == [8, 16, 16, 8, 8]
        assert [c[:3] for c in timer.calls] == [
            (1, 0, 0), (4, 0, 0), (4, 0, 0), (0, 3, 12), (2, 0, 0), (0, 3, 15), (0, 3, 18),
            (0, 1, 8), (0, 1, 9), (13, 0, 0), (1, 0, 0)]
    # r3's first token (end of iter4) survives its preemption and recompute.
    assert out["first_token_s"][3] == 5.0
    assert out["peak_kv_tokens"] == 24


def test_paged_watermark_blocks_admission_not_growth():
    # paged k=4, C=16, watermark 4 tokens, 4 slots, 1 s per iteration.
    # r0: prompt 3 -> 4 tokens, output 3. r1: prompt 4 -> 8 tokens, output 3.
    # r2: prompt 1 -> 4 tokens, output 1. r3: prompt 12 -> 16 tokens (= C), output 1.
    # iter0: r0: 4 <= 16-0-4 = 12 -> admit (used 4); r1: 8 <= 16-4-4 = 8 -> admit (used 12,
    #   exactly the watermark left); r2: 4 > 16-12-4 = 0 -> refused (it would leave 0 < 4
    #   free). prefill 7; gens 1 (ctx r0 4, r1 5).
    # iter1: r2 refused again. r0 ctx+1 = 5 > 4 -> needs a block: free 16-12 = 4 >= 4 ->
    #   grows into the watermark (used 16). Decode r0 (4), r1 (5); gens 2.
    # iter2: r2: 4 > 16-16-4 -> refused. Decode r0 (5), r1 (6); gens 3 -> both done (used 0).
    # iter3: r2: 4 <= 12 -> admit; r3: 16 > 16-4-4 = 8 -> stop. r2 gen 1 -> done.
    # iter4: nothing running, r3: 16 > 12 -> not admitted; drop rule: 16 > C - watermark =
    #   12 -> dropped (though 16 <= C). No work, 0 s. All valid requests settled -> end.
    out, timer = run("paged", [3, 4, 1, 12], [3, 3, 1, 1], params={"block_size": 4},
                     capacity=16, max_len=16, watermark=4)
    assert out["admit_iter"].tolist() == [0, 0, 3, -1]
    assert out["finish_iter"].tolist() == [2, 2, 3, -1]
    assert (out["dropped"], out["unserved"], out["preemptions"]) == (1, 1, 0)
    assert out["reserved_final"].tolist() == [8, 8, 4, 0]
    assert out["peak_kv_tokens"] == 16 and out["max_pool_use_ratio"] == 1.0
    assert [c[:3] for c in timer.calls] == [(7, 0, 0), (0, 2, 9), (0, 2, 11), (1, 0, 0)]
    assert out["iterations"] == 5 and out["clock"] == 4.0
    # Control without the watermark: iter0 admits r0, r1, r2 (4 + 8 + 4 = 16); r2 is done
    # at iter0; r0 grows at iter1 (free 4); r0, r1 done at iter2; iter3 admits r3 (16).
    out, _ = run("paged", [3, 4, 1, 12], [3, 3, 1, 1], params={"block_size": 4},
                 capacity=16, max_len=16)
    assert out["admit_iter"].tolist() == [0, 0, 0, 3]
    assert out["finish_iter"].tolist() == [2, 2, 0, 3]
    assert out["dropped"] == 0


def test_token_budget_counts_resumes_first_item_exempt():
    # paged k=4, C=20, max_prefill 4, 4 slots, 1 s per iteration (v0).
    # r0, r1: prompt 4 (8 tokens), output 6, arrive 0. r2: prompt 1 (4 tokens), output 1,
    # arrives 6.5.
    # iter0: r0 (4 <= 4) -> slot0; r1: 4 + 4 > 4 -> stop. gen 1.
    # iter1: r1 (first item) -> slot1 (used 16); prefill-only; gen 1.
    # iter2..4: decode both (ctx 5+5, 6+6, 7+7); gens 4 (ctx 8 = reserved).
    # iter5: both overflow; queue [r0, r1]: r0 free 4 -> grows to 12 (used 20); r1 free 0
    #   and the tail -> preempts itself (used 12; gen 4, ctx 8, resume 12). Decode r0 (8).
    # iter6 (t 6): r1: 12 > room 8 -> blocked. Decode r0 (9): gen 6 -> done (used 0).
    # iter7 (t 7): r1 resumes: its recompute of ctx 8 > max_prefill 4 passes as the walk's
    #   first item (room 20 >= 12). r2 (arrived): slot and memory (4 <= 8) fit, but the
    #   resumed context counts: 8 + 1 > 4 -> refused. prefill 8; r1 gen 5.
    # iter8: r2 admitted (1 <= 4); prefill-only, r1 waits; r2 gen 1 -> done at 9.0.
    # iter9: r1 decodes (ctx 9): gen 6 -> done at 10.0.
    out, timer = run("paged", [4, 4, 1], [6, 6, 1], arrival=[0.0, 0.0, 6.5],
                     params={"block_size": 4}, capacity=20, max_len=16, max_prefill=4)
    assert out["admit_iter"].tolist() == [0, 1, 8]
    assert out["finish_iter"].tolist() == [6, 9, 8]
    assert out["preemptions"] == 1
    assert [c[:3] for c in timer.calls] == [
        (4, 0, 0), (4, 0, 0), (0, 2, 10), (0, 2, 12), (0, 2, 14), (0, 1, 8), (0, 1, 9),
        (8, 0, 0), (1, 0, 0), (0, 1, 9)]
    assert out["first_token_s"].tolist() == [1.0, 2.0, 9.0]
    assert out["finish_s"].tolist() == [7.0, 10.0, 9.0]
    assert out["reserved_final"].tolist() == [12, 12, 4]


def test_chunked_prefill_chunks_and_pairs():
    # static, chunked, max_prefill 8, C 1000, max_len 10, 1 s per iteration.
    # r0: prompt 2, output 5, arrives 0. r1: prompt 20, output 2, arrives 0.5.
    # r2: prompt 1, output 1, arrives 1.5.
    # pairs of a chunk c with b tokens computed before: c * (b + (c+1)/2).
    # iter0 (t 0): nothing decodes, budget 8: r0 (0 < 8) computes 2 -> gen 1 (first 1.0).
    #   call (2, 0, 0); pairs 2 * 1.5 = 3.
    # iter1 (t 1): r0 decodes (ctx 3), budget 8 - 1 = 7; r1: 0 < 7 -> chunk min(20, 7) = 7
    #   (13 left); r2 not arrived. call (7, 1, 3); pairs 7 * (0 + 4) = 28. r0 gen 2.
    # iter2 (t 2): r0 decodes (ctx 4); budget 7: r1's next chunk 7 (before 7, 6 left) leaves
    #   0; r2 (arrived): 0 < 0 fails -> not admitted. call (7, 1, 4); pairs 7 * (7 + 4) = 77.
    # iter3 (t 3): r0 decodes (ctx 5); r1's last chunk 6 (before 14) -> r1 gen 1 (first token
    #   at the end of this iteration, 4.0); budget 7 - 6 = 1: r2: 0 < 1 -> min(1, 1) = 1,
    #   gen 1 -> done. call (7, 1, 5); pairs 6 * (14 + 3.5) + 1 * (0 + 1) = 106. r0 gen 4.
    # iter4 (t 4): r0 (ctx 6), r1 (ctx 21) decode: call (0, 2, 27), pairs 0; r0 gen 5 and
    #   r1 gen 2 -> both done at 5.0.
    out, timer = run("static", [2, 20, 1], [5, 2, 1], arrival=[0.0, 0.5, 1.5],
                     capacity=1000, max_prefill=8, chunked=True)
    assert [c[:3] for c in timer.calls] == [(2, 0, 0), (7, 1, 3), (7, 1, 4), (7, 1, 5),
                                            (0, 2, 27)]
    assert timer.pairs == [3.0, 28.0, 77.0, 106.0, 0.0]
    assert out["admit_iter"].tolist() == [0, 1, 3]
    assert out["first_token_s"].tolist() == [1.0, 4.0, 4.0]
    assert out["finish_s"].tolist() == [5.0, 5.0, 4.0]
    assert out["finish_iter"].tolist() == [4, 4, 3]


def test_chunked_no_walk_in_an_iteration_with_a_preemption():
    # s3 bounds [4], max_len 10, C 20, 2 slots, chunked (budget 10000 never binds).
    # r0, r1: prompt 2, pred 3 -> r 4 (6 tokens each); outputs 6 and 5.
    # iter0: both admitted (used 12), prefill 2 + 2; gens 1.
    # iter1..3: both decode (ctx 3+3, 4+4, 5+5); gens 4 (ctx 6 = reserved).
    # iter4 (t 4): step 2 first: both overflow, free 20-12 = 8: slot0 demand 12 > 8 and
    #   slot1 cumulative 24 > 8 -> both denied, s3 preempts both (used 0; resume 12 each).
    #   A preemption happened -> no walk: r0 would fit (12 <= 20) but is not resumed.
    #   Nothing computes -> 0 s, iteration_time not called; drop rule: first waiting
    #   needs 12 <= 20 -> kept.
    # iter5 (t 4): slot0 resumes (12; recompute ctx 6); slot1: 12 > room 8 -> blocked.
    #   call (6, 0, 0); r0 gen 5.
    # iter6 (t 5): slot1 still blocked; r0 decodes (ctx 7) -> gen 6, done at 6.0.
    # iter7 (t 6): slot1 resumes (ctx 6) -> gen 5, done at 7.0.
    out, timer = run("s3", [2, 2], [6, 5], pred=[3, 3], params={"bounds": [4]},
                     capacity=20, n_slots=2, chunked=True)
    assert [c[:3] for c in timer.calls] == [(4, 0, 0), (0, 2, 6), (0, 2, 8), (0, 2, 10),
                                            (6, 0, 0), (0, 1, 7), (6, 0, 0)]
    assert out["preemptions"] == 2 and out["dropped"] == 0
    assert out["finish_iter"].tolist() == [6, 7]
    assert out["finish_s"].tolist() == [6.0, 7.0]
    assert out["iterations"] == 8 and out["clock"] == 7.0


def test_reserved_token_seconds():
    # The paged growth/preemption case of test_paged_growth_preemption_and_resume with
    # iteration_time = 0.5 + 0.25 * decode_seqs. Held tokens during each iteration (after
    # steps 2 and 3, before completions) x its duration:
    #   iter0 prefill-only: 8 x 0.5 = 4;  iter1 two decodes: 8 x 1.0 = 8;
    #   iter2 (both grow to 8 each) .. iter5: 16 x 1.0 x 4 = 64;
    #   iter6 (slot0 grows to 12, slot1 preempted) one decode: 12 x 0.75 = 9;
    #   iter7 (slot1 blocked) one decode: 12 x 0.75 = 9;
    #   iter8 slot1 resumed (12), prefill-only: 12 x 0.5 = 6;  iter9: 12 x 0.75 = 9.
    #   Sum 109; clock 0.5 + 1 + 4 + 0.75 + 0.75 + 0.5 + 0.75 = 8.25.
    timer = Recorder(base=0.5, per_seq=0.25)
    out, _ = run("paged", [2, 2], [8, 8], params={"block_size": 4}, capacity=20,
                 n_slots=2, max_len=16, timer=timer)
    assert [c[1] for c in timer.calls] == [0, 2, 2, 2, 2, 2, 1, 1, 0, 1]
    assert out["res_token_s"] == 109.0
    assert out["clock"] == 8.25


def test_paged_repreempted_request_goes_ahead_of_older_waiting():
    # vLLM v0 waiting.extendleft(preempted): a request preempted again goes to the front
    # of the waiting queue, ahead of one preempted earlier that still waits.
    # paged k=4, C=16, 4 slots, all arrive at 0; prompts [1,3,3,3], outputs [7,3,7,2].
    # iter0 admits all four, one block of 4 tokens each (ceil((p+1)/4) = 1): 16 used.
    # r2 and r3 are preempted at iter1 (tail first), r2 resumes at
    # iter3 and preempts itself again at iter7 while r3 still waits; with r2 at the
    # front it resumes first (iter 8) and finishes at iter 9, r3 at iter 10.
    out, _ = run("paged", [1, 3, 3, 3], [7, 3, 7, 2], params={"block_size": 4},
                 capacity=16, n_slots=4, max_len=16)
    assert out["finish_iter"].tolist() == [7, 2, 9, 10]
