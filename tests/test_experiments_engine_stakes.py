"""experiments/engine_stakes.py: vLLM's default setting is scored first, every setting's
KV capacity is the memory profile's, a setting vLLM refuses is listed and not run, the
criterion comes from the goodputs measured, and bad arguments stop before any work."""

import json

import pytest

from experiments import engine_stakes, stakes
from hardware import get_device, get_model
from hardware.memory_profile import vllm_memory_profile


@pytest.mark.needs_traces("sharegpt-8k-lengths.csv")
def test_a_small_grid_scores_the_default_first_and_lists_refusals(tmp_path):
    out = tmp_path / "e"
    assert engine_stakes.main(["--out", str(out), "--cases", "h100-sharegpt",
                               "--seqs", "32", "--tokens", "16,2048", "--utils", "0.9",
                               "--slots", "32", "--realisations", "1", "--quick"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["engine_stakes.json",
                                                     "engine_stakes.md"]
    res = json.loads((out / "engine_stakes.json").read_text())
    assert res["provenance"]["commit"]
    c = res["cases"]["h100-sharegpt"]
    # vLLM V1 on an H100: 1024 sequences (at most the 32 slots run) and 8192 tokens
    assert c["default"] == {"max_num_seqs": 1024, "max_num_batched_tokens": 8192,
                            "gpu_memory_utilization": 0.9, "running_at_most": 32}
    got = [(r["max_num_seqs"], r["max_num_batched_tokens"]) for r in c["settings"]]
    assert got == [(1024, 8192), (32, 2048)]
    # 16 tokens < 32 sequences: vLLM refuses at start-up, with its reason
    assert [(r["max_num_batched_tokens"], r["field"]) for r in c["refused"]] == [
        (16, "max_num_batched_tokens")]
    dev, model = get_device("h100-80gb"), get_model("qwen3-8b")
    for r in c["settings"]:
        prof = vllm_memory_profile(dev, model, max_num_batched_tokens=r[
            "max_num_batched_tokens"], max_num_seqs=r["max_num_seqs"],
            max_model_len=model.max_position, gpu_memory_utilization=0.9)
        assert r["kv_capacity_tokens"] == prof.kv_cache_tokens
    assert c["settings"][0]["kv_capacity_tokens"] < c["settings"][1]["kv_capacity_tokens"]
    for metric in ("goodput_rps", "goodput_expected_rps"):
        r = c[metric]
        vals = [s[metric] for s in c["settings"]]
        assert min(vals) > 0 and r["default"] == vals[0]
        assert r["best"] == max(vals) and r["worst"] == min(vals[1:])
        assert r["best_over_default"] == pytest.approx(r["best"] / r["default"])
        assert r["meets"] == (r["best_over_worst"] >= stakes.BEST_OVER_WORST
                              and r["best_over_default"] >= stakes.BEST_OVER_DEFAULT)
    md = (out / "engine_stakes.md").read_text()
    assert "| h100-sharegpt | goodput_expected_rps | 1024* / 8192 / 0.9 |" in md
    assert "refused: max_num_batched_tokens" in md


@pytest.mark.parametrize("argv, msg", [
    (["--cases", "nope"], "--cases: unknown"),
    (["--seqs", "a"], "--seqs 'a'"),
    (["--tokens", "0"], "--tokens '0'"),
    (["--utils", "1.5"], "--utils '1.5'"),
    (["--realisations", "0"], "--realisations 0"),
    (["--seqs", "64", "--slots", "32"], "--seqs 64 exceeds --slots 32"),
])
def test_bad_arguments_stop_before_any_work(tmp_path, capsys, argv, msg):
    out = tmp_path / "e"
    assert engine_stakes.main(["--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.strip().count("\n") == 0 and not out.exists()
