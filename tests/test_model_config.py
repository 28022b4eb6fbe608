"""tuner.scenario.model_config: a model from its config.json (small configs written here, not
copied from hubs), and ``tuner.memory --model PATH``."""

import json
import re
import subprocess
import sys

import pytest

from tuner.scenario.model_config import model_from_config

# Llama-3.1-8B's shapes (meta-llama/Llama-3.1-8B config.json); its published parameter
# count, 8,030,261,248, is the safetensors total on its Hugging Face page
LLAMA8 = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
          "num_attention_heads": 32, "num_key_value_heads": 8,
          "intermediate_size": 14336, "vocab_size": 128256,
          "max_position_embeddings": 131072, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16", "rope_scaling": {"rope_type": "llama3"}}
TINY_QWEN2 = {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 8,
              "num_attention_heads": 2, "num_key_value_heads": 1,
              "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 64,
              "tie_word_embeddings": True, "torch_dtype": "float16",
              "use_sliding_window": False, "sliding_window": 32}
MOE = {"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 64,
       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
       "intermediate_size": 256, "moe_intermediate_size": 32, "num_experts": 8,
       "num_experts_per_tok": 2, "vocab_size": 100, "max_position_embeddings": 512,
       "torch_dtype": "bfloat16", "decoder_sparse_step": 1, "mlp_only_layers": []}


