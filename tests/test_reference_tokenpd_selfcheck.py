"""Hand-worked scenarios for the token-level NumPy reference of the priced-eviction
family (``tests/reference_tokenpd.py``).

Every expected value below is worked out by hand in the comments (see
docs/tokenpd-semantics.md and the Interpretations list in tests/reference_tokenpd.py).
Unless a test says otherwise: recency w_r = 0.3, the class weights h = m = (1, 2, 4, 8)
and v = 0 (the ``tables`` hook), the classes of every token are set by hand (the
``classes`` hook: a list of gids ``k * 4 + k_hat`` per request, gid 0 past its end), an
iteration with work costs exactly 1.0 s and the watermark is 0. Notation: ``it`` =
iteration, ``L`` = a stream's tokens, ``pN`` = position N, "old" = age >= W.
"""

from __future__ import annotations

import math
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import reference_tokenpd as R  # noqa: E402

MASK = 0xFFFFFFFF
TAB = SimpleNamespace(
    h=np.array([1.0, 2.0, 4.0, 8.0], np.float32),
    m=np.array([1.0, 2.0, 4.0, 8.0], np.float32),
    v=np.zeros(4, np.float32),
    cum_p=np.array([0.8, 0.95, 0.99], np.float32),
    cum_conf=np.tile(np.array([0.25, 0.5, 0.75], np.float32), (4, 1)))


class Recorder:
    """step_time returning a constant; records every call's five arguments."""

    def __init__(self, dt=1.0):
        self.dt = dt
        self.calls = []

    def __call__(self, prefill, decode_seqs, decode_ctx, kv_chunk, pairs):
        self.calls.append((prefill, decode_seqs, decode_ctx, kv_chunk, pairs))
        return self.dt


def by_gids(table):
    """classes hook: ``table[req]`` lists the gid of each position (0 past the end)."""
    def classes(req, pos):
        g = np.array([table.get(int(req), [])[p] if p < len(table.get(int(req), []))
                      else 0 for p in np.asarray(pos)], dtype=np.int64)
        return g // 4, g % 4
    return classes


def run(system, prompt, output, *, arrival=None, valid=None, params=None, n_slots=4,
        max_batch=None, max_prefill=10_000, capacity=100, watermark=0.0, window=2,
        gids=None, tables=TAB, timer=None, **kw):
    n = len(prompt)
    arrival = np.zeros(n, np.float32) if arrival is None else np.asarray(arrival,
                                                                          np.float32)
    valid = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    timer = Recorder() if timer is None else timer
    out = R.simulate_reference(
        arrival, np.asarray(prompt), np.asarray(output), valid, system=system,
        params=params or {}, n_slots=n_slots,
        max_batch=n_slots if max_batch is None else max_batch, max_prefill=max_prefill,
        capacity=capacity, watermark=watermark, step_time=timer, window=window,
        tables=tables, classes=None if gids is None and tables is None else
        by_gids(gids or {}), snapshots=True, **kw)
    return out, timer


def snap(out, it):
    s = out["snapshots"][it]
    assert s["it"] == it
    return s


# --------------------------------------------------------------------------------------
# the hash
def fmix32_int(h):
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK
    h ^= h >> 16
    return h


def classes_int(req, pos, cum_p, cum_conf):
    """The spec's hash with Python ints (independent of the NumPy code)."""
    x = (req * 0x9E3779B1 + pos * 0x85EBCA77) & MASK
    u1 = fmix32_int(x) >> 8
    u2 = fmix32_int(x ^ 0x68E31DA4) >> 8
    # u / 2**24 is exact in float64 and in float32; the cuts are float32 values
    k = sum(u1 / 2 ** 24 >= float(c) for c in cum_p)
    kh = sum(u2 / 2 ** 24 >= float(c) for c in cum_conf[k])
    return k, kh


def test_hash_matches_spec_on_hand_values():
    # MurmurHash3's published fmix32(1) and the trivial fixed point 0
    assert fmix32_int(1) == 0x514E28B7 and fmix32_int(0) == 0
    assert int(R.fmix32(np.uint32(1))) == 0x514E28B7
    assert int(R.fmix32(np.uint32(0xDEADBEEF))) == fmix32_int(0xDEADBEEF)
    # req 1, pos 1: 0x9E3779B1 + 0x85EBCA77 = 0x1_2423_4428 -> wraps to 0x24234428
    assert (0x9E3779B1 + 0x85EBCA77) & MASK == 0x24234428
    tab = R._tables(0.3, 0.9, 1.0)
    cum_p = [float(c) for c in tab.cum_p]          # 0.8, 0.95, 0.99 (float32)
    cum_conf = [[float(c) for c in row] for row in tab.cum_conf]
    # req 123456, pos 5000: x = 0xA6481278; fmix32(x) >> 8 = 15144043 -> U1 = 0.90266:
    # >= 0.8, < 0.95 -> k = 1; fmix32(x ^ 0x68E31DA4) >> 8 = 15528227 -> U2 = 0.92555
    # against row 1 (0.3229, 0.7713, 0.9842) -> k_hat = 2; gid 6.
    x = (123456 * 0x9E3779B1 + 5000 * 0x85EBCA77) & MASK
    assert x == 0xA6481278
    assert fmix32_int(x) >> 8 == 15144043
    assert fmix32_int(x ^ 0x68E31DA4) >> 8 == 15528227
    assert classes_int(123456, 5000, cum_p, cum_conf) == (1, 2)
    k, kh = R.token_classes(123456, [5000], tab.cum_p, tab.cum_conf)
    assert (int(k[0]), int(kh[0])) == (1, 2)
    # req 0, pos 0: x = 0, fmix32(0) = 0 -> U1 = 0 -> k = 0; U2 = 4934138 / 2**24 =
    # 0.2941 < 0.8088 -> k_hat = 0.
    assert classes_int(0, 0, cum_p, cum_conf) == (0, 0)
    # a sweep with wrapping request indices: every (k, k_hat) as the int version
    for req in (0, 3, 77, 2 ** 31 + 5):
        pos = np.arange(0, 600, 3)
        k, kh = R.token_classes(req, pos, tab.cum_p, tab.cum_conf)
        want = [classes_int(req, int(p), cum_p, cum_conf) for p in pos]
        assert list(zip(k.tolist(), kh.tolist())) == want
    # req 3 has tokens of all four classes among its first 600 positions (p107 is class
    # 3) and the class frequencies over 20,000 tokens are near p = (.8, .15, .04, .01)
    k, _ = R.token_classes(3, np.arange(600), tab.cum_p, tab.cum_conf)
    assert set(k.tolist()) == {0, 1, 2, 3} and k[107] == 3
    k, _ = R.token_classes(11, np.arange(20_000), tab.cum_p, tab.cum_conf)
    freq = np.bincount(k, minlength=4) / k.size
    assert np.allclose(freq, [0.8, 0.15, 0.04, 0.01], atol=0.01)


