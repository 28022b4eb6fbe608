"""An exported policy in physical units: ``tuner.export.deployment.describe`` (bucket bounds,
pools, server, vLLM arguments, predictor), the family's optional ``deployment`` and the
``tuner.explain`` CLI."""

import json
import shlex

import jax.numpy as jnp
import numpy as np
import pytest

import models
from models import get_system
from tests.fixture_family import TOY  # registers family and system "toy"
from tuner import explain
from tuner.export.deployment import describe
from tuner.export.policy import load_policy, make_policy
from tuner.scenario import ScenarioSpec, build_scenario

SPEC = ScenarioSpec(n_requests=200)
# levels whose rank in the 10,000-long window (tiled from 200 predictions: counts move
# in steps of 50) is no tie: the quantile is then the same in any float precision
NO_TIE_LEVELS = [0.3333, 0.8123, 0.9731]


@pytest.fixture(scope="module")
def sc():
    return build_scenario(SPEC)


def _window(sc):
    """The window the family fills at the start (its prior over the realised lengths or,
    without a history, the rounded predictions)."""
    ring = np.asarray(sc.inputs("odma").extra)
    assert ring.shape == (dict(sc.spec.options).get("window", 10000),)
    return ring


def test_odma_bounds_are_window_quantiles_and_pools_fit(sc):
    ring = _window(sc)
    cap, kvb = float(sc.cfg.capacity_tokens), float(sc.cfg.kv_bytes_per_token)
    for levels in (NO_TIE_LEVELS, [0.5, 0.9, 0.99]):
        d = describe(sc, "odma", {"levels": levels, "gamma": 0.3, "large_share": 0.15})
        der = d["derived"]
        b = der["bucket_bounds_tokens"]
        assert len(b) == len(levels) and all(isinstance(x, int) for x in b)
        assert np.all(np.diff(b) >= 0) and max(b) <= sc.cfg.max_len
        assert der["bucket_levels"] == levels and der["max_len_tokens"] == sc.cfg.max_len
        if levels is NO_TIE_LEVELS:  # the window rule min{x : F(x) >= p}
            ref = np.quantile(ring, levels, method="inverted_cdf")
            assert b == [int(x) for x in ref]
        else:  # a level on the CDF (p * window a count): either side of the tie
            lo = np.quantile(ring, np.asarray(levels) - 1e-6, method="inverted_cdf")
            hi = np.quantile(ring, np.asarray(levels) + 1e-6, method="inverted_cdf")
            assert np.all((lo <= b) & (np.asarray(b) <= hi))
        pools = der["pools"]
        assert set(pools) == {"normal", "large"}
        for pool in pools.values():
            assert pool["bytes_per_device"] == pool["tokens"] * kvb
        assert pools["large"]["tokens"] == int(np.floor(np.float32(0.15) * np.float32(cap)))
        assert pools["normal"]["tokens"] + pools["large"]["tokens"] <= cap
        assert pools["large"]["share_of_capacity"] == 0.15
        rules = der["reservation"]
        assert rules["gamma"] == 0.3 and rules["tau"] == 0.8
        assert "gamma" in rules["estimate_tokens"] and "tau" in rules["large_pool_if"]
        assert der["kv_bytes_per_token_per_device"] == kvb
    json.dumps(d, allow_nan=False)  # JSON-ready


def test_fixed_bound_systems_give_their_bounds(sc):
    cap = int(float(sc.cfg.capacity_tokens))
    ml = sc.cfg.max_len
    static = describe(sc, "static", {})["derived"]
    assert static["bucket_bounds_tokens"] == [ml]
    assert static["pools"] == {"normal": {"tokens": cap, "bytes_per_device":
                                          cap * float(sc.cfg.kv_bytes_per_token)}}
    assert static["reservation"]["on_overflow"] is None
    paged = describe(sc, "paged", {"block_size": 32})
    assert paged["derived"]["bucket_bounds_tokens"] == [32]
    assert paged["derived"]["reservation"]["block_size"] == 32
    assert paged["vllm"]["args"]["--block-size"] == 32
    s3 = describe(sc, "s3", {})["derived"]
    default = get_system("s3").default_params(ml)["bounds"]
    assert s3["bucket_bounds_tokens"] == [int(x) for x in default]
    custom = describe(sc, "s3", {"bounds": [100, 300.5]})["derived"]
    assert custom["bucket_bounds_tokens"] == [100, 300.5]
    assert set(custom["pools"]) == {"normal"}


def test_parameters_server_and_predictor(sc):
    d = describe(sc, "odma", {"gamma": 0.3})
    spec = get_system("odma")
    assert d["system"] == "odma" and d["format"] == "kvtune.deployment/1"
    assert [p["name"] for p in d["parameters"]] == [p.name for p in spec.params]
    by = {p["name"]: p for p in d["parameters"]}
    assert by["gamma"]["value"] == 0.3 and by["gamma"]["paper_default"] == 0.2
    assert by["levels"]["value"] == [0.5, 0.9, 0.99] and by["tau"]["unit"] == "1"
    assert by["large_share"]["meaning"] == "large-bucket (safety) pool"
    srv, dep = d["server"], sc.deployment
    assert srv["kv_capacity_tokens"] == int(float(sc.cfg.capacity_tokens))
    assert srv["kv_capacity_gib_per_device"] == pytest.approx(
        srv["kv_capacity_tokens"] * float(sc.cfg.kv_bytes_per_token) / 2 ** 30, abs=1e-3)
    assert (srv["tp"], srv["device"], srv["model"]) == (dep.tp, dep.device.name,
                                                         dep.model.name)
    assert srv["gpu_memory_utilization"] == dep.mem_util
    assert srv["weight_bytes_per_device"] == dep.weight_bytes_per_device
    assert (srv["max_len"], srv["max_batch"], srv["max_prefill_tokens_per_iteration"],
            srv["n_slots"]) == (sc.cfg.max_len, SPEC.max_batch, SPEC.max_prefill,
                                SPEC.n_slots)
    assert d["predictor"]["source"] == sc.prediction_source == "error-model"
    assert d["predictor"]["path"] is None and d["predictor"]["note"]
    with pytest.raises(ValueError, match="gamma"):
        describe(sc, "odma", {"gamma": 9.0})