def _write(tmp_path, cfg, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_llama_shapes_give_the_published_count_and_kv(tmp_path):
    m = model_from_config(_write(tmp_path, LLAMA8))
    s = m.spec
    assert s.n_params == 8_030_261_248 and m.quantization is None
    # K and V, 8 heads of 128, 2 bytes, 32 layers
    assert s.kv_bytes_per_token == 2 * 8 * 128 * 2 * 32
    assert s.head_dim == 128 and s.dtype_bytes == 2 and s.max_position == 131072
    assert "num_key_value_heads=8" in s.source("n_kv_heads")
    assert "hidden_size/num_attention_heads" in s.source("head_dim")
    # a file path works as well as its folder
    assert model_from_config(tmp_path / "m" / "config.json").spec == s


def test_absent_kv_heads_mean_multi_head_attention(tmp_path):
    # Llama-2-7B's shapes, written without num_key_value_heads; its published count is
    # 6,738,415,616 (the safetensors total on its Hugging Face page)
    cfg = {**LLAMA8, "num_hidden_layers": 32, "intermediate_size": 11008,
           "vocab_size": 32000, "max_position_embeddings": 4096}
    del cfg["num_key_value_heads"]
    s = model_from_config(_write(tmp_path, cfg)).spec
    assert s.n_kv_heads == s.n_heads == 32 and s.n_params == 6_738_415_616
    assert "absent" in s.source("n_kv_heads")


def test_a_tiny_config_counted_by_hand(tmp_path):
    s = model_from_config(_write(tmp_path, TINY_QWEN2)).spec
    # per layer: q 8x8, k and v 8x4 each, o 8x8 (head_dim 4), QKV bias 8+4+4, SwiGLU
    # 3x8x16, two norms 2x8; tied embedding 10x8 and the final norm 8
    layer = 64 + 32 + 32 + 64 + 16 + 384 + 16
    assert s.n_params == 2 * layer + 80 + 8
    assert s.tie_word_embeddings and s.n_kv_heads == 1  # window off: not refused


# Gemma-2B's shapes (google/gemma-2b config.json); published: 2.51B parameters
GEMMA2B = {"model_type": "gemma", "num_hidden_layers": 18, "hidden_size": 2048,
           "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
           "intermediate_size": 16384, "vocab_size": 256000,
           "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
           "hidden_act": "gelu"}


def test_gemma_ties_embeddings_unless_told_and_needs_its_head_dim(tmp_path):
    m = model_from_config(_write(tmp_path, GEMMA2B, "g")).spec
    # per layer: q, o 2048 x 2048; k, v 2048 x 256; MLP 3 x 2048 x 16384; 2 norms
    layer = 2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 16384 + 2 * 2048
    assert m.tie_word_embeddings and m.n_params == 18 * layer + 256000 * 2048 + 2048
    assert round(m.n_params / 1e9, 2) == 2.51
    assert m.kv_bytes_per_token == 2 * 18 * 1 * 256 * 2
    assert "gemma's default" in dict(m.sources)["tie_word_embeddings"]
    untied = model_from_config(_write(tmp_path, {**GEMMA2B, "tie_word_embeddings": False},
                                      "u")).spec
    assert untied.n_params == m.n_params + 256000 * 2048
    with pytest.raises(ValueError, match="'head_dim' is missing"):
        model_from_config(_write(tmp_path, {k: v for k, v in GEMMA2B.items()
                                            if k != "head_dim"}, "nohd"))


def test_moe_keeps_every_expert_and_counts_the_active_ones(tmp_path):
    s = model_from_config(_write(tmp_path, MOE)).spec
    assert (s.n_experts, s.n_experts_per_token, s.intermediate_size) == (8, 2, 32)
    # 6 unused experts of 3 x 64 x 32 per layer
    assert s.n_params - s.active_params == 4 * 6 * 3 * 64 * 32
    assert s.head_dim == 32  # explicit, not hidden / heads (16)


def test_text_config_of_a_wrapper(tmp_path):
    inner = {k: v for k, v in LLAMA8.items() if k != "torch_dtype"}
    m = model_from_config(_write(tmp_path, {"text_config": inner,
                                            "torch_dtype": "bfloat16"}))
    assert m.spec.n_params == 8_030_261_248
    with pytest.raises(ValueError, match="'vision_config'"):
        model_from_config(_write(tmp_path, {"text_config": inner, "vision_config": {},
                                            "torch_dtype": "bfloat16"}, "vl"))


# Mistral-Small-3.1-24B's shapes (mistralai/Mistral-Small-3.1-24B-Instruct-2503
# config.json: a mistral3 wrapper, its text model and a pixtral vision tower); its
# published parameter count, 24,011,361,280, is the one keras-hub's preset lists
MISTRAL3 = {"model_type": "mistral3", "multimodal_projector_bias": False,
            "spatial_merge_size": 2, "vision_feature_layer": -1,
            "torch_dtype": "bfloat16",
            "text_config": {"model_type": "mistral", "num_hidden_layers": 40,
                            "hidden_size": 5120, "num_attention_heads": 32,
                            "num_key_value_heads": 8, "head_dim": 128,
                            "intermediate_size": 32768, "vocab_size": 131072,
                            "max_position_embeddings": 131072, "sliding_window": None},
            "vision_config": {"model_type": "pixtral", "num_hidden_layers": 24,
                              "hidden_size": 1024, "num_attention_heads": 16,
                              "head_dim": 64, "intermediate_size": 4096,
                              "patch_size": 14, "num_channels": 3}}


def test_a_pixtral_tower_is_resident_weight_not_text_flops(tmp_path):
    m = model_from_config(_write(tmp_path, MISTRAL3)).spec
    assert m.n_params == 24_011_361_280
    # the tower by hand: patch conv, pre-norm, 24 layers, then the projector's norm,
    # patch merger and two linears into the 5,120-wide text model
    tower = 3 * 14 * 14 * 1024 + 1024 + 24 * (4 * 1024 * 1024 + 3 * 1024 * 4096
                                              + 2 * 1024)
    projector = 1024 + 4 * 1024 * 1024 + 1024 * 5120 + 5120 * 5120
    assert m.n_active_params == m.n_params - tower - projector
    assert "pixtral" in dict(m.sources)["n_params"]
    assert "profiling run" in model_from_config(_write(tmp_path, MISTRAL3, "n")).notes[0]
    assert model_from_config(_write(tmp_path, LLAMA8, "l")).notes == ()
    biased = model_from_config(_write(
        tmp_path, {**MISTRAL3, "multimodal_projector_bias": True}, "b")).spec
    assert biased.n_params == m.n_params + 2 * 5120


@pytest.mark.parametrize("change, field", [
    ({"vision_config": {**MISTRAL3["vision_config"], "model_type": "siglip"}},
     "'vision_config' \\(model_type 'siglip'"),
    ({"model_type": "llava"}, "in a 'llava' wrapper"),
    ({"vision_feature_layer": -2}, "'vision_feature_layer' -2"),
    ({"vision_config": {**MISTRAL3["vision_config"], "patch_size": 0}},
     "vision_config: field 'patch_size'"),
])
def test_vision_towers_it_cannot_count_are_refused(tmp_path, change, field):
    with pytest.raises(ValueError, match=field):
        model_from_config(_write(tmp_path, {**MISTRAL3, **change}))


@pytest.mark.parametrize("change, field", [
    ({"num_hidden_layers": None}, "'num_hidden_layers' is missing"),
    ({"hidden_size": -4096}, "'hidden_size' must be a positive integer"),
    ({"model_type": "phi3"}, "'model_type' 'phi3' is not interpreted"),
    ({"sliding_window": 4096}, "'sliding_window' \\(4096\\) is set"),
    ({"layer_types": ["sliding_attention"] * 32, "sliding_window": None},
     "'sliding_window' is missing"),
    ({"layer_types": ["chunked_attention"] * 32}, "'layer_types' must list 32"),
    ({"layer_types": ["full_attention"] * 31}, "'layer_types' must list 32"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096},
     "'use_sliding_window' is true"),
    ({"attention_bias": True}, "'attention_bias'"),
    ({"torch_dtype": "float32"}, "'torch_dtype' 'float32'"),
    ({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
     "'quantization_config' \\(quant_method 'bitsandbytes'\\)"),
    ({"tie_word_embeddings": "no"}, "'tie_word_embeddings' must be true or false"),
])
def test_what_it_cannot_interpret_is_refused_by_name(tmp_path, change, field):
    cfg = {**LLAMA8, **change}
    if change.get("num_hidden_layers", 0) is None:
        del cfg["num_hidden_layers"]
    with pytest.raises(ValueError, match=field) as e:
        model_from_config(_write(tmp_path, cfg))
    assert "config.json" in str(e.value)


# an llm-compressor FP8 checkpoint's quantization_config (the layout of a
# compressed-tensors "FP8-dynamic" config.json, written here)
CT_FP8 = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"group_0": {
              "targets": ["Linear"],
              "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
              "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}},
          "ignore": ["lm_head"]}


def test_compressed_tensors_fp8_weights_are_vllms_fp8(tmp_path):
    plain = model_from_config(_write(tmp_path, LLAMA8, "plain"))
    ct = model_from_config(_write(tmp_path, {**LLAMA8, "quantization_config": CT_FP8},
                                  "ct"))
    assert plain.quantization is None and ct.quantization == "fp8"
    assert ct.spec.n_params == plain.spec.n_params


def _group(**weights):
    return {"group_0": {"targets": ["Linear"], "weights": weights}}


# llm-compressor's weight-only integer schemes ("W4A16" and the like), in the layout of
# their config.json (written here): 4-bit symmetric weights in groups of 128
W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
         "quantization_status": "compressed", "kv_cache_scheme": None,
         "config_groups": {"group_0": {
             "targets": ["Linear"], "input_activations": None, "output_activations": None,
             "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                         "strategy": "group", "group_size": 128, "actorder": None,
                         "dynamic": False, "observer": "minmax"}}},
         "ignore": ["lm_head"]}


