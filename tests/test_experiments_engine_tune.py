"""experiments/engine_tune.py: auto_tune's memory-utilisation rule steps down exactly
while the server would not start, bad arguments stop before any work, and (slow) a quick
case validates every method on the same held-out samples."""

import json

import pytest

import hardware
from experiments import engine_tune
from models import get_system


def test_auto_tune_util_steps_down_from_098_until_the_server_starts():
    spec = get_system("vllm-v1")
    h100 = hardware.make_deployment("h100-80gb", "qwen3-8b", tp=1, engine="vllm-v1")
    assert engine_tune.auto_tune_util(spec, h100, 128, 512) == (0.98, [])
    # an A100 40GB keeps 0.8 GiB beside 0.98 of its memory: less than the ~1 GiB of
    # CUDA graphs vLLM captures after the KV cache, so auto_tune steps to 0.97
    a100 = hardware.make_deployment("a100-40gb", "qwen3-8b", tp=1, engine="vllm-v1",
                                    engine_args={"max_model_len": 8192})
    u, met = engine_tune.auto_tune_util(spec, a100, 128, 512)
    assert u == 0.97 and len(met) == 1 and "CUDA graphs" in met[0]
    p = {"max_num_seqs": 128.0, "max_num_batched_tokens": 512.0, "block_size": 16.0}
    assert spec.refusal(a100, {**p, "gpu_memory_utilization": 0.98}) is not None
    assert spec.refusal(a100, {**p, "gpu_memory_utilization": 0.97}) is None


@pytest.mark.parametrize("argv, msg", [
    (["--cases", "nope"], "--cases: unknown"),
    (["--evals", "1"], "--evals 1"),
    (["--windows", "0"], "--windows 0"),
    (["--holdout-seeds", "0"], "--holdout-seeds 0"),
])
def test_bad_arguments_stop_before_any_work(tmp_path, capsys, argv, msg):
    out = tmp_path / "e"
    assert engine_tune.main(["--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.strip().count("\n") == 0 and not out.exists()


@pytest.mark.slow  # ~3 min: a quick case end to end
@pytest.mark.needs_traces("sharegpt-8k-lengths.csv")
def test_a_quick_case_validates_every_method_on_the_same_samples(tmp_path):
    out = tmp_path / "e"
    assert engine_tune.main(["--out", str(out), "--cases", "h100-sharegpt-tpot20",
                             "--quick", "--evals", "3", "--windows", "1"]) == 0
    res = json.loads((out / "engine_tune.json").read_text())
    c = res["cases"]["h100-sharegpt-tpot20"]
    assert list(c["methods"]) == list(engine_tune.METHODS)
    d = c["methods"]["default"]
    assert (d["params"]["max_num_seqs"], d["params"]["max_num_batched_tokens"]) \
        == (1024, 8192)
    at = c["methods"]["auto_tune"]
    assert len(at["grid"]) == 8
    best = max(at["grid"], key=lambda g: g["train_goodput_rps"])
    assert {k: at["params"][k] for k in best if k != "train_goodput_rps"} == \
        {k: v for k, v in best.items() if k != "train_goodput_rps"}
    n = {len(m["held_out"]["per_sample"]) for m in c["methods"].values()}
    assert n == {c["methods"]["default"]["held_out"]["n_independent"]}
    for m in ("auto_tune", "cmaes", "tpe"):
        r = c["methods"][m]
        per, ref = r["held_out"]["per_sample"], d["held_out"]["per_sample"]
        assert r["vs_default"]["diff"] == pytest.approx(
            sum(a - b for a, b in zip(per, ref)) / len(per))
    assert "| h100-sharegpt-tpot20 | auto_tune |" in (out / "engine_tune.md").read_text()
