"""Model presets and deployments, pinned against hand calculations."""

import dataclasses
import math

import pytest

import hardware as hw
from hardware import llm as llm_mod

GiB = 2**30

# name -> (layers, kv_heads, head_dim, n_params): hand-copied from the configs.
MODELS = {
    "deepseek-r1-distill-qwen-7b": (28, 4, 128, 7_615_616_512),
    "llama-2-7b": (32, 32, 128, 6_738_415_616),
    "llama-2-70b": (80, 8, 128, 68_976_648_192),
    "llama-3-8b": (32, 8, 128, 8_030_261_248),
    "qwen-2.5-14b": (48, 8, 128, 14_770_033_664),
    "qwen-2.5-72b": (80, 8, 128, 72_706_203_648),
    "opt-13b": (40, 40, 128, 12_853_473_280),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_kv_and_weight_bytes_by_hand(name):
    layers, kv, hd, params = MODELS[name]
    m = hw.get_model(name)
    assert m.kv_bytes_per_token == 2 * layers * kv * hd * 2
    assert m.weight_bytes == 2 * params


def test_spec_kv_numbers():
    assert hw.get_model("deepseek-r1-distill-qwen-7b").kv_bytes_per_token == 57344
    assert hw.get_model("qwen-2.5-14b").kv_bytes_per_token == 196608  # 192 KiB


def _count_params(m, *, qkv_bias, tied):
    """Independent parameter count from shapes (Qwen2 / Llama layouts)."""
    h, kvd = m.hidden_size, m.n_kv_heads * m.head_dim
    attn = 2 * h * h + 2 * h * kvd + (h + 2 * kvd if qkv_bias else 0)
    layer = attn + 3 * h * m.intermediate_size + 2 * h
    return m.n_layers * layer + m.vocab_size * h * (1 if tied else 2) + h


@pytest.mark.parametrize("name", [n for n in MODELS if n != "opt-13b"])
def test_param_counts_match_shapes(name):
    m = hw.get_model(name)
    assert _count_params(m, qkv_bias="llama" not in name, tied=False) == m.n_params


def test_opt_param_count_matches_shapes():
    m = hw.get_model("opt-13b")
    h, f = m.hidden_size, m.intermediate_size
    layer = 4 * (h * h + h) + 2 * h * f + f + h + 4 * h
    assert m.n_layers * layer + m.vocab_size * h + (2048 + 2) * h + 2 * h == m.n_params


def test_kunserve_parameter_shares():
    # KunServe Table 1: 14B on one 80 GB GPU = 34.4%, 72B on four = 42.3%.
    d14 = hw.make_deployment("h800-80gb", "qwen-2.5-14b")
    d72 = hw.make_deployment("h800-80gb", "qwen-2.5-72b")
    assert (d14.tp, d72.tp) == (1, 4)
    assert round(100 * d14.weight_bytes_per_device / (80 * GiB), 1) == 34.4
    assert round(100 * d72.weight_bytes_per_device / (80 * GiB), 1) == 42.3


def test_flops_per_token():
    m = hw.get_model("llama-3-8b")
    assert m.flops_per_token(0) == 2 * 8_030_261_248
    assert m.flops_per_token(1000) == 2 * 8_030_261_248 + 4 * 32 * 4096 * 1000


def test_mlu_tp4_capacity_by_hand():
    d = hw.make_deployment("mlu370-x4", "deepseek-r1-distill-qwen-7b")
    assert (d.tp, d.pp, d.n_devices, d.mem_util) == (4, 1, 4, 0.9)
    act = 2048 * 2 * (4 * 3584 + 2 * 18944 / 4) + 256 * 152064 * 4
    assert d.activation_bytes_per_device == act == 253_231_104
    weights = 7_615_616_512 * 2 / 4
    pool = 24 * GiB * 0.9 - weights - act
    assert d.kv_bytes_per_token_per_device == 57344 / 4
    assert d.kv_bytes_per_token_layer_device == 2 * 1 * 128 * 2  # one KV head each
    assert d.kv_capacity_tokens == math.floor(pool / 14336) == 1_334_527


def test_tp_presets_and_search():
    assert hw.make_deployment("a100-80gb", "llama-2-70b").tp == 2
    assert hw.make_deployment("a100-80gb", "llama-3-8b").tp == 1
    assert hw.make_deployment("l40s-48gb", "llama-2-70b").tp == 4  # 2 is too small
    assert hw.make_deployment("mlu370-x4", "llama-2-7b").tp == 4


def test_kv_heads_replicate_when_tp_exceeds_them():
    d = hw.make_deployment("h100-80gb", "llama-3-8b", tp=16)
    assert d.kv_heads_per_device == 1
    assert d.kv_bytes_per_token_layer_device == 2 * 128 * 2
    with pytest.raises(ValueError, match="n_kv_heads"):
        hw.make_deployment("h100-80gb", "deepseek-r1-distill-qwen-7b", tp=14)


def test_pipeline_and_replicas():
    d = hw.make_deployment("a100-80gb", "llama-2-70b", tp=2, pp=2, n_devices=8)
    assert d.n_replicas == 2
    assert d.weight_bytes_per_device == 2 * 68_976_648_192 / 4
    assert d.kv_bytes_per_token_per_device == 327680 / 4
    with pytest.raises(ValueError, match="multiple"):
        hw.make_deployment("a100-80gb", "llama-2-70b", tp=2, n_devices=3)


def test_infeasible_weights_say_bytes():
    with pytest.raises(hw.InfeasibleError) as err:
        hw.make_deployment("l40s-48gb", "llama-2-70b", tp=1)
    msg = str(err.value)
    assert f"{2 * 68_976_648_192:,}" in msg and f"{48 * GiB * 0.9:,.0f}" in msg
    assert isinstance(err.value, ValueError)


def test_infeasible_when_no_kv_room():
    d = hw.make_deployment("h100-80gb", "llama-3-8b")
    budget = d.device.memory_bytes * d.mem_util - d.weight_bytes_per_device
    with pytest.raises(hw.InfeasibleError, match="holds no token"):
        dataclasses.replace(d, activation_bytes_per_device=budget - 1000.0)


def test_unknown_presets_list_known_names():
    with pytest.raises(ValueError, match="unknown device 'tpu-v9'.*mlu370-x4"):
        hw.get_device("tpu-v9")
    with pytest.raises(ValueError, match="unknown model 'gpt-5'.*qwen-2.5-14b"):
        hw.make_deployment("h100-80gb", "gpt-5")
    assert hw.get_device("MLU370-X4") is hw.get_device("mlu370-x4")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_number_has_a_source(name):
    m = hw.get_model(name)
    for field in llm_mod.NUMERIC_FIELDS:
        assert m.source(field), f"{name}.{field} has no source"


def test_llmspec_validation():
    base = hw.get_model("llama-3-8b")
    with pytest.raises(ValueError, match="n_kv_heads"):
        dataclasses.replace(base, n_kv_heads=5)
    with pytest.raises(ValueError, match="n_layers"):
        dataclasses.replace(base, n_layers=0)
    with pytest.raises(ValueError, match="max_position"):
        dataclasses.replace(base, max_position=4096.5)