def _ct_int(**weights):
    cfg = json.loads(json.dumps(W4A16))
    cfg["config_groups"]["group_0"]["weights"].update(weights)
    return cfg


@pytest.mark.parametrize("weights, form", [
    ({}, "gptq-4bit-g128"),
    ({"actorder": "group"}, "gptq-4bit-g128-act"),
    ({"actorder": "dynamic"}, "gptq-4bit-g128-act"),
    ({"actorder": "weight"}, "gptq-4bit-g128"),
    ({"num_bits": 8, "group_size": 64}, "gptq-8bit-g64"),
    ({"strategy": "channel", "group_size": None}, "gptq-4bit-g-1"),
])
def test_compressed_tensors_integer_weights_are_gptq_on_marlin(tmp_path, weights, form):
    """vLLM runs compressed-tensors' weight-only integer schemes with the Marlin kernels
    GPTQ uses (CompressedTensorsWNA16): the same bytes as the GPTQ checkpoint of those
    bits, group and act order."""
    ct = model_from_config(_write(tmp_path, {**LLAMA8, "quantization_config":
                                             _ct_int(**weights)}, "ct"))
    assert ct.quantization == form
    m = re.fullmatch(r"gptq-(\d+)bit-g(-?\d+)(-act)?", form)
    gptq = {"quant_method": "gptq", "bits": int(m[1]), "group_size": int(m[2]),
            "desc_act": bool(m[3]), "sym": True}
    ref = model_from_config(_write(tmp_path, {**LLAMA8, "quantization_config": gptq},
                                   "gptq"))
    assert ref.quantization == form and ct.spec.n_params == ref.spec.n_params