def test_attention_shares_and_excess_by_hand():
    h = TAB.h
    # L = 3 < W = 4, classes (0, 1, 3): H = 1 + 2 + 8 = 11; every token is recent:
    # A = 0.3 / 3 + 0.7 h / 11.
    A = R.attention_shares([0, 1, 3], 4, 0.3, h)
    assert np.allclose(A, [0.1 + 0.7 / 11, 0.1 + 1.4 / 11, 0.1 + 5.6 / 11])
    # L = 6, W = 4, classes (3, 0, 0, 0, 0, 0): H = 13; p0, p1 old: 0.7 h / 13; p2..p5
    # recent: 0.3 / 4 + 0.7 / 13.
    A = R.attention_shares([3, 0, 0, 0, 0, 0], 4, 0.3, h)
    assert np.allclose(A, [5.6 / 13, 0.7 / 13] + [0.075 + 0.7 / 13] * 4)
    for L in (1, 2, 4, 5, 9, 40):
        ks = [(7 * i) % 4 for i in range(L)]
        assert math.isclose(R.attention_shares(ks, 4, 0.3, h).sum(), 1.0)
    # g = R_hat - lam sigma^2 - mu with m = (1, 2, 4, 8), v = (.5, 1, 2, 4), lam = 1,
    # mu = 0.1, W = 2, k_hat = (3, 0, 0, 1): H_hat = 12, ring = p2, p3 (0.15 each);
    # sigma^2 = (0.7 / 12)^2 v.
    s = (0.7 / 12) ** 2
    g = R.tokenpd_excess([3, 0, 0, 1], 2, 0.3, TAB.m, [0.5, 1, 2, 4], 1.0, 0.1)
    assert np.allclose(g, [5.6 / 12 - 4 * s - 0.1, 0.7 / 12 - 0.5 * s - 0.1,
                           0.15 + 0.7 / 12 - 0.5 * s - 0.1, 0.15 + 1.4 / 12 - s - 0.1])


# --------------------------------------------------------------------------------------
def test_no_evict_preempts_the_latest_stream_and_recomputes():
    # C = 10. r0 p=4 o=4, r1 p=3 o=3 (r1 is the smaller one: preempting "the largest"
    # would pick r0).
    # it0: r0 (0 + 4 <= 10) and r1 (4 + 3 <= 10) admitted, orders 0 and 1; prefill 7,
    #   pairs 10 + 6 = 16; K = 7; t = 1; gen 1, 1.
    # it1: decode, growth 2: 7 + 2 <= 10; ctx (4+1) + (3+1) = 9; t = 2; L 5, 4; gen 2.
    # it2: 9 + 2 = 11 > 10 -> r1 (latest order) preempted: K 5, growth 1 -> 6 <= 10; r0
    #   decodes, ctx 6; t = 3; r0 L 6, gen 3.
    # it3: walk: protected = all of r0's kept = 6; r1's T = p + gen = 5: 6 + 5 > 10 ->
    #   stop. r0 decodes (ctx 7), gen 4 = o -> finishes (it3, t = 4).
    # it4: r1 re-admitted (T 5, pairs 15): positions 0..4 kept; gen 3 = o -> finishes.
    out, timer = run("no-evict", [4, 3], [4, 3], capacity=10)
    assert out["preemptions"] == 1
    assert out["admit_iter"].tolist() == [0, 0]
    assert out["finish_iter"].tolist() == [3, 4]
    assert out["first_s"].tolist() == [1.0, 1.0]
    assert out["finish_s"].tolist() == [4.0, 5.0]
    assert timer.calls == [(7, 0, 0.0, 16, 16.0), (0, 2, 9.0, 16, 0.0),
                           (0, 1, 6.0, 16, 0.0), (0, 1, 7.0, 16, 0.0),
                           (5, 0, 0.0, 16, 15.0)]
    assert out["peak_kept"] == 9.0
    assert out["queries"] == 4 and out["lost"] == 0.0
    s2 = snap(out, 2)
    assert s2["K"] == 5.0 and s2["streams"][1]["status"] == 2
    assert s2["streams"][1]["ring"] == [(2, 0, 0.0), (3, 0, 0.0)]  # freed, kept L = 4
    s4 = snap(out, 4)
    assert s4["kind"] == "prefill" and s4["streams"][1]["gen"] == 2
    assert len(s4["streams"][1]["ring"]) + s4["streams"][1]["old_n"].sum() == 5
    assert [s["kind"] for s in out["snapshots"]] == ["prefill"] + ["decode"] * 3 + [
        "prefill"]