def test_vllm_args_match_the_scenario(sc):
    v = describe(sc, "odma", {})["vllm"]
    a, dep = v["args"], sc.deployment
    assert a["--tensor-parallel-size"] == dep.tp
    assert a["--gpu-memory-utilization"] == dep.mem_util
    assert a["--max-num-seqs"] == SPEC.max_batch
    assert a["--max-num-batched-tokens"] == SPEC.max_prefill
    assert a["--block-size"] == 16
    # every simulated request fits; the context limit and the KV pool bound it
    longest = sc.summary["prompt_tokens"]["max"] + sc.cfg.max_len
    assert longest <= a["--max-model-len"] <= dep.model.max_position
    assert a["--max-model-len"] <= float(sc.cfg.capacity_tokens)
    assert a["--model"] == "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
    assert v["request_max_tokens"] == sc.cfg.max_len
    words = shlex.split(v["command"])
    assert words[:3] == ["vllm", "serve", a["--model"]]
    pairs = dict(zip(words[3::2], words[4::2]))
    assert pairs == {k: str(x) for k, x in a.items() if k != "--model"}


def test_describe_carries_the_measurement_loop(sc, tmp_path):
    d = describe(sc, "paged", {}, policy_path=tmp_path / "tuned.json")
    m = d["measure"]
    assert m["serve"].endswith(d["vllm"]["command"] + " --port 8000")
    words = shlex.split(m["bench"])
    assert words[:3] == ["vllm", "bench", "serve"]
    assert words[words.index("--dataset-path") + 1] == "tuned.dataset.jsonl"
    n = int(np.sum(np.asarray(sc.workload.valid)))
    assert words[words.index("--num-prompts") + 1] == str(n) == str(SPEC.n_requests)
    assert shlex.split(m["calibrate"])[3:5] == ["--measured", "tuned.result.json"]
    lens = m["lengths"]
    assert (lens["requests"], lens["prompt_differs"], lens["output_differs"]) == \
        (n, 0, 0)
    for what in ("prompt_tokens", "output_tokens"):
        for q in ("p50", "p99", "mean", "max"):
            assert lens[what]["simulated"][q] == pytest.approx(sc.summary[what][q])
    default = describe(sc, "odma", {})["measure"]  # no policy path: stem "policy"
    assert default["dataset"]["file"] == "policy.dataset.jsonl"
    json.dumps(d, allow_nan=False)


def test_family_without_deployment_gives_nothing(sc):
    p = {"speed": jnp.float32(1.0)}
    assert models.deployment_values(sc.inputs("toy"), p, sc.options("toy")) == {}
    d = describe(sc, TOY.name, {"speed": 1.5})
    assert d["derived"] == {} and d["parameters"][0]["value"] == 1.5
    assert d["vllm"]["args"]["--block-size"] == 16


def _policy(sc, path):
    m = {"objective": 100.0, "tps": 100.0, "goodput_rps": 1.5,
         "ci": {"objective": [98.0, 102.0]}}
    doc = make_policy(system="odma", params={"gamma": 0.3}, scenario=SPEC,
                      workload={"fingerprint": sc.fingerprint, "summary": sc.summary,
                                "predictions": sc.prediction_source},
                      metrics={"tuned": m, "default": {**m, "objective": 90.0},
                               "baseline": {**m, "objective": 95.0},
                               "baselines": {"static": {**m, "objective": 95.0}}},
                      objective="tps", tuner={}, seed=0)
    doc["deployment"] = describe(sc, "odma", {"gamma": 0.3})
    doc["slo"] = {"ttft_s": 5.0, "tpot_s": 0.15, "source": "test"}
    doc["verdict"] = {"sentence": "deploy the tuned policy."}
    path.write_text(json.dumps(doc))
    return doc


def test_explain_prints_parameters_and_vllm_command(sc, tmp_path, capsys):
    path = tmp_path / "policy.json"
    doc = _policy(sc, path)
    assert load_policy(path)["deployment"] == doc["deployment"]
    assert explain.main([str(path)]) == 0
    out = capsys.readouterr().out
    for name in ("levels", "gamma", "tau", "large_share"):
        assert f"\n  {name} " in out
    assert doc["deployment"]["vllm"]["command"] in out
    assert "100 [98, 102]" in out and "baseline static" in out
    assert "TTFT <= 5 s" in out and "deploy the tuned policy." in out
    assert "bucket_bounds_tokens" in out and "pools.large.bytes_per_device" in out
    assert explain.main([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == doc["deployment"]
    # optional sections missing: still explained, from the registry
    for key in ("deployment", "slo", "verdict"):
        del doc[key]
    doc["metrics"] = {"tuned": {}, "default": {}, "baseline": {}}
    path.write_text(json.dumps(doc))
    assert explain.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "gamma" in out and "vllm serve" not in out


def test_explain_rejects_a_bad_file(sc, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert explain.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    doc = _policy(sc, tmp_path / "ok.json")
    doc["surprise"] = 1  # unknown top-level keys are still rejected
    bad.write_text(json.dumps(doc))
    assert explain.main([str(bad), "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "surprise" in err[0]
    assert explain.main([str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
