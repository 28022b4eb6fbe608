"""ODMA's prediction settings on the scenario: ``u_calibration="rank"`` makes tau the
share of requests kept in regular buckets, ``pred_quantile`` moves L_hat along the
predictor's length distribution, and bad values fail with one clear error."""

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tuner import evaluate as ev
from tuner.export.policy import load_policy, make_policy
from tuner.scenario import ScenarioSpec, build_scenario, check_spec
from tuner.workloads import error_model as em
from tuner.workloads import predictor as pr
from tuner.workloads.features import FeatureConfig


@pytest.mark.parametrize("tau", [0.5, 0.8, 0.9])
def test_rank_calibration_routes_a_share_one_minus_tau(tau):
    rng = np.random.default_rng(0)
    ref = rng.beta(5.0, 2.0, 5000)   # a raw u bunched near 0.7, as an entropy is
    new = rng.beta(5.0, 2.0, 5000)   # the same distribution, other draws
    assert abs(np.mean(ref > 0.8) - 0.2) > 0.1   # raw: tau = 0.8 means no 20%
    for u in (ref, new):
        r = em.rank_calibrate(u, ref)
        assert r.min() >= 0.0 and r.max() <= 1.0
        assert abs(np.mean(r > tau) - (1.0 - tau)) < 0.02
    # exact on the reference itself (no ties), and order-preserving
    r = em.rank_calibrate(ref, ref)
    assert np.mean(r > tau) == pytest.approx(1.0 - tau, abs=1.0 / ref.size)
    order = np.argsort(ref)
    assert np.all(np.diff(r[order]) >= 0)
    # ties (10 generations of one prompt share u): the routed share never exceeds it
    tied = np.repeat(rng.random(300), 10)
    assert np.mean(em.rank_calibrate(tied, tied) > tau) <= 1.0 - tau + 1e-12
    with pytest.raises(ValueError, match="non-empty, finite reference"):
        em.rank_calibrate([0.5], [])


def test_rank_calibration_through_the_scenario(tmp_path):
    # error-model trace: the history before the slice (>= 200 requests) calibrates
    spec = ScenarioSpec(n_requests=600, offset=1000, n_slots=32, max_batch=32)
    raw, rank = build_scenario(spec), build_scenario(spec.replace(u_calibration="rank"))
    assert np.array_equal(np.asarray(raw.workload.pred_tokens),
                          np.asarray(rank.workload.pred_tokens))
    u = np.asarray(rank.workload.pred_u)
    assert 0.0 <= u.min() and u.max() <= 1.0
    assert abs(np.mean(u > 0.8) - 0.2) < 0.06
    assert not rank.warnings and raw.fingerprint != rank.fingerprint
    # too little history: ranked within the slice, with a warning saying so
    sc = build_scenario(ScenarioSpec(n_requests=300, offset=100, u_calibration="rank",
                                     n_slots=32, max_batch=32))
    assert np.mean(np.asarray(sc.workload.pred_u) > 0.8) == pytest.approx(0.2, abs=0.01)
    assert any("u_calibration rank: only 100 requests before the slice" in w
               for w in sc.warnings)


def test_defaults_keep_the_fingerprint_spec():
    from tuner.scenario.build import _fingerprint_spec

    d = _fingerprint_spec(ScenarioSpec())
    assert "pred_quantile" not in d and "u_calibration" not in d
    d = _fingerprint_spec(ScenarioSpec(pred_quantile=0.9, u_calibration="rank"))
    assert (d["pred_quantile"], d["u_calibration"]) == (0.9, "rank")


def _tiny_predictor(seed=0):
    """An untrained predictor (random weights): L_hat's path without training."""
    fcfg = FeatureConfig()
    edges = pr.EDGES
    model = pr.LengthMLP(16, len(edges) - 1)
    params = model.init(jax.random.key(seed), jnp.zeros((1, fcfg.n_features)))
    lengths = np.geomspace(1, 16000, 4000)
    table = em.class_quantile_table(lengths, edges)
    return pr.Predictor(jax.tree.map(np.asarray, params), fcfg, edges, 16, table, 0.5,
                        200.0, {})