def test_no_evict_preempts_by_order_not_slot():
    # C = 9, 2 slots. r0 p=2 o=2, r1 p=2 o=6, r2 p=3 o=4 arriving at 1.5.
    # it0: r0 slot 0 (order 0), r1 slot 1 (order 1); K 4; t 1.
    # it1: r2 not arrived (1.5 > 1); decode 4 + 2 <= 9; L 3, 3; r0 gen 2 = o -> done,
    #   slot 0 free; t 2.
    # it2: r2 admitted into slot 0 (order 2): protected 3 + 3 <= 9; K 6; t 3.
    # it3: decode r1, r2: 6 + 2 <= 9; L 4, 4; gen r1 3, r2 2.
    # it4: 8 + 2 = 10 > 9 -> the latest order, r2 in slot 0, is preempted (the highest
    #   slot would be r1); 4 + 1 <= 9: r1 decodes, L 5, gen 4.
    # it5: r2's T = 3 + 2 = 5: protected 5 + 5 > 9 -> waits; r1 decodes (L 6, gen 5).
    # it6: 6 + 5 > 9 -> waits; r1 decodes, gen 6 = o -> done.
    # it7: r2 re-admitted (T 5, pairs 15), gen 3; it8: decode, gen 4 = o -> done.
    out, timer = run("no-evict", [2, 2, 3], [2, 6, 4], arrival=[0, 0, 1.5], n_slots=2,
                     capacity=9)
    assert out["admit_iter"].tolist() == [0, 0, 2]
    assert out["finish_iter"].tolist() == [1, 6, 8]
    assert out["preemptions"] == 1
    s4 = snap(out, 4)["streams"]
    assert (s4[2]["slot"], s4[2]["status"]) == (0, 2)
    assert (s4[1]["slot"], s4[1]["status"]) == (1, 1)
    assert timer.calls[7] == (5, 0, 0.0, 16, 15.0)


def test_fifo_oldest_stream_first_proportional_over_old_groups():
    # W = 2, C = 9. r0 p=3 gids (0, 0, 0), r1 p=6 gids (0, 0, 5, 10, 0, 0); o = 2 each.
    # it0: both admitted (3 + 6 <= 9); K 9, growth 0 -> no eviction.
    # it1: decode, growth 2: 9 + 2 - 9 = 2 to evict. Oldest stream r0: old tokens = p0
    #   only (X = 1) -> p0 evicted, 1 left; r1: old p0..p3 (X = 4) -> each keeps
    #   1 - 1/4 = 0.75: old_x gid0 1.5, gid5 0.75, gid10 0.75. K = 7.
    #   ctx (2 + 1) + (5 + 1) = 9.
    #   Quality: r0 (classes 0, H 3): p0's A = 0.7 / 3 lost. r1: k = (0,0,1,2,0,0),
    #   H = 1+1+2+4+1+1 = 10, old A = 0.07, 0.07, 0.14, 0.28 -> lost 0.25 * 0.56 = 0.14.
    out, timer = run("fifo", [3, 6], [2, 2], capacity=9,
                     gids={0: [0, 0, 0], 1: [0, 0, 5, 10, 0, 0]})
    s1 = snap(out, 1)
    r0, r1 = s1["streams"][0], s1["streams"][1]
    assert r0["old_x"].sum() == 0.0 and r0["old_n"][0] == 1.0
    assert r0["ring"] == [(1, 0, 1.0), (2, 0, 1.0)]
    assert r1["old_x"][0] == 1.5 and r1["old_x"][5] == 0.75 and r1["old_x"][10] == 0.75
    assert r1["old_n"][0] == 2 and r1["old_n"][5] == 1 and r1["old_n"][10] == 1
    assert r1["ring"] == [(4, 0, 1.0), (5, 0, 1.0)]
    assert math.isclose(s1["K"], 7.0)
    assert timer.calls[1] == (0, 2, 9.0, 16, 0.0)
    assert math.isclose(s1["lost"], 0.7 / 3 + 0.14)
    assert math.isclose(s1["U"] + s1["lost"], 2.0)
    assert out["preemptions"] == 0 and out["finish_iter"].tolist() == [1, 1]
    assert out["fluid_evicted"] == [2.0, 0.0]
    # with the JAX family's margin (fluid_extra = (0.01, 1e-5)): evict 2 + 0.01 + 9e-5
    # = 2.01009: r0's p0 (1), then r1's four old tokens lose 1.01009 / 4 each
    # (kept 0.7474775): old_x gid0 1.494955, gid5 and gid10 0.7474775; K = 6.98991.
    out, _ = run("fifo", [3, 6], [2, 2], capacity=9,
                 gids={0: [0, 0, 0], 1: [0, 0, 5, 10, 0, 0]}, fluid_extra=(0.01, 1e-5))
    s1 = snap(out, 1)
    r0, r1 = s1["streams"][0], s1["streams"][1]
    assert r0["old_x"].sum() == 0.0
    assert math.isclose(r1["old_x"][0], 1.494955) and math.isclose(r1["old_x"][5],
                                                                     0.7474775)
    assert math.isclose(r1["old_x"][10], 0.7474775) and math.isclose(s1["K"], 6.98991)
    assert math.isclose(out["fluid_evicted"][0], 2.01009) and out["fluid_evicted"][1] == 0


def test_fifo_preempts_the_latest_when_old_tokens_run_out():
    # W = 2, C = 5. r0 p=3 o=2, r1 p=2 o=2.
    # it0: both admitted (3 + 2 <= 5, fifo protects nothing yet); K 5.
    # it1: growth 2 -> 2 to evict: r0's old p0 (1) evicted, r1 (L 2) has no old token:
    #   K = 4 + 2 > 5 -> r1 (latest) preempted: 2 + 1 <= 5. r0 decodes (ctx 3), done.
    # it2: r1 re-admitted: T = 2 + 1 = 3 (pairs 6), gen 2 -> done.
    out, timer = run("fifo", [3, 2], [2, 2], capacity=5)
    assert out["preemptions"] == 1
    s1 = snap(out, 1)
    assert s1["streams"][0]["old_x"].sum() == 0.0 and s1["streams"][1]["status"] == 2
    assert s1["K"] == 2.0 and s1["growth"] == 1
    assert timer.calls == [(5, 0, 0.0, 16, 9.0), (0, 1, 3.0, 16, 0.0),
                           (3, 0, 0.0, 16, 6.0)]
    assert out["finish_iter"].tolist() == [1, 2]