@pytest.mark.parametrize("cfg, field", [
    (_ct_int(symmetric=False), "weights.symmetric'"),
    (_ct_int(strategy="tensor"), "weights.strategy'"),
    (_ct_int(group_size=100), "group_size 100"),
    (_ct_int(actorder=True), "weights.actorder'"),
    (_ct_int(num_bits=3), "num_bits 3, type 'int'"),
    ({**_ct_int(), "format": "int-quantized"}, "format' 'int-quantized'"),
    ({**W4A16, "config_groups": {"group_0": {
        **W4A16["config_groups"]["group_0"],
        "input_activations": {"num_bits": 8, "type": "int", "strategy": "token"}}}},
     "input_activations'"),
    ({**W4A16, "config_groups": {**W4A16["config_groups"],
                                 "group_1": CT_FP8["config_groups"]["group_0"]}},
     "mixes weight forms"),
])
def test_compressed_tensors_integer_schemes_it_cannot_count_are_refused(tmp_path, cfg,
                                                                        field):
    with pytest.raises(ValueError, match="field 'quantization_config") as e:
        model_from_config(_write(tmp_path, {**LLAMA8, "quantization_config": cfg}))
    assert e.match(field) and "config.json" in str(e.value)


@pytest.mark.parametrize("change, field", [
    ({"config_groups": _group(num_bits=4, type="int")}, "format' 'float-quantized'"),
    ({"config_groups": _group(num_bits=8, type="float8")}, "type 'float8'"),
    ({"config_groups": {"g": {"targets": ["re:.*mlp.*"], "weights": {}}}},
     "config_groups.g.targets'"),
    ({"config_groups": {}}, "config_groups' must be a non-empty object"),
    ({"ignore": ["lm_head", "re:.*gate"]}, "ignore'"),
    ({"kv_cache_scheme": {"num_bits": 8, "type": "float"}}, "kv_cache_scheme'"),
])
def test_compressed_tensors_schemes_it_cannot_count_are_refused(tmp_path, change, field):
    cfg = {**LLAMA8, "quantization_config": {**CT_FP8, **change}}
    with pytest.raises(ValueError, match="field 'quantization_config." ) as e:
        model_from_config(_write(tmp_path, cfg))
    assert e.match(field) and "config.json" in str(e.value)


# Gemma-2-9B's and Gemma-3-1B's shapes (google/gemma-2-9b and google/gemma-3-1b-pt
# config.json); published parameter counts (safetensors totals on their Hugging Face
# pages): 9,241,705,984 and 999,885,952
GEMMA2_9B = {"model_type": "gemma2", "num_hidden_layers": 42, "hidden_size": 3584,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
             "intermediate_size": 14336, "vocab_size": 256000,
             "max_position_embeddings": 8192, "sliding_window": 4096,
             "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
             "query_pre_attn_scalar": 256, "torch_dtype": "float32"}
GEMMA3_1B = {"model_type": "gemma3_text", "num_hidden_layers": 26, "hidden_size": 1152,
             "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
             "intermediate_size": 6912, "vocab_size": 262144,
             "max_position_embeddings": 32768, "sliding_window": 512,
             "sliding_window_pattern": 6, "torch_dtype": "bfloat16"}


def test_gemma2_and_gemma3_count_their_four_norms_and_local_layers(tmp_path):
    g2 = model_from_config(_write(tmp_path, {**GEMMA2_9B, "torch_dtype": "bfloat16"},
                                  "g2")).spec
    assert g2.n_params == 9_241_705_984 and g2.tie_word_embeddings
    assert (g2.sliding_window, g2.sliding_layers) == (4096, 21)  # layers 0, 2, ..., 40
    g3 = model_from_config(_write(tmp_path, GEMMA3_1B, "g3")).spec
    assert g3.n_params == 999_885_952
    assert (g3.sliding_window, g3.sliding_layers) == (512, 22)  # 26 - 26 // 6 global
    assert "sliding_window_pattern=6" in g3.source("sliding_layers")
    # layer_types, when given, decides; a window-free Mistral is full attention
    types = ["sliding_attention", "full_attention"] * 13
    g3t = model_from_config(_write(tmp_path, {**GEMMA3_1B, "layer_types": types},
                                   "g3t")).spec
    assert g3t.sliding_layers == 13
    mistral = {**LLAMA8, "model_type": "mistral", "sliding_window": 4096}
    assert model_from_config(_write(tmp_path, mistral, "mi")).spec.sliding_layers == 32
    plain = model_from_config(_write(tmp_path, {**mistral, "sliding_window": None},
                                     "mn")).spec
    assert plain.sliding_window is None and plain.sliding_layers == 0


