"""Hand-worked scenarios for the NumPy reference of the parameter-dropping family
(``tests/reference_kunserve.py``).

Every expected value below is worked out by hand in the comments (see
docs/kunserve-semantics.md and the Interpretations list in tests/reference_kunserve.py).
Unless a test says otherwise the device is the toy roofline ``HW``: weights 1000 B read
at 1000 B/s (1 s per iteration with work), 1 FLOP per token at 100 FLOP/s, attention and
KV reads free (``attn_flops_per_ctx_token = kv_bytes_per_token = 0``), step overhead
0.25 s, so a k = 1 round of ``n <= 100`` tokens costs ``max(n / 100, 1) + 0.25 = 1.25``
s. A k = 2 stage halves weights and FLOPs: ``s = max(0.5 * tokens / 100, 0.5)``. The
cluster: ``kvb = 1000`` B per token, links ``bw = 1e6`` B/s, ``act_bytes = 100`` B per
token, KV-exchange chunks of 1024 B (``chunk_mib = 1 / 1024``) at ``t_chunk = 1 ms``.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import reference_kunserve as K  # noqa: E402
from hardware.roofline import RooflineParams, iteration_time  # noqa: E402

HW = RooflineParams(weight_bytes=1000.0, kv_bytes_per_token=0.0,
                    kv_bytes_per_token_layer=1.0, dense_flops_per_token=1.0,
                    attn_flops_per_ctx_token=0.0, stream_bw=1000.0, alpha=1.0,
                    burst_bytes=1.0, peak_flops=100.0, host_link_bw=2000.0,
                    network_bw=1e6, mfu=1.0, bw_eff=1.0, step_overhead_s=0.25, pp=1.0)
CHUNK_MIB = 1.0 / 1024.0  # 1024-byte exchange chunks
KUN = {"theta": 0.5, "margin": 0.0, "min_tokens": 1000.0, "chunk_mib": CHUNK_MIB}


def cluster(**kw) -> K.Cluster:
    d = dict(n_instances=1, C=1000.0, W=60.0, kvb=1000.0, bw=1e6, host_bw=2000.0,
             act_bytes=100.0, B=512, max_batch=8, watermark=0.0, t_chunk=1e-3,
             block=16, hw=HW, a=1.0, b=1.0)
    d.update(kw)
    return K.Cluster(**d)


def close(x, y, rel=1e-12):
    return math.isclose(float(x), float(y), rel_tol=rel, abs_tol=1e-12)


# ---- the cost model transcription --------------------------------------------------------
def test_iteration_time_f64_matches_hardware_roofline():
    from hardware.deploy import make_deployment
    from hardware.roofline import roofline_params
    real = roofline_params(make_deployment("a100-80gb", "qwen-2.5-14b"))
    tp2 = real._replace(tp=2.0, tp_allreduce_latency_s=1e-5, token_overhead_s=1e-5)
    rng = np.random.default_rng(1)
    for hw in (real, tp2, HW._replace(attn_flops_per_ctx_token=0.01, kv_bytes_per_token=1.0)):
        for _ in range(25):
            P, D = float(rng.integers(0, 3000)), float(rng.integers(0, 200))
            ctx, pairs = float(rng.integers(0, 400_000)), float(rng.integers(0, 4_000_000))
            want = float(iteration_time(hw, P, D, ctx, 16.0, prefill_ctx_tokens=pairs))
            got = K.iteration_time_f64(hw, P, D, ctx, 16, pairs)
            assert math.isclose(got, want, rel_tol=2e-6), (P, D, ctx, pairs, got, want)
    # nothing to do: weights not read, only the step overhead (0.25)
    assert K.iteration_time_f64(HW, 0, 0, 0.0, 16, 0.0) == 0.25


# ---- Fig. 6 drop plan ----------------------------------------------------------------------
def test_drop_plan_by_hand():
    W = 10.0
    single8 = {i: 1 for i in range(8)}
    # R = 2.5 W: (0,1) freed W < R, (2,3) 2W < R, (4,5) 3W >= R -> stop
    assert K.drop_plan(single8, set(range(8)), 2.5 * W, W) == [(0, 1), (2, 3), (4, 5)]
    # R = 2 W exactly: after two merges freed = 2W, not < R -> stop
    assert K.drop_plan(single8, set(range(8)), 2.0 * W, W) == [(0, 1), (2, 3)]
    # sizes {0:2, 2:2, 4:1, 5:1, 6:1}: heap (1,4) (1,5) (1,6) (2,0) (2,2) -> (4,5) first
    # (new gid 4, size 2); then (1,6) and (2,0) -> (6,0): gid 0 size 3; then (2,2) (2,4)
    # -> (2,4): gid 2 size 4; then (3,0) (4,2) -> (0,2).
    sizes = {0: 2, 2: 2, 4: 1, 5: 1, 6: 1}
    assert K.drop_plan(sizes, set(sizes), 1.0 * W, W) == [(4, 5)]
    assert K.drop_plan(sizes, set(sizes), 100 * W, W) == [(4, 5), (6, 0), (2, 4), (0, 2)]
    # the paper's 7 instances of a 7-layer model: dropping until one copy remains frees
    # 6 copies (6/7 = 85 % of the weights): (0,1) (2,3) (4,5), then (1,6)+(2,0) -> (6,0)
    # size 3, (2,2)+(2,4) -> (2,4) size 4, (3,0)+(4,2) -> (0,2) size 7: 6 merges.
    plan = K.drop_plan({i: 1 for i in range(7)}, set(range(7)), 1e9, W)
    assert plan == [(0, 1), (2, 3), (4, 5), (6, 0), (2, 4), (0, 2)]
    assert len(plan) * W / (7 * W) == pytest.approx(6 / 7)
    # nothing to free / a single eligible group / ineligible groups are left out
    assert K.drop_plan(single8, set(range(8)), 0.0, W) == []
    assert K.drop_plan(single8, set(range(8)), -5.0, W) == []
    assert K.drop_plan(single8, {3}, 1e9, W) == []
    assert K.drop_plan(single8, {5, 2, 7}, 1.5 * W, W) == [(2, 5), (7, 2)]


def test_drop_plan_throttled_first_among_equal_sizes():
    W = 10.0
    single8 = {i: 1 for i in range(8)}
    # only 5 throttled: heap (1,0,5) (1,1,0) (1,1,1) ...: 5 merges with 0 (gid 0), not
    # (0, 1) as a (size, gid) key would
    assert K.drop_plan(single8, set(range(8)), 0.5 * W, W, {5}) == [(5, 0)]
    # two throttled singletons merge with each other
    assert K.drop_plan(single8, set(range(8)), 0.5 * W, W, {7, 5}) == [(5, 7)]
    # R = 2.5 W: (5, 0) -> (2, 0, 0) pushed; singletons still come first by size:
    # (1, 2), then (3, 4): freed 3 W >= R
    assert K.drop_plan(single8, set(range(8)), 2.5 * W, W, {5}) == [(5, 0), (1, 2), (3, 4)]
    # size first: the throttled pair {2, 3} waits for the singletons 4, 5 (merged into
    # an unthrottled pair (2, 1, 4)); then heap (2,0,2) (2,1,0) (2,1,4): the throttled
    # pair goes first and takes the smallest-gid pair of its size
    sizes = {0: 2, 2: 2, 4: 1, 5: 1}
    assert K.drop_plan(sizes, set(sizes), 2.0 * W, W, {2}) == [(4, 5), (2, 0)]
    # a merged group stays throttled: {0, 1} (size 2), singletons 2 and 5 (5 throttled):
    # (5, 2) -> pushed (2, 0, 2); it pops before (2, 1, 0): (2, 0), not (0, 2)
    sizes = {0: 2, 2: 1, 5: 1}
    assert K.drop_plan(sizes, set(sizes), 9 * W, W, {5}) == [(5, 2), (2, 0)]
    # an ineligible throttled group is not in the heap
    assert K.drop_plan(single8, {0, 1, 2}, 0.5 * W, W, {5}) == [(0, 1)]


# ---- 7f microbatches ------------------------------------------------------------------------
def test_token_cuts():
    assert K.token_cuts(100, 64) == [64]
    assert K.token_cuts(128, 64) == [64]
    assert K.token_cuts(129, 64) == [64, 128]
    assert K.token_cuts(64, 64) == [] and K.token_cuts(0, 64) == []


def test_chunk_cost_is_additive_along_the_token_axis():
    # the doc's identity: p c1 + (c1^2 + c1)/2 + (p + c1)(c - c1) + ((c-c1)^2 + (c-c1))/2
    # = p c + (c^2 + c)/2, e.g. p = 3, c = 5, c1 = 2: 6 + 3 + 15 + 6 = 30 = 15 + 15
    assert K.chunk_cost(3, 2, 1, 0) + K.chunk_cost(5, 3, 1, 0) == K.chunk_cost(3, 5, 1, 0) == 30
    rng = np.random.default_rng(0)
    for _ in range(50):
        p, c = int(rng.integers(0, 5000)), int(rng.integers(1, 3000))
        c1 = int(rng.integers(0, c + 1))
        a, b = float(rng.uniform(0, 1e-3)), float(rng.uniform(0, 1))
        whole = K.chunk_cost(p, c, a, b)
        assert math.isclose(K.chunk_cost(p, c1, a, b) + K.chunk_cost(p + c1, c - c1, a, b),
                            whole, rel_tol=1e-12)
    # the pieces' (query, key) pairs of a split chunk add up to the chunk's
    items = [("p", 40, 100)]
    pcs = K.build_pieces(items, [13, 71], 100)
    assert [pc["prefill_tokens"] for pc in pcs] == [13, 58, 29]
    # part [13, 71): 58 * 40 + (71 * 72 - 13 * 14) / 2 = 2320 + (5112 - 182) / 2 = 4785
    assert pcs[1]["prefill_pairs"] == 4785.0
    assert sum(pc["prefill_pairs"] for pc in pcs) == 100 * 40 + 100 * 101 / 2


def test_lookahead_equal_decodes_split_evenly():
    # 8 decodes at context 15, a = 1, b = 0: each costs 15 + 1 = 16, total 128.
    # d = 1: y = 64 -> u = 4; d = 2: 32, 64, 96 -> 2, 4, 6; d = 3: 1 .. 7.
    items = [(15, 1)] * 8
    assert K.lookahead_cuts(items, 1.0, 0.0, 8, 4) == (0, [])      # 8 <= 8 at d = 0
    assert K.lookahead_cuts(items, 1.0, 0.0, 4, 4) == (1, [4])
    assert K.lookahead_cuts(items, 1.0, 0.0, 2, 4) == (2, [2, 4, 6])
    assert K.lookahead_cuts(items, 1.0, 0.0, 1, 4) == (3, [1, 2, 3, 4, 5, 6, 7])
    # d = 4 would want 15 cuts among 8 decodes: duplicates and empty pieces go
    assert K.lookahead_cuts(items, 1.0, 0.0, 0, 4) == (4, [1, 2, 3, 4, 5, 6, 7])
    assert K.lookahead_cuts([], 1.0, 0.0, 0, 4) == (0, [])


def test_lookahead_single_long_prefill_by_the_quadratic():
    # one chunk, prefix 0, c = 100, a = 1, b = 0: F(u) = (u^2 + u) / 2, total 5050.
    # d = 1: (u^2 + u)/2 >= 2525 <=> u >= (-1 + sqrt(1 + 8 * 2525)) / 2 = 70.56 -> 71
    #   (F(70) = 2485 < 2525 <= F(71) = 2556): the early tokens are cheaper, so the first
    #   half holds more of them.
    # d = 2: 1262.5 -> (-1 + sqrt(10101)) / 2 = 49.75 -> 50 (F(49) = 1225, F(50) = 1275);
    #   3787.5 -> (-1 + sqrt(30301)) / 2 = 86.54 -> 87 (F(86) = 3741, F(87) = 3828).
    items = [(0, 100)]
    assert K.lookahead_cuts(items, 1.0, 0.0, 80, 4) == (1, [71])
    assert K.lookahead_cuts(items, 1.0, 0.0, 60, 4) == (2, [50, 71, 87])
    # no depth <= max_depth reaches min_tokens: max_depth
    assert K.lookahead_cuts(items, 1.0, 0.0, 10, 2) == (2, [50, 71, 87])
    assert K.lookahead_cuts(items, 1.0, 0.0, 100, 4) == (0, [])
    for y, u in ((2525, 71), (1262.5, 50), (3787.5, 87)):
        assert (-1 + math.sqrt(1 + 8 * y)) / 2 <= u < (-1 + math.sqrt(1 + 8 * y)) / 2 + 1


def test_lookahead_cut_inside_a_prefill_after_decodes():
    # items: two decodes (ctx 100) then a fresh chunk of 50; a = 0.01, b = 1.
    # decode cost 0.01 * (100 + 1) + 1 = 2.01 each; chunk 0.01 * 1275 + 50 = 62.75;
    # total 66.77, half 33.385: inside the chunk u + 0.005 (u^2 + u) >= 33.385 - 4.02 =
    # 29.365: u = 25 gives 28.25, u = 26 gives 29.51 -> boundary 2 + 26 = 28.
    items = [(100, 1), (100, 1), (0, 50)]
    assert K.lookahead_cuts(items, 0.01, 1.0, 30, 4) == (1, [28])
    # an exact tie inside a chunk: p 0, c 3, a 1, b 0: F = 1, 3, 6; y = 3 = F(2) -> 2
    assert K.lookahead_cuts([(0, 3)], 1.0, 0.0, 2, 1) == (1, [2])
    # a cut target inside a decode's cost falls before or after it: 3 decodes costing
    # (1, 10, 1) (a = 1, b = 0, ctx 0, 9, 0): total 12, half 6 -> F(1) = 1 < 6 <= F(2) = 11
    assert K.lookahead_cuts([(0, 1), (9, 1), (0, 1)], 1.0, 0.0, 2, 1) == (1, [2])


# ---- 7g round time --------------------------------------------------------------------------
def piece(P=0, pairs=0.0, D=0, ctx=0.0):
    return {"prefill_tokens": P, "prefill_pairs": pairs, "decode_seqs": D,
            "decode_ctx": ctx}


def test_round_time_k1_is_iteration_time():
    from hardware.deploy import make_deployment
    from hardware.roofline import roofline_params
    real = roofline_params(make_deployment("a100-80gb", "qwen-2.5-14b"))
    pcs = [piece(300, 300 * 301 / 2 + 300 * 1000, 3, 5000.0), piece(100, 5050.0, 0, 0.0)]
    T, bub = K.round_time(pcs, 1, real, 0.123)
    want = float(iteration_time(real, 400.0, 3.0, 5000.0, 16.0,
                                prefill_ctx_tokens=300 * 301 / 2 + 300 * 1000 + 5050.0))
    assert math.isclose(T, want, rel_tol=2e-6) and bub == 0.0
    # toy device: 80 tokens -> max(0.8, 1) + 0.25
    assert K.round_time([piece(80, 3240.0)], 1, HW, 0.0) == (1.25, 0.0)


def test_round_time_k2_balanced_and_single_piece():
    # k = 2 stage: s = max(0.5 * 300 / 100, 0.5) = 1.5 per 300-token piece.
    # balanced: T_c = max(1.5 + 1.5, 2 * 1.5 + a), a = 2 (300 * 100 / 1e6 + 0.001) =
    # 0.062 -> T_c = 3.062, T = 3.312; bubble = 2 * 3.062 - 2 * 3 = 0.124 = 2 a (only the
    # activation term).
    T, bub = K.round_time([piece(300), piece(300)], 2, HW, 0.001, act_bytes=100, bw=1e6)
    assert close(T, 3.312) and close(bub, 0.124)
    # one piece (no activation, no delay): T_c = 2 s = 3.0, bubble = 2 * 3 - 2 * 1.5 = 3
    # = 50 % of k T_c = 6.
    T, bub = K.round_time([piece(300)], 2, HW, 0.0, act_bytes=0.0, bw=1e6)
    assert close(T, 3.25) and close(bub, 3.0) and close(bub / (2 * (T - 0.25)), 0.5)
    # k = 3, pieces of 600, 300, 300 tokens: stage s = max(tokens / 300, 1/3) = 2, 1, 1;
    # no activations: T_c = max(4, 3 * 2) = 6; bubble = 3 * 6 - 3 * 4 = 6.
    T, bub = K.round_time([piece(600), piece(300), piece(300)], 3, HW, 0.0, act_bytes=0.0)
    assert close(T, 6.25) and close(bub, 6.0)
    # the defaults come from the roofline: activation_bytes_per_token (0) and network_bw
    T0, _ = K.round_time([piece(300)], 2, HW, 0.5)
    assert close(T0, 3.0 + 2 * 0.5 + 0.25)


# ---- the cluster loop ---------------------------------------------------------------------
def test_a_one_instance_two_requests_no_pressure():
    # Toy device with attention 0.01 FLOP per pair and 1 KV byte per context token:
    # T = max((n + 0.01 (ctx + pairs)) / 100, 1 + ctx / 1000) + 0.25.
    hw = HW._replace(attn_flops_per_ctx_token=0.01, kv_bytes_per_token=1.0)
    # r0 arr 0 p 100 o 3; r1 arr 0.5 p 300 o 2; C 1000.
    # step 1 (t 0): r0 admitted (101); prefill 100, pairs 5050: (100 + 50.5)/100 = 1.505
    #   > 1 -> T 1.755; r0's first token at 1.755.
    # step 2: t = 0.5 (arrival) -> r1 dispatched; the group's clock 1.755 = t0; growth 1;
    #   r1 admitted (101 + 1 + 301 <= 1000); r0 decodes (ctx 101), r1 prefills 300 (pairs
    #   45150): compute (301 + 0.01 (101 + 45150)) / 100 = 7.5351, memory 1.101 ->
    #   T 7.7851, clock 9.5401 = r1's first token.
    # step 3: decodes r0 (ctx 102), r1 (ctx 301): compute (2 + 4.03)/100, memory 1.403
    #   -> T 1.653, clock 11.1931; r0 gen 3, r1 gen 2: both finish.
    c = cluster(hw=hw)
    snaps = K.simulate([0.0, 0.5], [100, 300], [3, 2], c, "vllm-dp", {}, 100)
    assert len(snaps) == 3
    assert [s["T"] for s in snaps] == pytest.approx([1.755, 7.7851, 1.653], rel=1e-12)
    last = snaps[-1]
    assert last["t_first"].tolist() == pytest.approx([1.755, 9.5401], rel=1e-12)
    assert last["t_finish"].tolist() == pytest.approx([11.1931, 11.1931], rel=1e-12)
    assert last["status"].tolist() == [3, 3] and last["kv"].tolist() == [0, 0]
    assert last["gen"].tolist() == [3, 2]
    assert snaps[1]["kv"].tolist() == [102, 301] and snaps[1]["done"].tolist() == [100, 300]
    # the same times from hardware.roofline.iteration_time (float32 in JAX)
    it = [float(iteration_time(hw, 100.0, 0.0, 0.0, 16.0, prefill_ctx_tokens=5050.0)),
          float(iteration_time(hw, 300.0, 1.0, 101.0, 16.0, prefill_ctx_tokens=45150.0)),
          float(iteration_time(hw, 0.0, 2.0, 403.0, 16.0, prefill_ctx_tokens=0.0))]
    assert [s["T"] for s in snaps] == pytest.approx(it, rel=1e-6)
    assert all(s["picked"] == 0 and s["bubble"] == 0.0 and s["cuts"] == [] for s in snaps)


def test_b_vllm_dp_preempts_the_highest_index_and_recomputes():
    # C 42; r0 p10 o3, r1 p20 o8, r2 p5 o8, all at 0.
    # step 1: all admitted (11 + 21 + 6 = 38 <= 42), prefill 35; gen 1 each.
    # step 2: growth 3 -> 41 <= 42; decodes: kv 12, 22, 7.
    # step 3: 41 + 3 = 44 > 42 -> r2 preempted (highest index; the smallest KV, so not
    #   "the largest"): 34 + 2 = 36 fits; r2 -> queued, kv 0, target 5 + 2 = 7, done 0;
    #   its need 8: 34 + 2 + 8 = 44 > 42 -> waits. r0, r1 decode: r0 gen 3 finishes.
    # step 4: held 23 (r1), growth 1: r2 admitted (23 + 1 + 8 = 32), prefills its 7
    #   tokens (prompt + 2 generated) -> gen 3, kv 8 (no first-token time change).
    c = cluster(C=42.0)
    snaps = K.simulate([0, 0, 0], [10, 20, 5], [3, 8, 8], c, "vllm-dp", {}, 200)
    assert [s["preempted"] for s in snaps[:4]] == [[], [], [2], []]
    s3 = snaps[2]
    assert s3["status"].tolist() == [3, 2, 1]
    assert s3["target"].tolist() == [10, 20, 7] and s3["done"][2] == 0 and s3["kv"][2] == 0
    assert s3["gen"].tolist() == [3, 3, 2]
    s4 = snaps[3]
    assert s4["status"].tolist() == [3, 2, 2]
    assert s4["kv"].tolist() == [0, 24, 8] and s4["gen"].tolist() == [3, 4, 3]
    assert s4["done"][2] == 7 and s4["t_first"][2] == 1.25
    assert all(s["T"] == 1.25 for s in snaps)
    assert snaps[-1]["status"].tolist() == [3, 3, 3]
    assert sum(len(s["preempted"]) for s in snaps) == 1


@pytest.mark.parametrize("coordinated", [True, False])
def test_c_kunserve_drop_merges_two_throttled_singletons(coordinated):
    # N 2, C 100, W 60. r0 (p50) -> g0, r1 (p40) -> g1 (load 0.51 > 0) at t 0.
    # step 1: g0 (tie on clock 0, smaller gid) prefills r0 (T 1.25); step 2: g1, r1.
    # r2, r3 (p70, o3) arrive at 0.1; step 3: t = 0.1: r2 -> g1 (0.41 < 0.51), r3 -> g0
    #   (0.51 < 1.12). Throttled: g0 51 + 71 > 100, g1 41 + 71 > 100;
    #   R = 22 + 12 = 34 <= W: one merge (0, 1), new group {0, 1}, clock max(1.25, 1.25).
    #   Exchange: a = b = 1, bytes = max(51, 41) / 2 * 1000 = 25500;
    #   x = 25500 / 1e6 + ceil(25500 / 1024) * 1e-3 = 0.0255 + 25e-3 = 0.0505:
    #   r0, r1 stall until 1.3005, the group's exchange ends then.
    #   Round at t0 1.25: r0, r1 stalled (growth 0); cap = 2 C + W = 260: r2 (163) and r3
    #   (234 > 2 C) admitted. Work: chunks of 70 + 70 = 140 tokens; lookahead (a = b = 1,
    #   min_tokens 100): the two equal chunks cut at 70 (d = 1, first piece 70 <= 100).
    #   Stage s = max(0.5 * 70 / 100, 0.5) = 0.5 each.
    #   coordinated: delay 1024 / 1e6; a_j = 2 (70 * 100 / 1e6 + 0.001024) = 0.016048;
    #     T_c = 1.016048, T = 1.266048, bubble = 2 T_c - 2 = 0.032096.
    #   uncoordinated: a_j = 0.014, T_c = 1.014, bubble 0.028, then the round waits for
    #     the exchange: T = 1.264 + (1.3005 - 1.25) = 1.3145.
    c = cluster(n_instances=2, C=100.0, coordinated=coordinated)
    kp = dict(KUN, min_tokens=100.0)
    snaps = K.simulate([0, 0, 0.1, 0.1], [50, 40, 70, 70], [5, 5, 3, 3], c, "kunserve", kp,
                       500)
    s1, s2, s3 = snaps[:3]
    assert (s1["picked"], s2["picked"]) == (0, 1)
    assert s1["merges"] == [] and s2["merges"] == []
    assert s3["merges"] == [(0, 1)] and s3["gid"].tolist() == [0, 0]
    assert s3["inst"].tolist() == [0, 1, 1, 0]
    assert s3["stall"][:2].tolist() == pytest.approx([1.3005, 1.3005], rel=1e-12)
    assert s3["exchanging_until"].tolist() == pytest.approx([1.3005, 1.3005], rel=1e-12)
    assert s3["status"].tolist() == [2, 2, 2, 2] and s3["kv"].tolist() == [51, 41, 71, 71]
    assert s3["cuts"] == [70]
    if coordinated:
        assert close(s3["T"], 1.266048) and close(s3["bubble"], 0.032096)
    else:
        assert close(s3["T"], 1.3145) and close(s3["bubble"], 0.028)
    assert s3["clock"].tolist() == pytest.approx([1.25 + s3["T"]] * 2, rel=1e-12)
    assert s3["t_first"][2:].tolist() == pytest.approx([1.25 + s3["T"]] * 2, rel=1e-12)
    assert s3["done"].tolist() == [50, 40, 70, 70] and s3["gen"].tolist() == [1, 1, 1, 1]
    assert snaps[-1]["status"].tolist() == [3, 3, 3, 3]


def test_c2_kunserve_chained_merges_in_one_plan():
    # N 4, C 100, W 60. r0..r3 (p50, o3) on g0..g3, prefilled in steps 1-4 (kv 51, clocks
    # 1.25). r4..r7 (p90, o2) at 0.1: loads all 0.51 -> r4 g0, r5 g1, r6 g2, r7 g3.
    # Every group throttled (51 + 91 > 100), R = 4 * 42 = 168 > 2 W: plan (0,1), (2,3),
    # then (2, 0) (2, 2) -> (0, 2): freed 3 W = 180 >= 168.
    #   (0,1) and (2,3): bytes 51 / 2 * 1000 = 25500, x = 0.0255 + 25e-3 = 0.0505.
    #   (0,2): a = b = 2, held 102 each: bytes = 102 * 2 / 4 * 1000 = 51000 over min(a,b)
    #   = 2 links: x = 51000 / 2e6 + ceil(49.8) * 1e-3 = 0.0255 + 0.05 = 0.0755 ->
    #   stalls max(1.3005, 1.3255) = 1.3255, exchange end 1.3255.
    # One group of 4: cap 4 C + 3 W = 580: r4..r7 admitted (204 + 364 = 568). Round:
    #   360 prefill tokens, one piece (min_tokens 1000): stage s = max(360 * 0.25 / 100,
    #   0.25) = 0.9; a = 4 (360e-4 + 1.024e-3) = 0.148096; T_c = 3.6 + a = 3.748096,
    #   T = 3.998096; bubble = 4 T_c - 4 * 0.9 = 11.392384.
    c = cluster(n_instances=4, C=100.0)
    snaps = K.simulate([0] * 4 + [0.1] * 4, [50] * 4 + [90] * 4, [3] * 4 + [2] * 4, c,
                       "kunserve", KUN, 500)
    assert [s["picked"] for s in snaps[:4]] == [0, 1, 2, 3]
    s5 = snaps[4]
    assert s5["merges"] == [(0, 1), (2, 3), (0, 2)] and s5["gid"].tolist() == [0] * 4
    assert s5["inst"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert s5["stall"][:4].tolist() == pytest.approx([1.3255] * 4, rel=1e-12)
    assert s5["exchanging_until"].tolist() == pytest.approx([1.3255] * 4, rel=1e-12)
    assert s5["status"].tolist() == [2] * 8 and s5["cuts"] == []
    assert close(s5["T"], 3.998096) and close(s5["bubble"], 11.392384)
    assert snaps[-1]["status"].tolist() == [3] * 8


def test_c3_kunserve_merges_the_throttled_high_gid_instance():
    # N 3, C 100, W 60. r0, r1 (p50, o5) and r2 (p10, o5) at t 0 -> g0, g1, g2 (ties:
    # smallest gid), prefilled in steps 1-3 (kv 51, 51, 11; clocks 1.25). r3 (p95, o2)
    # at 0.1: loads 0.51, 0.51, 0.11 -> g2. Throttled: g2 only (11 + 96 > 100; g0, g1
    # have no queue). R = 107 - 100 = 7 <= W: one merge. Heap (1,0,2) (1,1,0) (1,1,1):
    # (2, 0) -> gid [0, 1, 0] (a (size, gid) key would merge (0, 1) and leave g2
    # throttled). The merged group (clock 1.25, the smallest gid on the tie) runs next:
    # r0, r2 stall for the exchange; r3 is admitted in it (62 + 96 <= 2 C + W = 260).
    c = cluster(n_instances=3, C=100.0)
    snaps = K.simulate([0, 0, 0, 0.1], [50, 50, 10, 95], [5, 5, 5, 2], c, "kunserve",
                       KUN, 500)
    assert [s["picked"] for s in snaps[:3]] == [0, 1, 2]
    assert all(s["merges"] == [] for s in snaps[:3])
    s4 = snaps[3]
    assert s4["merges"] == [(2, 0)] and s4["gid"].tolist() == [0, 1, 0]
    assert s4["picked"] == 0 and s4["inst"].tolist() == [0, 1, 2, 2]
    assert s4["status"].tolist() == [2, 2, 2, 2] and s4["kv"][3] == 96
    assert sum(len(s["merges"]) for s in snaps) == 1
    assert snaps[-1]["status"].tolist() == [3] * 4


def test_c3_kunserve_margin_triggers_early_and_can_restore_at_once():
    # N 2, C 100, margin 0.5: r0 (p60) on g0 is throttled at once: 0 + 61 > 0.5 * 100;
    # R = 61 - 50 = 11 -> merge (0, 1) with no KV to move (x = 0: not exchanging). The
    # merged group's load 61 <= theta k C = 100, so 6b starts the restore in the same
    # step (no hysteresis between a positive margin and theta = 0.5): cap 2 C = 200,
    # pull_end = 0 + 0.03. The round prefills r0 (61 <= 200), one piece, chunk delay:
    # s = 0.5, a = 2 (60e-4 + 1.024e-3) = 0.014048 -> T = 1.264048.
    c = cluster(n_instances=2, C=100.0)
    snaps = K.simulate([0.0], [60], [3], c, "kunserve", dict(KUN, margin=0.5), 100)
    s1 = snaps[0]
    assert s1["merges"] == [(0, 1)] and s1["exchanging_until"].tolist() == [0.0, 0.0]
    assert s1["restore_start"] and s1["pull_end"].tolist() == pytest.approx([0.03] * 2)
    assert close(s1["T"], 1.264048)
    # r0 p110 with margin 0.5: R = 111 - 50 = 61 -> merge (0, 1) (one group left); load
    # 111 > theta k C = 100 -> no restore (it is theta of the undropped k C, not of the
    # dropped cap 2 C + W = 260: 0.5 * 260 = 130 would restore); r0 admitted (111 <= 260).
    snaps = K.simulate([0.0], [110], [3], c, "kunserve", dict(KUN, margin=0.5), 100)
    assert snaps[0]["merges"] == [(0, 1)] and not snaps[0]["restore_start"]
    assert snaps[0]["status"].tolist() == [2]
    # margin 0: 61 <= 100, no drop
    snaps = K.simulate([0.0], [60], [3], c, "kunserve", KUN, 100)
    assert all(s["merges"] == [] for s in snaps) and snaps[0]["gid"].tolist() == [0, 1]


def test_d_kunserve_restore_pull_and_balanced_split():
    # N 2, C 100, W 60, theta 0.5, token microbatches of B = 64.
    # r0 (p19, o50) -> g0, r1 (p73, o50) -> g1; step 1 g0 prefills r0 (kv 20), step 2
    #   g1 prefills 64 of r1's 73 tokens (budget k B = 64; kv 74 reserved); clocks 1.25.
    # r2, r3 (p90, o1) at 0.1; step 3: r2 -> g0 (0.2 < 0.74), r3 -> g1 (0.74 < 1.11);
    #   throttled: g0 20 + 91 > 100, g1 74 + 91 > 100, R = 11 + 65 = 76 > W but only two
    #   groups: one merge (0, 1). bytes = max(20, 74) / 2 * 1000 = 37000;
    #   x = 0.037 + ceil(36.13) * 1e-3 = 0.074 -> stalls until 1.324.
    #   Round: r2 admitted (94 + 91 = 185 <= 260), r3 not (276); prefill 90 -> cuts [64];
    #   stage s = 0.5 (weight-bound) for both pieces; a = 2 (64e-4 + 1.024e-3), 2 (26e-4 +
    #   1.024e-3) -> T_c = 1.014848, T 1.264848; r2 finishes (o1).
    # step 4: growth 1 (r0; r1 is still prefilling), r3 admitted (95 + 91 <= 260); load
    #   186 > theta k C = 100 -> no restore. Work: decode r0, r1's last 9, r3's 90 = 100
    #   tokens, cuts [64]; no exchange any more (1.324 < t0) -> no delay: a = 2 * 64e-4,
    #   2 * 36e-4, T = 1.0128 + 0.25. r1 produces its first token; kv 21, 74.
    # step 5: held 95 <= 100 -> restore starts: cap 2 C = 200, pull_end = t0 + 60 * 1000 *
    #   (1 - 1/2) / 1e6 = t0 + 0.03; the round (2 decodes, one piece) pays the chunk delay
    #   while pulling: s = 0.5, a = 2 (2e-4 + 1.024e-3) = 0.002448 -> T = 1.252448.
    # step 6: t0 >= pull_end -> split. K = 22 + 75 = 97 (r0, r1 in index order):
    #   r0: c 0 -> member 0; r1: c 22 -> floor(2 * 22 / 97) = 0 -> member 0 (a count-based
    #   split would send it to 1). Gather: 97 (1 - 1/2) / 2 = 24.25 tokens = 24250 B:
    #   x = 0.02425 + ceil(23.68) * 1e-3 = 0.04825; stalls and both exchange ends t0 + x.
    #   Singleton 0's round: everything stalled -> nothing -> clock t0 + x.
    c = cluster(n_instances=2, C=100.0, B=64, microbatch="token")
    snaps = K.simulate([0, 0, 0.1, 0.1], [19, 73, 90, 90], [50, 50, 1, 1], c, "kunserve",
                       KUN, 2000)
    s3 = snaps[2]
    assert s3["merges"] == [(0, 1)] and s3["cuts"] == [64]
    assert s3["stall"][:2].tolist() == pytest.approx([1.324, 1.324], rel=1e-12)
    assert close(s3["T"], 1.264848) and close(s3["bubble"], 0.029696)
    assert s3["status"].tolist() == [2, 2, 3, 1]
    s4 = snaps[3]
    assert not s4["restore_start"] and s4["status"].tolist() == [2, 2, 3, 3]
    assert close(s4["T"], 1.2628) and s4["cuts"] == [64] and s4["kv"][:2].tolist() == [21, 74]
    assert s4["t_first"][1] == s4["clock"][0]
    s5 = snaps[4]
    t05 = s4["clock"][0]
    assert s5["restore_start"] and s5["restoring"].tolist() == [True, True]
    assert s5["pull_end"].tolist() == pytest.approx([t05 + 0.03] * 2, rel=1e-12)
    assert close(s5["T"], 1.252448) and s5["kv"][:2].tolist() == [22, 75]
    s6 = snaps[5]
    t06 = s5["clock"][0]
    assert t06 >= s5["pull_end"][0]
    assert s6["restore_end"] and s6["gid"].tolist() == [0, 1]
    assert s6["restoring"].tolist() == [False, False]
    assert s6["inst"][:2].tolist() == [0, 0]
    assert s6["stall"][:2].tolist() == pytest.approx([t06 + 0.04825] * 2, rel=1e-12)
    assert s6["exchanging_until"].tolist() == pytest.approx([t06 + 0.04825] * 2, rel=1e-12)
    assert s6["T"] == 0.0 and s6["picked"] == 0
    assert s6["clock"].tolist() == pytest.approx([t06 + 0.04825, t06], rel=1e-12)
    # step 7: singleton 0 at C = 100 holds 97, growth 2 -> 99 fits; plain k = 1 round
    s7 = snaps[6]
    assert s7["picked"] == 0 and s7["T"] == 1.25 and s7["kv"][:2].tolist() == [23, 76]
    assert snaps[-1]["status"].tolist() == [3, 3, 3, 3]


def test_e_infercept_swaps_over_the_host_link():
    # As test b with infercept, host_bw 2000 B/s, kvb 1000.
    # step 3: 44 > 42 -> r2 swapped out (host 7, 7000 B); swap-in check 34 + 2 + 7 = 43 >
    #   42 -> stays; T = max(1.25, 7000 / 2000) = 3.5; r0 finishes at 2.5 + 3.5 = 6.
    # step 4: held 23, growth 1: r2 returns (24 + 7 = 31 <= 42), 7000 B in; it decodes in
    #   this round (Interpretation 6): T = 3.5; r1 kv 24, r2 kv 8.
    c = cluster(C=42.0)
    snaps = K.simulate([0, 0, 0], [10, 20, 5], [3, 8, 8], c, "infercept", {}, 200)
    s3, s4 = snaps[2], snaps[3]
    assert s3["preempted"] == [2] and s3["status"].tolist() == [3, 2, 4]
    assert s3["host"].tolist() == [0, 0, 7] and s3["kv"].tolist() == [0, 23, 0]
    assert s3["target"][2] == 5  # a swap keeps the request's progress
    assert s3["T"] == 3.5 and s3["clock"][0] == 6.0
    assert s4["status"].tolist() == [3, 2, 2] and s4["host"].tolist() == [0, 0, 0]
    assert s4["kv"].tolist() == [0, 24, 8] and s4["T"] == 3.5
    assert snaps[-1]["status"].tolist() == [3, 3, 3]
    # C 43: step 3 exceeds by one token: r2 out (34 + 2 = 36 <= 43); it may not return in
    # the round that preempted it (vLLM's scheduler, doc 7c), so no 1-token overshoot:
    # T = max(1.25, 7000 / 2000) = 3.5. Step 4: 23 + 1 + 7 + 1 (its next token) <= 43.
    snaps = K.simulate([0, 0, 0], [10, 20, 5], [3, 8, 8], cluster(C=43.0), "infercept",
                       {}, 200)
    s3, s4 = snaps[2], snaps[3]
    assert s3["preempted"] == [2] and s3["status"].tolist() == [3, 2, 4]
    assert s3["T"] == 3.5
    assert s4["status"].tolist() == [3, 2, 2] and s4["kv"].tolist() == [0, 24, 8]


def test_f_llumnix_migration_reserves_and_lands():
    # N 2, C 100. r0 (p30) -> g0, r1 (p30) -> g1 at 0; steps 1, 2 prefill them (kv 31).
    # r2 (p70) and r3 (p10) at 0.5: r2 -> g0 (tie 0.31, smaller gid), r3 -> g1 (0.31 <
    #   1.02). step 3 (g0 at 1.25): HOL r2 does not fit (31 + 1 + 71 > 100), nothing in
    #   flight -> r0 (highest index running) migrates to g1 (free 100 - 31 - 11 = 58 >=
    #   31): reserve 31, mig_end = 1.25 + 31 * 1000 / 1e6 = 1.281; r0 keeps decoding on g0.
    # step 4 (g1 at 1.25): not landed yet (1.281 > 1.25); held 31 + 31 reserved; r3
    #   admitted (62 + 1 + 11 <= 100); r1 kv 32, r3 kv 11.
    # step 5 (g0 at 2.5): r0 lands on g1 (inst 1), so it is not in g0's round (it stays at
    #   kv 32 until g1's next round); g0 admits r2 (71 <= 100) and prefills it.
    c = cluster(n_instances=2, C=100.0)
    snaps = K.simulate([0, 0, 0.5, 0.5], [30, 30, 70, 10], [50, 50, 5, 5], c, "llumnix",
                       {}, 2000)
    s3, s4, s5 = snaps[2], snaps[3], snaps[4]
    assert s3["picked"] == 0 and s3["migrations"] == [(0, 1)]
    assert s3["inst"].tolist() == [0, 1, 0, 1] and s3["status"].tolist() == [2, 2, 1, 1]
    assert s3["kv"][0] == 32  # decoded on the source during the copy
    assert s4["picked"] == 1 and s4["inst"][0] == 0 and s4["status"].tolist() == [2, 2, 1, 2]
    assert s4["migrations"] == []
    assert s5["picked"] == 0 and s5["inst"][0] == 1 and s5["status"][2] == 2
    assert s5["kv"].tolist() == [32, 32, 71, 11]
    assert all(s["preempted"] == [] for s in snaps[:5])
    assert snaps[-1]["status"].tolist() == [3, 3, 3, 3]
    # r0 with o2 finishes in step 3 (its decode produces token 2) before the copy lands:
    # the migration is cancelled, r0 never moves, g1's reservation is gone.
    snaps = K.simulate([0, 0, 0.5, 0.5], [30, 30, 70, 10], [2, 50, 5, 5], c, "llumnix",
                       {}, 2000)
    assert snaps[2]["migrations"] == [(0, 1)] and snaps[2]["status"][0] == 3
    assert all(s["inst"][0] == 0 for s in snaps)
    # no migration while the HOL fits: r0, r1 (p20) prefilled, then r2 (p10) -> g0 and r3
    # (p30) -> g1 (0.21 < 0.32). step 3 (g0): 21 + 1 + 11 <= 100 -> r0 stays, although
    # g1 has room for it (100 - 21 - 31 = 48 >= 21).
    snaps = K.simulate([0, 0, 0.5, 0.5], [20, 20, 10, 30], [5, 5, 5, 5], c, "llumnix", {},
                       2000)
    assert snaps[2]["picked"] == 0 and snaps[2]["status"].tolist() == [2, 2, 2, 1]
    assert all(s["migrations"] == [] for s in snaps)
    # the same requests under vllm-dp: r2 waits on g0 until the space frees
    dp = K.simulate([0, 0, 0.5, 0.5], [30, 30, 70, 10], [50, 50, 5, 5], c, "vllm-dp", {},
                    2000)
    assert dp[4]["status"][2] == 1 and dp[4]["inst"][0] == 0


def test_vllm_pp_pairs_and_token_microbatches():
    # N 3 -> groups {0, 1} and {2}. One request p100 o2 on the pair, B 64: budget 128,
    # chunk 100, cuts [64]: stages s = 0.5, 0.5 (weight-bound);
    # a = 2 * 64e-4, 2 * 36e-4 -> T_c = 1.0128, T = 1.2628, bubble 0.0256.
    c = cluster(n_instances=3, C=100.0, B=64)
    snaps = K.simulate([0.0], [100], [2], c, "vllm-pp", {}, 100)
    s1 = snaps[0]
    assert s1["gid"].tolist() == [0, 0, 2] and s1["cuts"] == [64]
    assert close(s1["T"], 1.2628) and close(s1["bubble"], 0.0256)
    assert s1["clock"].tolist() == pytest.approx([1.2628, 1.2628, 0.0], rel=1e-12)
    # the pair's capacity is 2 C + W = 260: a 150-token prompt fits (would not on C)
    snaps = K.simulate([0.0], [150], [1], c, "vllm-pp", {}, 100)
    assert snaps[-1]["status"].tolist() == [3]


# ---- invariants on random runs ---------------------------------------------------------------
LEGAL = {0: {0, 1, 2, 3}, 1: {1, 2, 3}, 2: {1, 2, 3, 4}, 3: {3}, 4: {2, 3, 4}}


def check_invariants(snaps, c, system, arrival, prompt, output):
    N, R = c.n_instances, len(arrival)
    allow = {}  # gid -> tokens a group may hold above its cap until its next round
    prev = None
    for s in snaps:
        gid, st, inst = s["gid"], s["status"], s["inst"]
        # gid consistency: a group is named by its smallest member; members share state
        for i in range(N):
            g = gid[i]
            assert g <= i and gid[g] == g
            mem = [j for j in range(N) if gid[j] == g]
            assert s["clock"][i] == s["clock"][g]
            assert s["exchanging_until"][i] == s["exchanging_until"][g]
            assert s["restoring"][i] == s["restoring"][g]
            if s["restoring"][g]:
                assert s["pull_end"][i] == s["pull_end"][g]
            assert mem[0] == g
        if system != "kunserve":
            want = [2 * (i // 2) if system == "vllm-pp" else i for i in range(N)]
            assert gid.tolist() == want and s["merges"] == [] and not s["restore_start"]
        if system != "llumnix":
            assert s["migrations"] == []
        # per-request sanity
        for r in range(R):
            assert (st[r] == 0) == (inst[r] < 0)
            assert s["kv"][r] >= 0 and s["done"][r] <= s["target"][r]
            assert s["gen"][r] <= output[r]
            if st[r] != 2:
                assert s["kv"][r] == 0
            assert (s["host"][r] > 0) == (st[r] == 4)
            if st[r] == 2:
                assert s["kv"][r] >= s["target"][r] + 1 or s["done"][r] < s["target"][r]
            if st[r] == 3:
                assert s["gen"][r] == output[r] and s["t_finish"][r] >= s["t_first"][r]
        if prev is not None:
            for r in range(R):
                assert st[r] in LEGAL[prev["status"][r]], (r, prev["status"][r], st[r])
                if prev["status"][r] == 2 and st[r] == 1:
                    assert system != "infercept"
                if prev["status"][r] == 2 and st[r] == 4:
                    assert system == "infercept"
            assert np.all(s["clock"] >= prev["clock"])
            # merged groups carry the allowances of their parts
            new_allow = {}
            for g in set(gid.tolist()):
                olds = {int(prev["gid"][i]) for i in range(N) if gid[i] == g}
                new_allow[g] = sum(allow.get(o, 0) for o in olds)
            if s["restore_end"]:
                for i in range(N):
                    if gid[i] == i and prev["gid"][i] == s["picked"]:
                        new_allow[i] = math.inf  # new singletons: until their round
            for r in range(R):  # landings (llumnix) and split homes (kunserve)
                if prev["status"][r] == 2 and st[r] == 2 and inst[r] != prev["inst"][r]:
                    new_allow[int(gid[inst[r]])] = math.inf
            g = s["picked"]
            # swapped in this round: 4 -> 2, or swapped out and straight back (2 -> 4 -> 2)
            swapped_in = sum(1 for r in range(R) if st[r] == 2 and gid[inst[r]] == g and (
                prev["status"][r] == 4 or (system == "infercept" and r in s["preempted"])))
            new_allow[g] = swapped_in  # Interpretation 6 (infercept only, else 0)
            allow = new_allow
        else:
            allow = {int(g): 0 for g in set(gid.tolist())}
        # held KV of every group <= its cap (+ the documented allowance)
        for g in set(gid.tolist()):
            k = int(np.sum(gid == g))
            cap = k * c.C if s["restoring"][g] else k * c.C + (k - 1) * c.W
            held = sum(int(s["kv"][r]) for r in range(R) if st[r] == 2 and gid[inst[r]] == g)
            assert held <= cap + allow.get(int(g), 0), (g, held, cap)
        if s["T"] > 0:
            assert s["bubble"] >= -1e-12
            k = int(np.sum(gid == s["picked"]))
            if k > 1 and s["cuts"]:
                assert all(0 < u for u in s["cuts"]) and s["cuts"] == sorted(set(s["cuts"]))
        prev = s
    assert snaps[-1]["status"].tolist() == [3] * R
    assert np.all(snaps[-1]["t_first"] >= np.asarray(arrival))


@pytest.mark.parametrize("system", K.SYSTEMS)
def test_g_invariants_random_60(system):
    from hardware.deploy import make_deployment
    from hardware.roofline import roofline_params
    hw = roofline_params(make_deployment("a100-80gb", "qwen-2.5-14b"))
    rng = np.random.default_rng(7)
    R = 60
    arrival = np.sort(rng.exponential(0.03, R).cumsum())
    prompt = rng.integers(20, 1500, R)
    output = rng.integers(1, 200, R)
    c = K.Cluster(n_instances=4, C=3000.0, W=2000.0, kvb=hw.kv_bytes_per_token, bw=25e9,
                  host_bw=32e9, act_bytes=hw.activation_bytes_per_token, B=2048,
                  max_batch=64, watermark=30.0, t_chunk=20e-6, block=16, hw=hw, a=1.8e-9,
                  b=5.4e-5)
    params = ({"theta": 0.5, "margin": 0.0, "min_tokens": 256.0, "chunk_mib": 32.0}
              if system == "kunserve" else {})
    snaps = K.simulate(arrival, prompt, output, c, system, params, 20000)
    check_invariants(snaps, c, system, arrival, prompt, output)
    # each system exercised its memory mechanism on this case
    if system == "kunserve":
        assert sum(len(s["merges"]) for s in snaps) > 0
        assert any(s["restore_start"] for s in snaps) and any(s["restore_end"] for s in snaps)
        assert any(s["cuts"] for s in snaps)
    elif system == "llumnix":
        assert sum(len(s["migrations"]) for s in snaps) > 0
    elif system in ("vllm-dp", "infercept"):
        assert sum(len(s["preempted"]) for s in snaps) > 0
    else:
        assert any(s["cuts"] for s in snaps)


# ---- deployment numbers (Interpretation 18) --------------------------------------------
def test_kv_bytes_weight_tokens_and_roofline_of_qwen_14b_on_a100_by_hand():
    from hardware import get_device, get_model
    from hardware.deploy import make_deployment
    from hardware.roofline import roofline_params
    m, d = get_model("qwen-2.5-14b"), get_device("a100-80gb")
    # 48 layers x 8 KV heads x 128 head_dim x (K, V) x 2 bytes = 196,608 B per token
    assert K.kv_bytes_per_token(m) == 48 * 8 * 128 * 2 * 2 == 196_608
    # 14,770,033,664 parameters x 2 bytes = 29,540,067,328 B = 150,248.55 tokens of
    # 196,608 B; with KV 40x larger (the comparison's scaling) 3,756.21 tokens
    assert K.weight_tokens(m, 196_608.0) == pytest.approx(150_248.552083, rel=1e-10)
    assert K.weight_tokens(m, 40 * 196_608.0) == pytest.approx(3_756.213802, rel=1e-9)
    hw = K.roofline_of(m, d)
    assert hw.weight_bytes == 29_540_067_328 and hw.dense_flops_per_token == 29_540_067_328
    assert hw.kv_bytes_per_token == 196_608 and hw.kv_bytes_per_token_layer == 4096
    assert hw.attn_flops_per_ctx_token == 4 * 48 * 40 * 128 == 983_040
    assert (hw.stream_bw, hw.peak_flops, hw.network_bw, hw.host_link_bw) == (
        2.039e12, 312e12, 25e9, 32e9)
    assert hw.mfu == 271.2 / 312.0 and hw.bw_eff == 1.70 / 2.039
    assert (hw.pp, hw.tp, hw.step_overhead_s, hw.allreduces_per_stage) == (1.0, 1.0, 4e-3, 96)
    assert hw.activation_bytes_per_token == 5120 * 2
    # the same as the package's deployment arithmetic (not the code under test)
    assert hw == roofline_params(make_deployment("a100-80gb", "qwen-2.5-14b", tp=1))


def test_solve3_by_hand():
    # x + y + z = 6, 2y + 5z = -4, 2x + 5y - z = 27 -> (5, 3, -2); the zero pivot in
    # column 0 of row 1 and the larger one in row 2 exercise the row swap
    assert K._solve3([[1, 1, 1], [0, 2, 5], [2, 5, -1]], [6, -4, 27]) == pytest.approx(
        [5.0, 3.0, -2.0], rel=1e-12)
    assert K._solve3([[0, 1, 0], [1, 0, 0], [0, 0, 4]], [7, 3, 8]) == pytest.approx(
        [3.0, 7.0, 2.0], rel=1e-12)


def test_cost_model_fit_by_hand():
    rows, ys = K.cost_fit_points(HW)
    # 6 chunk sizes x 3 prefixes + 3 batch sizes x 2 contexts; the first chunk: c = 128,
    # p = 0: 128 * 129 / 2 = 8256 pairs; the last decode row: 128 x (2048 + 1) pairs
    assert len(rows) == 24 and rows[0] == (8256.0, 128.0, 1.0)
    assert rows[-1] == (128 * 2049.0, 128.0, 1.0)
    # toy stage (k = 2): 0.5 FLOP per token at 100 FLOP/s, weights 500 B at 1000 B/s, no
    # attention: every row is compute-bound (c >= 128: 0.005 c >= 0.64 > 0.5) except the
    # decode batches of 8 and 32 (0.04, 0.16 < 0.5: weight-bound, 0.5 s) -> not linear.
    # Weights free instead: y = 0.005 tokens exactly -> a = 0 (clipped), b = 0.005, g = 0.
    a, b, g = K.fit_cost_model(HW._replace(weight_bytes=0.0))
    assert a == pytest.approx(0.0, abs=1e-15) and b == pytest.approx(0.005, rel=1e-9)
    assert g == pytest.approx(0.0, abs=1e-9)
    # all weight-bound (FLOPs free): y = 0.5 s on every row -> a = b = 0, g = 0.5
    a, b, g = K.fit_cost_model(HW._replace(dense_flops_per_token=0.0))
    assert (a, b) == pytest.approx((0.0, 0.0), abs=1e-12) and g == pytest.approx(0.5)
    # the real device: the solution is the least-squares one (residual orthogonal to
    # every column; no coefficient clipped there)
    from hardware import get_device, get_model
    hw = K.roofline_of(get_model("qwen-2.5-14b"), get_device("a100-80gb"))
    coef = K.fit_cost_model(hw)
    assert all(v > 0 for v in coef)
    rows, ys = K.cost_fit_points(hw)
    X, y = np.asarray(rows), np.asarray(ys)
    res = y - X @ np.asarray(coef)
    for j in range(3):
        assert abs(X[:, j] @ res) <= 1e-9 * np.abs(X[:, j]) @ np.abs(y), j