def test_lru_unused_classes_first_then_used_oldest_stream_first():
    # W = 2, C = 11, 3 streams, o = 2.
    # r0 p=5 gids (15, 15, 0, 0, 0): L 5, H = 8+8+1+1+1 = 19: class 3 used
    #   (0.7*8/19 = 0.295 >= 1/5), class 0 unused (0.7/19 < 1/5); old p0, p1 (used),
    #   p2 (unused).
    # r1 p=4 gids (0, 15, 0, 0): H = 11: class 0 unused (0.064 < 1/4), class 3 used
    #   (0.509); old p0 (unused), p1 (used).
    # r2 p=2: no old token.
    # it0: all admitted (5 + 4 + 2 = 11). it1: growth 3 -> evict 3:
    #   phase 1 (unused, oldest first): r0 p2 (1), r1 p0 (1); phase 2 (used, oldest
    #   first): r0 p0, p1 (X 2) lose 1 -> 0.5 each; r1's used p1 stays.
    #   (fifo would empty r0's old region instead.)
    #   lost: r0 0.5 * 5.6/19 * 2 + 0.7/19 = 6.3/19; r1 0.7/11.
    out, _ = run("lru", [5, 4, 2], [2, 2, 2], capacity=11,
                 gids={0: [15, 15, 0, 0, 0], 1: [0, 15, 0, 0]})
    s1 = snap(out, 1)
    r0, r1 = s1["streams"][0], s1["streams"][1]
    assert r0["old_x"][15] == 1.0 and r0["old_x"][0] == 0.0
    assert r1["old_x"][15] == 1.0 and r1["old_x"][0] == 0.0
    assert math.isclose(s1["K"], 8.0)
    assert math.isclose(s1["lost"], 6.3 / 19 + 0.7 / 11)
    assert out["fluid_evicted"] == [2.0, 1.0]  # unused classes 2, then used ones 1
    out_f, _ = run("fifo", [5, 4, 2], [2, 2, 2], capacity=11,
                   gids={0: [15, 15, 0, 0, 0], 1: [0, 15, 0, 0]})
    f1 = snap(out_f, 1)
    assert f1["streams"][0]["old_x"].sum() == 0.0
    assert f1["streams"][1]["old_x"].sum() == 2
    # H counts every token of the stream, evicted ones too. W = 2, C = 5, r0 p=5 o=3,
    # gids (15, 0, 15, 0, 15, p5: 15).
    # it1 (L 5): H = 8+1+8+1+8 = 26: class 3 used (5.6/26 = 0.215 >= 1/5), class 0 not;
    #   evict 1: the unused old p1 (X 1) -> 0.
    # it2 (L 6): H = 34 (p1 included): class 3 unused (5.6/34 = 0.1647 < 1/6) -> the
    #   unused old tokens are p0, p2 (class 3) and p3 (class 0), X = 3: each keeps 2/3.
    #   (With H over the kept tokens only, 33, class 3 would be used and p3 alone go.)
    #   lost = 1/3 (5.6/34 * 2 + 0.7/34) + 0.7/34 (p1).
    out, _ = run("lru", [5], [3], capacity=5, gids={0: [15, 0, 15, 0, 15, 15]})
    s2 = snap(out, 2)["streams"][0]
    assert math.isclose(s2["old_x"][15], 4 / 3) and math.isclose(s2["old_x"][0], 2 / 3)
    assert math.isclose(snap(out, 2)["lost"], (11.9 / 3 + 0.7) / 34)


def test_h2o_lowest_class_first_keeps_r_newest_and_at_most_k():
    # W = 4, k = 2, r = 2, C = 20. r0 p=8 o=3, gids by position:
    #   p0 4 (class 1), p1 1 (class 0), p2 0, p3 8 (class 2)   -- old (age 7..4)
    #   p4 0, p5 5 (class 1), p6 0, p7 0                        -- ring (age 3..0)
    # it0 (prefill pass): p6, p7 (r newest) protected; eligible p0..p5 (6 > k = 2) ->
    #   evict 4: class 0 first, old groups before ring, old groups in gid order: gid0
    #   (p2), gid1 (p1), then ring p4; then class 1: old p0 before ring p5. Kept p3, p5,
    #   p6, p7.
    # it1 (L 8): eligible kept p3, p5 = 2 -> nothing; decode; append p8 (gid 0).
    #   lost: H = 2+1+1+4+1+2+1+1 = 13: p0 0.7*2/13, p1, p2 0.7/13, p4 0.075 + 0.7/13.
    # it2 (L 9): protected p7, p8; eligible kept p3, p5, p6 = 3 > 2 -> p6 (class 0).
    out, timer = run("h2o", [8], [3], capacity=20, window=4, params={"k": 2, "r": 2},
                     gids={0: [4, 1, 0, 8, 0, 5, 0, 0]})
    s0 = snap(out, 0)["streams"][0]
    assert s0["old_n"][[0, 1, 4, 8]].tolist() == [1, 1, 1, 1]
    assert s0["old_x"].tolist() == [0.0] * 8 + [1.0] + [0.0] * 7
    assert s0["ring"] == [(4, 0, 0.0), (5, 5, 1.0), (6, 0, 1.0), (7, 0, 1.0)]
    s1 = snap(out, 1)
    assert s1["K"] == 4.0
    assert math.isclose(s1["lost"], 0.7 * 4 / 13 + 0.075 + 0.7 / 13)
    s2 = snap(out, 2)["streams"][0]
    assert s2["ring"] == [(5, 5, 1.0), (6, 0, 0.0), (7, 0, 1.0), (8, 0, 1.0)]
    assert timer.calls[0] == (8, 0, 0.0, 16, 36.0)
    assert timer.calls[1] == timer.calls[2] == (0, 1, 5.0, 16, 0.0)