def test_pred_quantile_moves_l_hat_monotonically():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(10), 200)
    table = em.class_quantile_table(np.geomspace(1, 16000, 4000), pr.EDGES)
    levels = (0.1, 0.3, 0.5, 0.7, 0.9, 0.99)
    lh = np.stack([em.mixture_quantile(probs, table, q) for q in levels])
    assert np.all(np.diff(lh, axis=0) >= -1e-9)
    assert np.all(lh[-1] > lh[0])
    # through the predictor: None is the model's own quantile, others move L_hat
    model = _tiny_predictor()
    texts = [f"prompt number {i} about {w}" for i, w in
             enumerate(["cats", "tax law", "poems", "rust", "soup"] * 8)]
    sizes = [len(t.split()) for t in texts]
    base, u0, probs0 = model.predict(texts, sizes)
    assert np.array_equal(base, model.predict(texts, sizes, quantile=0.5)[0])
    prev = None
    for q in levels:
        lq, uq, _ = model.predict(texts, sizes, quantile=q)
        assert np.array_equal(uq, u0)  # u does not depend on the level
        if prev is not None:
            assert np.all(lq >= prev - 1e-9)
        prev = lq
    assert np.all(prev > model.predict(texts, sizes, quantile=0.1)[0])
    with pytest.raises(ValueError, match=r"quantile must be in \(0, 1\)"):
        model.predict(texts, sizes, quantile=1.0)


@pytest.mark.parametrize("kw,needle", [
    ({"pred_quantile": 0.0}, "pred_quantile must be a level"),
    ({"pred_quantile": 1.0}, "pred_quantile must be a level"),
    ({"pred_quantile": float("nan")}, "pred_quantile must be a level"),
    ({"pred_quantile": True}, "pred_quantile must be a level"),
    ({"pred_quantile": "0.9"}, "pred_quantile must be a level"),
    ({"u_calibration": "entropy"}, "u_calibration must be one of raw, rank"),
    ({"u_calibration": None}, "u_calibration must be one of raw, rank"),
])
def test_bad_values_fail_clearly(kw, needle):
    with pytest.raises(ValueError, match=needle):
        check_spec(ScenarioSpec(**kw))


def test_pred_quantile_on_an_error_model_trace_is_refused():
    with pytest.raises(ValueError, match="pred_quantile applies only to traces with "
                                         "prompt text"):
        build_scenario(ScenarioSpec(n_requests=100, pred_quantile=0.9))


def test_cli_flags_and_old_policy_files(tmp_path, capsys):
    ap = argparse.ArgumentParser()
    ev.add_scenario_args(ap)
    spec = ev.spec_from_args(ap.parse_args(["--pred-quantile", "0.8",
                                            "--u-calibration", "rank"]))
    assert (spec.pred_quantile, spec.u_calibration) == (0.8, "rank")
    spec = ev.spec_from_args(ap.parse_args([]))
    assert (spec.pred_quantile, spec.u_calibration) == (None, "raw")
    for argv, needle in ((["--u-calibration", "sigmoid"], "u_calibration must be one"),
                         (["--pred-quantile", "1.5"], "pred_quantile must be a level"),
                         (["--pred-quantile", "0.9"], "applies only to traces with")):
        assert ev.main(["--system", "odma", "--n-requests", "100", "--slots", "32",
                        *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
    # policy files written before these settings load with the defaults
    m = {"objective": 1.0, "tps": 1.0}
    doc = make_policy(system="paged", params={}, workload={"fingerprint": "x"},
                      scenario=ScenarioSpec(n_requests=120, n_slots=32, max_batch=32),
                      metrics={"tuned": m, "default": m, "baseline": m},
                      objective="tps", tuner={}, seed=0)
    for key in ("pred_quantile", "u_calibration"):
        del doc["scenario"][key]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    sc = load_policy(path)["scenario"]
    assert (sc["pred_quantile"], sc["u_calibration"]) == (None, "raw")
    doc["scenario"]["u_calibration"] = "rank"
    doc["scenario"]["pred_quantile"] = 0.9
    path.write_text(json.dumps(doc))
    assert ScenarioSpec.from_dict(load_policy(path)["scenario"]).u_calibration == "rank"
