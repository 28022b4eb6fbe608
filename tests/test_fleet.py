"""A fleet space: one policy per replica (a training scenario each), in one compiled
objective (``FitSettings.fleet``, ``tuner.objective.space.Space`` with a list of base
parameters). Checked against what it stands for: each replica's own single-policy
problem on its own scenario, run separately."""

import jax.numpy as jnp
import numpy as np
import pytest

from models import get_system, validate_params
from tuner.objective.problem import Problem
from tuner.objective.space import Space
from tuner.scenario import ScenarioSpec, build_scenario
from tuner.search import fitting
from tuner.search.feasible import Repair

KW = dict(n_requests=48, model="qwen3-8b", scheduler="chunked", n_slots=32,
          max_batch=32, max_len=2048)


@pytest.fixture(scope="module")
def replicas():
    return [ScenarioSpec(hardware=hw, trace=tr, **KW)
            for hw, tr in (("h100-80gb", "sharegpt"), ("a100-80gb", "azure-conv"))]


def test_a_fleet_space_maps_each_replica_alone():
    """theta and the parameters gain a leading replica axis; each replica's slice maps
    as a one-policy space maps it; replicas with other names are refused."""
    spec = get_system("odma")
    a = validate_params(spec, {}, 4096)
    b = validate_params(spec, {"tau": 0.3}, 4096)
    fleet, one_a, one_b = Space(spec, [a, b]), Space(spec, a), Space(spec, b)
    assert fleet.replicas == 2 and one_a.replicas == 0
    th = fleet.to_theta(fleet.base)
    assert all(np.shape(v)[0] == 2 for v in th.values())
    p = fleet.to_params(th)
    for i, one in enumerate((one_a, one_b)):
        want = one.to_params(one.to_theta(one.base))
        for k in one.names:
            np.testing.assert_allclose(np.asarray(p[k])[i], np.asarray(want[k]),
                                       rtol=1e-6)
        assert fleet.replica(p, i) == pytest.approx(one.human(want))
    assert len(fleet.coords()) == 2 * len(one_a.coords())
    assert fleet != one_a and hash(fleet) != hash(one_a)
    with pytest.raises(ValueError, match="differ in names"):
        Space(spec, [a, {k: v for k, v in b.items() if k != "tau"}])


def test_the_fleet_objective_is_the_mean_of_each_replicas_own(replicas):
    """The fleet's exact objective and its relaxed gradient at a policy per replica
    equal the mean of each replica's own problem (one policy, its own scenario, its own
    ladder row), and the gradient of replica i's slice is replica i's own gradient / R."""
    st = fitting.FitSettings(system="vllm-v1", objective="goodput_rps", fleet=True)
    prob, default = fitting.build_problem(replicas, st)
    assert prob.space.replicas == 2
    assert np.asarray(default["max_num_seqs"]).shape == (2,)
    theta = prob.space.to_theta(prob.space.base)
    theta = {k: v + jnp.asarray([[0.0], [0.4]] if v.ndim == 2 else [0.0, 0.4])
             for k, v in theta.items()}
    v, _ = prob.value(theta)
    _, g, _ = prob.grad(theta, 0.1)
    rates = np.atleast_2d(prob.rates)
    singles, grads = [], []
    for i, sp in enumerate(replicas):
        sc = fitting._train_scenarios([sp], 1)
        base = prob.space.replica(prob.space.base, i)
        space = Space(get_system("vllm-v1"), base)
        row = rates[i] if rates.shape[0] == 2 else rates[0]
        one = Problem(sc, "vllm-v1", space, prob.objective, prob.n_steps, row)
        th_i = {k: np.asarray(x)[i] for k, x in theta.items()}
        singles.append(one.value(th_i)[0])
        grads.append(one.grad(th_i, 0.1)[1])
    assert v == pytest.approx(np.mean(singles), rel=1e-5)
    for i in range(2):
        for k in g:
            np.testing.assert_allclose(np.asarray(g[k])[i], np.asarray(grads[i][k]) / 2,
                                       rtol=1e-4, atol=1e-7)


def test_a_fleet_refusal_is_repaired_on_the_replica_refused(replicas):
    """A refused replica is repaired by moving one of its own flat coordinates; the
    other replica's coordinates do not move."""
    scs = [build_scenario(s) for s in replicas]
    spec = get_system("vllm-v1")
    bases = [validate_params(spec, {}, 2048, sc.hw, sc.deployment) for sc in scs]
    space = Space(spec, bases)
    theta = space.to_theta(space.base)
    # replica 1: a token budget below its sequence count (vLLM refuses it)
    p = space.replica(space.to_params(theta), 1)
    low = space.to_theta({**space.base, "max_num_batched_tokens": jnp.asarray(
        [float(space.replica(space.base, 0)["max_num_batched_tokens"]),
         p["max_num_seqs"] / 2], jnp.float32)})
    theta = {**theta, "max_num_batched_tokens": low["max_num_batched_tokens"]}
    rep = Repair(space, spec.refusal, [sc.deployment for sc in scs])
    assert rep._refused(theta, 1) and not rep._refused(theta, 0)
    grad = {k: jnp.zeros_like(v) for k, v in theta.items()}
    grad["max_num_batched_tokens"] = jnp.ones_like(theta["max_num_batched_tokens"])
    fixed, moved = rep(theta, grad)
    assert moved and all(rep._owner(n, i) == 1 for n, i, _ in moved)
    assert not rep.refused(fixed)
    for k in theta:
        np.testing.assert_array_equal(np.asarray(fixed[k])[0], np.asarray(theta[k])[0])
    with pytest.raises(ValueError, match="deployments"):
        Repair(space, spec.refusal, [scs[0].deployment])


def test_a_fleet_needs_one_seed_per_replica():
    with pytest.raises(ValueError, match="fleet"):
        fitting.FitSettings(fleet=True, crn=2).check()


def test_the_engine_fleet_problem_is_four_replicas_each_with_its_own_policy():
    """bench_tuners' engine-fleet: one scenario per (device, trace), seed s the s-th
    window of each, and fit settings with one policy per replica."""
    from experiments.bench_tuners import PROBLEMS, BenchConfig, _settings

    pb, cfg = PROBLEMS["engine-fleet"], BenchConfig(problems=("engine-fleet",))
    specs = pb.specs(cfg, 2)
    assert [(s.hardware, s.trace) for s in specs] == [
        ("h100-80gb", "sharegpt"), ("h100-80gb", "azure-conv"),
        ("a100-80gb", "sharegpt"), ("a100-80gb", "azure-conv")]
    assert all(s.offset == 2 * s.n_requests for s in specs)
    assert _settings(cfg, pb, 2).fleet and not _settings(cfg, PROBLEMS["engine"], 2).fleet