def test_tokenpd_evict_restore_and_price():
    # W = 2, budget 0.5, eta = 4, lam = 1, v = (.5, 1, 2, 4), mu_0 = 0.1, delta 0.5.
    # r0 p=4 o=2, gids (3, 0, 12, 5): k = (0, 0, 3, 1), k_hat = (3, 0, 0, 1).
    # H_hat = 8 + 1 + 1 + 2 = 12, s = (0.7/12)^2.
    # C = 8 -> M = 4 = the hard limit (floor(min(M, C))).
    # it0 (prefill, L 4; 4 <= limit 4 - 0): g = p0 5.6/12 - 4s - mu = 0.353, p1 0.7/12 -
    #   0.5s - mu = -0.0434 < 0 -> evicted; p2 0.15 + 0.7/12 - 0.5s - mu = 0.107, p3
    #   0.15 + 1.4/12 - s - mu = 0.163. K = 3 = D: mu <- 0.1 exp(4 (3 - 4) / 4) = 0.1 / e
    #   = 0.036788.
    # it1 (decode, L 4): p1's g = 0.7/12 - 0.5s - 0.036788 = 0.019845 >= delta mu =
    #   0.018394 -> a restore candidate, D = 4; but K 3 + growth 1 = the limit 4: no
    #   room, so p1 stays evicted (the hard budget wins); ctx 3 + 1 = 4; mu *= exp(0)
    #   (D = M).
    tables = SimpleNamespace(**{**vars(TAB), "v": np.array([0.5, 1, 2, 4], np.float32)})
    params = {"eta": 4.0, "lam": 1.0, "mu_0": 0.1, "delta": 0.5, "budget": 0.5}
    out, timer = run("token-pd", [4], [2], capacity=8, params=params, tables=tables,
                     gids={0: [3, 0, 12, 5]})
    s0 = snap(out, 0)
    assert s0["K"] == 3.0 and s0["D"] == 3.0 and out["limit"] == 4.0
    assert s0["streams"][0]["old_x"].tolist() == [0.0, 0.0, 0.0, 1.0] + [0.0] * 12
    f32 = np.float32
    mu1 = f32(f32(0.1) * f32(np.exp(f32(f32(f32(4.0) * f32(-1.0)) / f32(4.0)))))
    assert s0["mu"] == float(mu1)
    assert math.isclose(float(mu1), 0.1 / math.e, rel_tol=1e-6)
    assert out["restored"] == 0
    assert timer.calls == [(4, 0, 0.0, 16, 10.0), (0, 1, 4.0, 16, 0.0)]
    s1 = snap(out, 1)
    assert s1["K"] == 3.0 and s1["D"] == 4.0 and s1["restored"] == 0
    assert s1["mu"] == float(mu1)
    # p1's lost share at it1: A = 0.7 * h_0 / H, H = 1 + 1 + 8 + 2 = 12; U* keeps all 4
    assert math.isclose(s1["lost"], 0.7 / 12) and math.isclose(s1["U_star"], 1.0)
    assert out["peak_kept"] == 4.0
    assert out["violation_pos"] == 0.0 and out["violation_signed"] == -1.0
    assert out["demand_signed"] == 0.0
    # C = 10 -> M = 5: it0 as above but mu <- 0.1 exp(4 (3 - 5) / 5) = 0.020190; it1:
    #   p1's g = 0.7/12 - 0.5s - 0.020190 = 0.036442 >= 0.010095 and room 5 - 1 - 3 = 1
    #   -> restored (1 prefill token, L = 4 pairs); K = 4, ctx 4 + 1 = 5, peak 5.
    out, timer = run("token-pd", [4], [2], capacity=10, params=params, tables=tables,
                     gids={0: [3, 0, 12, 5]})
    mu1 = f32(f32(0.1) * f32(np.exp(f32(f32(f32(4.0) * f32(-2.0)) / f32(5.0)))))
    assert snap(out, 0)["mu"] == float(mu1)
    assert math.isclose(float(mu1), 0.1 * math.exp(-1.6), rel_tol=1e-6)
    assert out["restored"] == 1
    assert timer.calls == [(4, 0, 0.0, 16, 10.0), (1, 1, 5.0, 16, 4.0)]
    s1 = snap(out, 1)
    assert s1["K"] == 4.0 and s1["D"] == 4.0 and s1["lost"] == 0.0
    assert out["peak_kept"] == 5.0 and out["violation_signed"] == -1.0
    # hysteresis: delta 2 -> threshold 0.040380 > 0.036442 -> p1 stays evicted, D = 3
    out2, timer2 = run("token-pd", [4], [2], capacity=10, tables=tables,
                       params=dict(params, delta=2.0), gids={0: [3, 0, 12, 5]})
    assert out2["restored"] == 0 and timer2.calls[1] == (0, 1, 4.0, 16, 0.0)
    assert snap(out2, 1)["D"] == 3.0
    assert math.isclose(snap(out2, 1)["lost"], 0.7 / 12)
    assert math.isclose(out2["violation_signed"], -2.0)  # K 3 - M 5 at it1
    assert math.isclose(out2["demand_signed"], -2.0)


def test_tokenpd_hard_budget_admission_heap_and_drop():
    # W = 2, all gids 0, v = 0, lam 0, mu 0 (eta 0, mu_0 0): g >= 0 everywhere, so only
    # the hard budget evicts. C = 20, budget 0.3 -> M = 6 = the limit (C allows 20).
    # r0 p=5 o=4, r1 p=2 o=2, both at t 0.
    # it0: r0 admitted (0 + 5 <= 6); r1: 5 + 2 = 7 > 6 -> stops the walk. K 5.
    # it1: r1 meets protected 1 (r0's next token) + 2 = 3 <= 6 -> prefill of r1; K 7 >
    #   6 -> the heap evicts 1 token. K 6.
    # it2: r0 and r1 decode, growth 2: 6 + 2 - 6 = 2 more evicted; K + growth = 6.
    params = {"eta": 0.0, "lam": 0.0, "mu_0": 0.0, "delta": 1.0, "budget": 0.3}
    out, _ = run("token-pd", [5, 2], [4, 2], capacity=20, params=params,
                 gids={0: [0] * 9, 1: [0] * 4})
    assert out["limit"] == 6.0 and out["admit_iter"].tolist() == [0, 1]
    assert snap(out, 0)["K"] == 5.0 and snap(out, 1)["K"] == 6.0
    assert snap(out, 2)["K"] == 4.0 and snap(out, 2)["growth"] == 2
    assert out["peak_kept"] == 6.0 and out["violation_pos"] == 0.0
    assert out["completed"] == 2
    for s in out["snapshots"]:
        assert s["K"] + s["growth"] <= 6.0
    # C = 5, M = 0.3 * 5 = 1.5 -> limit 1: r0's 5 tokens never fit -> dropped
    out, _ = run("token-pd", [5], [4], capacity=5, params=params, gids={0: [0] * 9})
    assert out["limit"] == 1.0 and out["n_dropped"] == 1 and out["completed"] == 0
    # min(M, C): budget 1.5 (M = 30 > C = 20) -> the limit is C
    out, _ = run("token-pd", [5], [4], capacity=20, params=dict(params, budget=1.5),
                 gids={0: [0] * 9})
    assert out["limit"] == 20.0 and out["completed"] == 1