# google/gemma-3-4b-it's config.json layout: a sparse text_config (Hugging Face writes
# only non-default fields) and a SigLIP tower; published count 4,300,079,472
GEMMA3_4B = {"model_type": "gemma3", "mm_tokens_per_image": 256,
             "torch_dtype": "bfloat16",
             "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                             "intermediate_size": 10240, "num_hidden_layers": 34,
                             "sliding_window": 1024,
                             "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
             "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152,
                               "image_size": 896, "intermediate_size": 4304,
                               "num_attention_heads": 16, "num_hidden_layers": 27,
                               "patch_size": 14, "vision_use_head": False}}


def test_gemma3_multimodal_counts_its_siglip_tower_and_class_defaults(tmp_path):
    m = model_from_config(_write(tmp_path, GEMMA3_4B, "g34"))
    s = m.spec
    assert s.n_params == 4_300_079_472  # the published count, tower and projector in
    # text only: 34 layers of (q 2560x2048, k/v 2560x1024, o, MLP 3x2560x10240, four
    # norms, q/k norms) + the tied 262,208 x 2560 embedding + the final norm
    layer = 3 * 5_242_880 + 78_643_200 + 4 * 2560 + 2 * 256
    assert s.n_active_params == 34 * layer + 262_208 * 2560 + 2560
    assert (s.n_heads, s.n_kv_heads, s.head_dim, s.max_position) == (8, 4, 256, 131_072)
    assert "class's default 262208" in s.source("vocab_size")
    assert (s.sliding_window, s.sliding_layers) == (1024, 29)  # 5 global of 34
    assert m.notes and "vision tower" in m.notes[0]
    bad = {**GEMMA3_4B, "vision_config": {**GEMMA3_4B["vision_config"],
                                          "vision_use_head": True}}
    with pytest.raises(ValueError, match="vision_use_head"):
        model_from_config(_write(tmp_path, bad, "bad"))


def test_gemma2_float32_checkpoints_are_refused(tmp_path):
    # google/gemma-2-9b ships float32 weights; vLLM would load them as asked: say so
    with pytest.raises(ValueError, match="'torch_dtype' 'float32'"):
        model_from_config(_write(tmp_path, GEMMA2_9B))


# the quantization_config layouts of AutoGPTQ and AutoAWQ checkpoints (written here)
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
        "sym": True, "damp_percent": 0.01, "true_sequential": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
       "version": "gemm", "modules_to_not_convert": None}


@pytest.mark.parametrize("q, form", [
    (GPTQ, "gptq-4bit-g128"), ({**GPTQ, "desc_act": True}, "gptq-4bit-g128-act"),
    ({**GPTQ, "bits": 8, "group_size": -1}, "gptq-8bit-g-1"), (AWQ, "awq-4bit-g128"),
    ({**AWQ, "group_size": 64, "version": "GEMV"}, "awq-4bit-g64"),
])
def test_gptq_and_awq_configs_name_their_marlin_form(tmp_path, q, form):
    m = model_from_config(_write(tmp_path, {**LLAMA8, "quantization_config": q}))
    assert m.quantization == form
    assert m.spec.n_params == 8_030_261_248  # the shapes are the unquantized model's


@pytest.mark.parametrize("change, field", [
    ({"bits": 3}, "3 bits"), ({"group_size": 100}, "group_size 100"),
    ({"sym": False}, "sym' is False"), ({"bits": None}, "bits' must be an integer"),
    ({"desc_act": "yes"}, "desc_act' must be"),
    ({"checkpoint_format": "marlin"}, "checkpoint_format' 'marlin'"),
    ({"dynamic": {"-:.*mlp.*": {}}}, "dynamic' is set"),
])
def test_gptq_schemes_it_cannot_count_are_refused(tmp_path, change, field):
    cfg = {**LLAMA8, "quantization_config": {**GPTQ, **change}}
    with pytest.raises(ValueError, match="field 'quantization_config") as e:
        model_from_config(_write(tmp_path, cfg))
    assert e.match(field) and "config.json" in str(e.value)


