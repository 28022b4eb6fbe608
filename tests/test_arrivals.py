"""Arrival processes: replay keeps the pattern, Gamma hits its rate and CV, drift
draws each segment from its own source."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.workloads.arrivals import drift, gamma, poisson, replay
from tuner.workloads.traces import Trace


def test_replay_keeps_the_pattern_and_hits_the_rate():
    t = np.array([3.0, 3.5, 4.0, 7.0, 7.25, 13.0])
    np.testing.assert_array_equal(replay(t), t - 3.0)
    for rate in (0.1, 2.0, 1000.0):
        r = replay(t, rate)
        assert r[0] == 0 and (len(r) - 1) / r[-1] == pytest.approx(rate)
        np.testing.assert_allclose(np.diff(r) / np.diff(r)[0],
                                   np.diff(t) / np.diff(t)[0])


@given(rate=st.floats(0.01, 1e3), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=20, deadline=None, derandomize=True)
def test_replay_of_random_arrivals(rate, seed):
    t = np.sort(np.random.default_rng(seed).uniform(0, 100, 50))
    r = replay(t, rate)
    assert (len(r) - 1) / r[-1] == pytest.approx(rate)
    np.testing.assert_allclose(r / r[-1], (t - t[0]) / (t[-1] - t[0]), atol=1e-12)


@given(rate=st.sampled_from([0.2, 1.0, 5.5, 40.0]),
       cv=st.sampled_from([0.3, 1.0, 1.1, 2.0, 3.0]), seed=st.integers(0, 2**16))
@settings(max_examples=12, deadline=None, derandomize=True)
def test_gamma_hits_rate_and_cv(rate, cv, seed):
    t = gamma(20_000, rate, cv, seed)
    gaps = np.diff(t)
    assert t[0] == 0 and len(t) == 20_000 and np.all(gaps >= 0)
    assert 1 / gaps.mean() == pytest.approx(rate, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_poisson_is_gamma_with_cv_one_and_seeds_are_explicit():
    t = poisson(20_000, 3.0, seed=7)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    np.testing.assert_array_equal(t, poisson(20_000, 3.0, seed=7))
    assert not np.array_equal(t, poisson(20_000, 3.0, seed=8))
    np.testing.assert_array_equal(gamma(1, 3.0, 2.0, 0), [0.0])


@pytest.mark.parametrize("call, match", [
    (lambda: gamma(0, 1.0, 1.0, 0), "n must be an integer >= 1"),
    (lambda: gamma(2.5, 1.0, 1.0, 0), "n must be an integer >= 1"),
    (lambda: gamma(10, 0.0, 1.0, 0), "rate must be a finite number > 0"),
    (lambda: gamma(10, float("nan"), 1.0, 0), "rate must be a finite number > 0"),
    (lambda: gamma(10, 1.0, -1.0, 0), "cv must be a finite number > 0"),
    (lambda: poisson(10, "fast", 0), "rate must be a number > 0"),
    (lambda: replay([1.0, 2.0], rate=-3), "rate must be a finite number > 0"),
    (lambda: replay([4.0], rate=1.0), "span no time"),
    (lambda: replay([4.0, 4.0], rate=1.0), "span no time"),
    (lambda: replay([], rate=1.0), "non-empty"),
    (lambda: replay([0.0, np.inf]), "finite"),
])
def test_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _source(tag: int, n: int, dataset=None) -> Trace:
    prompt = np.arange(1, n + 1) + 1000 * tag
    return Trace(np.arange(n, dtype=float), prompt, prompt + 7, dataset=dataset,
                 source=f"/data/source{tag}.csv")


def test_drift_draws_segments_in_order():
    a, b = _source(1, 50), _source(2, 5, dataset=["b"] * 5)
    out = drift([(a, 30), (b, 12), (a, 4)], seed=0)
    assert len(out) == 46 and out.format == "drift" and out.arrival_s is None
    assert out.dataset == ("source1",) * 30 + ("b",) * 12 + ("source1",) * 4
    assert np.all(out.prompt_tokens[:30] // 1000 == 1)
    assert len(set(out.prompt_tokens[:30])) == 30  # without replacement: 30 <= 50
    assert set(out.prompt_tokens[30:42]) <= set(b.prompt_tokens)  # with replacement
    np.testing.assert_array_equal(out.output_tokens, out.prompt_tokens + 7)
    again = drift([(a, 30), (b, 12), (a, 4)], seed=0)
    np.testing.assert_array_equal(out.prompt_tokens, again.prompt_tokens)


def test_drift_validation():
    with pytest.raises(ValueError, match="at least one"):
        drift([], seed=0)
    with pytest.raises(ValueError, match=r"segments\[0\] must be"):
        drift([(np.arange(3), 2)], seed=0)
    with pytest.raises(ValueError, match=r"segments\[1\] n_requests"):
        drift([(_source(1, 3), 2), (_source(2, 3), 0)], seed=0)