def test_tokenpd_heap_ties_by_flat_unit_index():
    # W = 2, C = 9, mu_0 = 0.01 (constant: eta 0), delta 100 (no restore), v = 0.
    # r0 (slot 0), r1 (slot 1): p=4 o=3, identical gids (5, 1, 0, 0): k_hat = (1,1,0,0),
    # H_hat = 6: old p0, p1: g = 0.7*2/6 - 0.01 = 0.2233 (a tie: same stream, same
    # k_hat, gids 5 and 1); ring p2, p3: 0.15 + 0.7/6 - 0.01 = 0.2567.
    # it0: both admitted (8 <= 9). it1: growth 2 -> evict 1: the lowest g (0.2233) has
    #   four tokens; flat indices slot 0: gid 1 -> 1, gid 5 -> 5; slot 1: 18 + 1, 18 + 5
    #   -> r0's gid-1 token p1 (not p0, the older one). K 7 + 2 = 9.
    # it2 (L 5, p4 gid 0): H_hat 7: old p0, p1 0.2 - 0.01, old p2 (k_hat 0) 0.1 - 0.01,
    #   ring 0.15 + 0.1 - 0.01; K 9 + 2 - 9 = 2 -> p2 of r0 (flat 0) and of r1 (18).
    # budget 1 -> M = C = 9 = the hard limit (0.5 would not admit both streams).
    params = {"eta": 0.0, "lam": 1.0, "mu_0": 0.01, "delta": 100.0, "budget": 1.0}
    g = {0: [5, 1, 0, 0], 1: [5, 1, 0, 0]}
    out, _ = run("token-pd", [4, 4], [3, 3], capacity=9, params=params, gids=g)
    s1 = snap(out, 1)["streams"]
    assert s1[0]["old_x"][1] == 0.0 and s1[0]["old_x"][5] == 1.0
    assert s1[1]["old_x"][1] == 1.0 and s1[1]["old_x"][5] == 1.0
    assert snap(out, 1)["K"] == 7.0
    s2 = snap(out, 2)
    assert s2["K"] == 7.0
    for r in (0, 1):
        assert s2["streams"][r]["old_x"][0] == 0.0 and s2["streams"][r]["old_n"][0] == 1
    assert out["restored"] == 0 and out["mu"] == float(np.float32(0.01))
    # M = 9: no violation at it1 and it2 (K 7 each): -2 - 2
    assert out["violation_pos"] == 0.0 and out["violation_signed"] == -4.0
    # Ring ties go by ring entry p mod W, not age. One stream p=5 W=2 gids
    # (15, 15, 15, 0, 0): old g = 0.7*8/26 - mu = 0.2054, ring p3, p4 = 0.15 + 0.7/26 -
    # mu = 0.1669 (tie). Limit 5 (C = 10, budget 0.5): it1 growth 1 -> evict 1: p4
    # (entry 0, the newest) before p3 (entry 1). Lost: its A = 0.15 + 0.7 / 26 (true
    # classes = predicted here).
    half = dict(params, budget=0.5)
    out, _ = run("token-pd", [5], [2], capacity=10, params=half,
                 gids={0: [15, 15, 15, 0, 0]})
    s1 = snap(out, 1)
    assert s1["streams"][0]["ring"] == [(3, 0, 1.0), (4, 0, 0.0)]
    assert math.isclose(s1["lost"], 0.15 + 0.7 / 26)
    # U* with M = 5 keeps all five tokens: regret = the lost share
    assert math.isclose(s1["U_star"], 1.0)
    assert math.isclose(out["regret"], 0.15 + 0.7 / 26)
    # The knapsack with a fractional M (no-evict, C = 7, the baselines' M = 0.5 C = 3.5)
    # by A descending: the three class-3 tokens (0.7*8/26 = 0.2154 each) before the ring
    # tokens (0.15 + 0.7/26 = 0.1769): all three + half of one ring token.
    out, _ = run("no-evict", [5], [2], capacity=7, gids={0: [15, 15, 15, 0, 0]})
    u_star = 3 * 5.6 / 26 + 0.5 * (0.15 + 0.7 / 26)
    assert math.isclose(snap(out, 1)["U_star"], u_star)
    assert math.isclose(out["regret"], u_star - 1.0)
    # An even L: p=6, gids (15, 15, 15, 15, 0, 0), m_3 = 16 (so that the ring is still
    # the cheapest: H_hat = 4*16 + 2 = 66, old 0.7*16/66 - mu = 0.1597, ring p4, p5
    # 0.15 + 0.7/66 - mu = 0.1506). Limit 6 (C = 12), it1 evicts 1: p4 (entry 0, here the
    # older one) before p5 (entry 1; an entry taken by age, (L-1-p) mod W, would pick p5).
    tab16 = SimpleNamespace(**{**vars(TAB), "m": np.array([1, 2, 4, 16], np.float32)})
    out, _ = run("token-pd", [6], [2], capacity=12, params=half, tables=tab16,
                 gids={0: [15, 15, 15, 15, 0, 0]})
    s1 = snap(out, 1)
    assert s1["streams"][0]["ring"] == [(4, 0, 0.0), (5, 0, 1.0)]
    assert math.isclose(s1["lost"], 0.15 + 0.7 / 34)  # A by the true h: H = 4*8 + 2