@pytest.mark.parametrize("change, field", [
    ({"bits": 8}, "8 bits"), ({"zero_point": False}, "zero_point' is False"),
    ({"modules_to_not_convert": ["visual"]}, "modules_to_not_convert'"),
    ({"version": "exllama"}, "version' 'exllama'"),
])
def test_awq_schemes_it_cannot_count_are_refused(tmp_path, change, field):
    cfg = {**LLAMA8, "quantization_config": {**AWQ, **change}}
    with pytest.raises(ValueError, match="field 'quantization_config") as e:
        model_from_config(_write(tmp_path, cfg))
    assert e.match(field)


def test_a_fit_scenario_takes_a_config_path_with_its_quantization(tmp_path):
    from tuner.scenario import ScenarioSpec, build_scenario

    awq = _write(tmp_path, {**LLAMA8, "quantization_config": AWQ}, "awq")
    kw = dict(hardware="h100-80gb", n_requests=20, max_model_len=8192)
    q = build_scenario(ScenarioSpec(model=str(awq), **kw))
    plain = build_scenario(ScenarioSpec(model="llama-3.1-8b", **kw))
    assert q.deployment.profile.quantization == "awq-4bit-g128"
    # a quarter of the bytes in the linear layers: less to hold, less to read a step
    ratio = q.hw.weight_bytes / plain.hw.weight_bytes
    assert 0.3 < ratio < 0.4
    assert q.deployment.kv_capacity_tokens > plain.deployment.kv_capacity_tokens
    assert q.fingerprint != plain.fingerprint
    from tuner.export.deployment import vllm_args  # vllm serve takes the checkpoint folder

    assert vllm_args(q)["args"]["--model"] == str(awq)
    assert vllm_args(plain)["args"]["--model"] == "meta-llama/Llama-3.1-8B"
    with pytest.raises(ValueError, match="no such file"):
        build_scenario(ScenarioSpec(model=str(tmp_path / "none" / "config.json"), **kw))


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        model_from_config(tmp_path)  # a folder without config.json
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON"):
        model_from_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        model_from_config(tmp_path)
    q3 = {**MOE, "model_type": "qwen3"}
    del q3["head_dim"]
    with pytest.raises(ValueError, match="'head_dim' is missing"):
        model_from_config(_write(tmp_path, q3, "q3"))


def _memory(*args):
    p = subprocess.run([sys.executable, "-m", "tuner.memory", "--hardware", "h100-80gb",
                        "--max-model-len", "8192", "--json", *args],
                       capture_output=True, text=True)
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else p.stderr)


def test_memory_cli_takes_a_config_path(tmp_path):
    rc, preset = _memory("--model", "llama-3.1-8b")
    rc2, path = _memory("--model", str(_write(tmp_path, LLAMA8)))
    assert rc == rc2 == 0
    assert path["kv_cache_tokens"] == preset["kv_cache_tokens"] > 0
    assert path["weights_gib"] == preset["weights_gib"]
    fp8 = {**LLAMA8, "quantization_config": {"quant_method": "fp8"}}
    rc, q = _memory("--model", str(_write(tmp_path, fp8, "fp8")))
    assert rc == 0 and q["weights_gib"] < 0.6 * preset["weights_gib"]
    rc, err = _memory("--model", str(_write(tmp_path, {**LLAMA8, "model_type": "x"}, "x")))
    assert rc == 2 and err.startswith("error: ") and "model_type" in err
    assert "Traceback" not in err and err.count("\n") == 1
    rc, err = _memory("--model", str(tmp_path / "fp8"), "--quantization", "none")
    assert rc == 2 and "quantization_config fp8" in err
    rc, awq = _memory("--model", str(_write(tmp_path, {**LLAMA8,
                                                       "quantization_config": AWQ}, "a")))
    assert rc == 0 and awq["quantization"] == "awq-4bit-g128"
    assert awq["weights_gib"] < 0.4 * preset["weights_gib"]