def test_tokenpd_restores_only_into_the_room_the_heap_leaves():
    # mu = 0 (mu_0 0, eta 0): delta * mu = 0 -> every evicted token with g >= 0 is a
    # restore candidate, but only into free room after the heap (Interpretation 11).
    # W = 2, C = 10, budget 0.5 -> limit 5, p=5 o=3, gids (15, 15, 15, 0, 0, p5: 0).
    # it1 (L 5): H_hat 26; ring p3, p4 tie at 0.15 + 0.7/26 -> p4 (entry 0) evicted.
    # it2 (L 6): K = 5 (p4 evicted), growth 1 -> the heap evicts 1: p3 (now old,
    #   0.7/27); room = 5 - 1 - 4 = 0 -> p4 (g >= 0) is not restored. ctx = 4 + 1.
    params = {"eta": 0.0, "lam": 1.0, "mu_0": 0.0, "delta": 100.0, "budget": 0.5}
    out, timer = run("token-pd", [5], [3], capacity=10, params=params,
                     gids={0: [15, 15, 15, 0, 0]})
    assert out["restored"] == 0 and snap(out, 2)["restored"] == 0
    assert timer.calls == [(5, 0, 0.0, 16, 15.0), (0, 1, 5.0, 16, 0.0),
                           (0, 1, 5.0, 16, 0.0)]
    s2 = snap(out, 2)["streams"][0]
    assert s2["ring"] == [(4, 0, 0.0), (5, 0, 1.0)]
    assert s2["old_x"][0] == 0.0 and s2["old_x"][15] == 3.0
    assert snap(out, 2)["K"] == 4.0
    # two tokens more of budget (limit 7): no eviction at it1, nothing to restore later
    out, timer = run("token-pd", [5], [3], capacity=14, params=params,
                     gids={0: [15, 15, 15, 0, 0]})
    assert out["restored"] == 0 and snap(out, 2)["K"] == 6.0


def test_admission_protected_tokens_per_system():
    # W = 2, C = 10, all gids 0. r0 p=4 o=4 at t 0; r1 p=4 o=2 arriving at 1.5.
    # it0 prefill r0 (L 4); it1: r1 not arrived (1.5 > 1) -> r0 decodes; L 5 at it2.
    # At it2 r1 (T 4) meets protected =
    #   no-evict: all kept 5 -> 9;  h2o (k 1, r 1): kept 3 (it0 kept p2, p3; p4
    #   appended) -> 7;  fifo / lru: ring 2 -> 6;  token-pd: r0's next token 1 -> 5
    #   (budget 1: its limit is C);
    # against C - watermark. Admitted at it2 when it fits, else after r0 finishes (it3)
    # at it4 (r0 decodes at it2, it3: gen 4 = o).
    params = {"no-evict": {}, "fifo": {}, "lru": {}, "h2o": {"k": 1, "r": 1},
              "token-pd": {"eta": 0.0, "lam": 0.0, "mu_0": 0.0, "delta": 1.0,
                           "budget": 1.0}}
    need = {"no-evict": 9, "h2o": 7, "fifo": 6, "lru": 6, "token-pd": 5}
    for wm in (2.0, 3.5, 5.0, 6.0):
        for system, par in params.items():
            out, _ = run(system, [4, 4], [4, 2], arrival=[0.0, 1.5], capacity=10,
                         watermark=wm, params=par)
            want = 2 if need[system] <= 10 - wm else 4
            assert out["admit_iter"].tolist() == [0, want], (system, wm)
            assert out["completed"] == 2
    # the h2o walk saw 3 kept tokens at it2
    out, _ = run("h2o", [4, 4], [4, 2], arrival=[0.0, 1.5], capacity=10,
                 params=params["h2o"])
    assert snap(out, 1)["after"][0]["old_x"].sum() + sum(
        kept for _, _, kept in snap(out, 1)["after"][0]["ring"]) == 3


def test_drop_rules():
    # (a) C = 10: r0 p=12 > C - 0 with nothing running -> dropped at it0 (no work).
    #     r1 p=3 is then admitted at it1.
    out, timer = run("no-evict", [12, 3], [2, 2], capacity=10)
    assert out["dropped"].tolist() == [True, False]
    assert out["admit_iter"].tolist() == [-1, 1]
    assert out["finish_iter"].tolist() == [-1, 2]
    assert out["iterations"] == 2 and out["loop_iterations"] == 3
    assert snap(out, 0)["kind"] == "idle"
    # (b) a too-big request waits while something runs: r0 p=4 o=2 admitted; r1 p=11
    #     > 10 stops the walk (it0, it1: r0 runs); it2: nothing runs -> r1 dropped;
    #     r2 (behind r1) admitted at it3.
    for system in R.SYSTEMS:
        par = {"k": 4, "r": 2} if system == "h2o" else (
            {"eta": 0.1, "lam": 0.0, "mu_0": 0.0, "delta": 1.0, "budget": 0.5}
            if system == "token-pd" else {})
        kw = {}
        if system == "token-pd-tiers":
            par = {"eta": [0.1] * 4, "lam": [0.0] * 4, "mu_0": [0.0] * 4,
                   "delta": [1.0] * 4, "budget": 0.5}
            kw = {"tier_bounds": (2, 4, 11)}
        out, _ = run(system, [4, 11, 3], [2, 2, 2], capacity=10, params=par, **kw)
        assert out["dropped"].tolist() == [False, True, False], system
        assert out["admit_iter"].tolist() == [0, -1, 3], system
        assert out["finish_iter"].tolist() == [1, -1, 4], system
    # (c) a lone no-evict stream outgrows C = 6: p=4 o=10. it0 L 4; it1 4+1 <= 6, L 5;
    #     it2 5+1 <= 6, L 6; it3 6+1 > 6 -> preempted (idle pass); it4: T = 4 + 3 =
    #     7 > 6, nothing runs -> dropped. Watermark 1 would drop nothing earlier: the
    #     walk test (4 <= 5) passed and growth may use the watermark.
    for wm in (0.0, 1.0):
        out, _ = run("no-evict", [4], [10], capacity=6, watermark=wm)
        assert out["preemptions"] == 1 and out["dropped"].tolist() == [True]
        assert out["admit_iter"].tolist() == [0] and out["first_s"].tolist() == [1.0]
        assert out["iterations"] == 3 and out["loop_iterations"] == 5
        assert [s["kind"] for s in out["snapshots"]] == ["prefill", "decode", "decode",
                                                         "idle", "idle"]


def test_batch_prefill_limits_slots_and_idle_jump():
    # max_batch 2: r0, r1 admitted at it0 (r2 would make 3); max_prefill 5: r0 (p 4),
    # then r1 (p 1): 4 + 1 <= 5 ok. r2 (p 2, o 1) waits for a free batch place:
    # it1 decode r0, r1 (o 2) -> both done; it2 r2 admitted, o 1 -> done at once.
    # r3 arrives at 10.0: it3 idle jump to 10, admitted, done at 11.
    out, timer = run("fifo", [4, 1, 2, 3], [2, 2, 1, 1], arrival=[0, 0, 0, 10],
                     max_batch=2, max_prefill=5)
    assert out["admit_iter"].tolist() == [0, 0, 2, 3]
    assert out["finish_s"].tolist() == [2.0, 2.0, 3.0, 11.0]
    assert out["first_s"].tolist() == [1.0, 1.0, 3.0, 11.0]
    # max_prefill 3: r0 (p 4 > 3) is admitted anyway (the first admission is exempt)
    out, _ = run("fifo", [4, 1], [2, 2], max_prefill=3)
    assert out["admit_iter"].tolist() == [0, 1]
    # max_prefill 4: r1 (4 + 1 > 4) waits; slots 1: one stream at a time
    out, _ = run("fifo", [4, 1], [2, 2], max_prefill=4)
    assert out["admit_iter"].tolist() == [0, 1]
    out, _ = run("fifo", [4, 1], [2, 2], n_slots=1)
    assert out["admit_iter"].tolist() == [0, 2]
    # an invalid row is skipped and never counted
    out, _ = run("token-pd", [4, 50, 3], [2, 2, 2], valid=[True, False, True],
                 params={"eta": 0.1, "lam": 0.0, "mu_0": 0.0, "delta": 1.0,
                         "budget": 0.5})
    assert out["admit_iter"].tolist() == [0, -1, 0] and out["completed"] == 2
    assert out["n_dropped"] == 0 and out["unserved"] == 0


# --------------------------------------------------------------------------------------
SYSTEM_PARAMS = {
    "no-evict": {}, "fifo": {}, "lru": {}, "h2o": {"k": 6, "r": 3},
    "token-pd": {"eta": 0.3, "lam": 1.0, "mu_0": 0.02, "delta": 0.5, "budget": 0.4},
    "token-pd-tiers": {"eta": [0.3, 0.1, 0.5, 0.2], "lam": [1.0, 0.0, 3.0, 0.5],
                       "mu_0": [0.02, 0.05, 0.01, 0.03], "delta": [0.5, 1.0, 0.25, 2.0],
                       "budget": 0.4},
}
TIER_BOUNDS = {"token-pd-tiers": {"tier_bounds": (8, 15, 22)}}  # prompts are 3 .. 29


@pytest.mark.parametrize("system", R.SYSTEMS)
def test_invariants_on_a_random_workload_with_the_real_hash(system):
    rng = np.random.default_rng(7)
    n = 7
    arrival = np.sort(rng.uniform(0.0, 3.0, n)).astype(np.float32)
    prompt = rng.integers(3, 30, n)
    output = rng.integers(1, 14, n)
    valid = np.ones(n, bool)
    valid[4] = False
    C, W = 48, 8
    out = R.simulate_reference(
        arrival, prompt, output, valid, system=system, params=SYSTEM_PARAMS[system],
        n_slots=4, max_batch=3, max_prefill=40, capacity=C, watermark=2.0,
        step_time=lambda p, d, c, k, pr: 0.05 + 0.001 * p + 0.01 * d, window=W,
        snapshots=True, **TIER_BOUNDS.get(system, {}))
    # every valid request accounted for
    assert out["completed"] + out["n_dropped"] == valid.sum()
    assert not out["dropped"][~valid].any() and out["admit_iter"][4] == -1
    M = out["M"]
    queries = 0
    for s in out["snapshots"]:
        assert s["K"] + s["growth"] <= C + 1e-6  # memory never above capacity
        n_dec = s["growth"] if s["kind"] == "decode" else 0
        queries += n_dec
        if s["kind"] == "decode":  # the shares of every stream sum to 1
            assert math.isclose(s["U"] + s["lost"], n_dec, rel_tol=1e-9)
            if s["K"] <= M:
                assert s["U"] <= s["U_star"] + 1e-9
        total = 0.0
        for req, st in s["streams"].items():
            L = int(prompt[req]) + st["gen"] - 1 + (req in s["admitted"])
            assert st["old_n"].sum() + len(st["ring"]) == L
            assert len(st["ring"]) == min(L, W)
            kept = st["old_x"].sum() + sum(x for _, _, x in st["ring"])
            if st["status"] == 2:
                assert kept == 0.0
            else:
                total += kept
            if system in ("fifo", "lru") and st["status"] == 1:
                assert all(x == 1.0 for _, _, x in st["ring"])
            if system == "h2o" and st["status"] == 1:
                assert kept <= 6 + 3
            if system in ("token-pd", "token-pd-tiers", "h2o", "no-evict"):
                assert all(x in (0.0, 1.0) for _, _, x in st["ring"])
                assert np.all(st["old_x"] == np.round(st["old_x"]))
            if system == "no-evict" and st["status"] == 1:
                assert kept == L
        assert math.isclose(total, s["K"], abs_tol=1e-9)
        for req, st in s["after"].items():
            L = int(prompt[req]) + st["gen"] - 1
            assert st["old_n"].sum() + len(st["ring"]) == L
    assert queries == out["queries"]
    assert out["peak_kept"] <= C + 1e-6
    if system in ("token-pd", "token-pd-tiers"):  # the hard budget (Interpretation 17)
        assert out["limit"] == math.floor(M) and out["peak_kept"] <= out["limit"]
        assert all(s["K"] + s["growth"] <= out["limit"] for s in out["snapshots"])
        mus = [np.atleast_1d(s["mu"]) for s in out["snapshots"] if s["kind"] != "idle"]
        for k in range(mus[0].size):  # every price (each tier's) moves
            assert len({float(m[k]) for m in mus}) > 3
