"""vLLM's start-up memory profile (hardware/memory_profile.py), its CLI and its check
against real logs, pinned against arithmetic done by hand from the formulas in the
module docstring (numbers written out, not recomputed by the module)."""

import dataclasses
import json

import pytest

import hardware as hw
from experiments import memory_check as mc
from hardware import memory_profile as mp
from tuner import memory as cli

GiB = 2**30


def test_v1_record_20_llama_3_1_8b_h100_by_hand():
    # CSV record 20: vLLM v0.19.0, H100 (79.19 GiB), util 0.95, max_model_len 8192,
    # defaults 8192 batched tokens / 1024 sequences; log: 476,016 tokens.
    p = hw.vllm_memory_profile("h100-80gb", "meta-llama/Llama-3.1-8B-Instruct",
                               gpu_memory_utilization=0.95, max_model_len=8192)
    assert (p.max_num_batched_tokens, p.max_num_seqs) == (8192, 1024)
    # weights: 8,030,261,248 params x 2 B + rope cache 131072 x 128 x 2 B (32 MiB)
    assert p.weights_bytes == 16_060_522_496 + 33_554_432 == 16_094_076_928
    assert round(p.weights_gib, 2) == 14.99  # log: "weights memory: 14.99GiB"
    # forward: 8192 tokens x (3*4096 + 3*14336) x 2 B
    assert p.forward_peak_bytes == 8192 * 55_296 * 2 == 905_969_664
    # sampler: hidden [8192, 4096] bf16 + logits [1024, 128256] bf16
    #          + 3 fp32 copies [1024, 128256] + 0.117 GiB workspace
    sampler = 67_108_864 + 262_668_288 + 1_576_009_728 + 0.117 * GiB
    assert p.sampler_peak_bytes == pytest.approx(sampler) and sampler > 905_969_664
    assert round(p.activation_gib, 2) == 1.89  # log: "torch peak memory increase"
    assert mp.activation_peak_bytes(p.model, max_num_batched_tokens=8192,
                                    max_num_seqs=1024)["peak"] == p.activation_bytes
    assert p.non_torch_bytes == 0.25 * GiB  # log: 0.25 GiB
    avail = 79.19 * 0.95 * GiB - (16_094_076_928 + sampler + 0.25 * GiB)
    assert p.kv_cache_bytes == pytest.approx(avail)
    assert round(avail / GiB, 2) == 58.10  # log: 58.11 GiB
    # one layer's block: 16 tokens x K,V x 8 heads x 128 x 2 B = 65,536 B; 32 layers
    assert p.kv_cache_blocks == int(avail // 65_536 // 32) == 29_747
    assert p.kv_cache_tokens == 29_747 * 16 == 475_952
    assert abs(475_952 / 476_016 - 1) < 0.001
    assert p.max_concurrency == pytest.approx(29_747 / 512)  # log: 58.11x
    assert p.refusal is None


def test_v1_record_27_qwen_tp2_by_hand():
    # CSV record 27: Qwen2.5-7B-Instruct, TP=2, log 2,390,592 tokens, 63.84 GiB.
    p = hw.vllm_memory_profile("h100-80gb", "Qwen/Qwen2.5-7B-Instruct", tp=2,
                               gpu_memory_utilization=0.95, max_model_len=8192)
    weights = 7_615_616_512 * 2 / 2 + 32_768 * 128 * 2  # half the params + rope
    assert p.weights_bytes == weights == 7_624_005_120
    # sampler (logits all-gathered to the full vocabulary on each rank)
    sampler = 8192 * 3584 * 2 + 1024 * 152_064 * 2 + 3 * 1024 * 152_064 * 4 \
        + 0.117 * GiB
    assert p.forward_peak_bytes == 8192 * (3 * 3584 + 3 * 18_944 // 2) * 2
    assert p.activation_bytes == pytest.approx(sampler)  # TP-invariant, as logged
    assert p.non_torch_bytes == 2.07 * GiB  # NCCL/custom all-reduce at TP=2
    avail = 79.19 * 0.95 * GiB - (weights + sampler + 2.07 * GiB)
    # 4 KV heads / 2 ranks: block = 16 x 2 x 2 x 128 x 2 B = 16,384 B; 28 layers
    assert p.kv_cache_blocks == int(avail // 16_384 // 28) == 149_464
    assert p.kv_cache_tokens == 2_391_424
    assert abs(2_391_424 / 2_390_592 - 1) < 0.001


def test_v0_record_10_forward_peak_by_hand_and_record_11_refusal():
    # CSV record 10: V0 ~0.6.4, RTX 3090 (23.58 GiB), util 0.9, max_model_len 20000,
    # no chunked prefill: max_num_batched_tokens = 20000; log: 1952 blocks.
    p = hw.vllm_memory_profile("rtx-3090-24gb", "llama-3.1-8b", version="v0",
                               max_model_len=20_000)
    assert (p.max_num_batched_tokens, p.max_num_seqs) == (20_000, 256)
    forward = 20_000 * (3 * 4096 + 3 * 14_336) * 2  # 2.06 GiB; log: 17.06 - 14.99
    assert p.forward_peak_bytes == forward == 2_211_840_000
    assert p.activation_bytes == forward  # the sampler (1.35 GiB) is smaller
    avail = 23.58 * 0.9 * GiB - (16_094_076_928 + forward + 0.16 * GiB)
    # V0 cache block: 16 x 32 layers x 2 x 8 x 128 x 2 B = 2 MiB
    assert p.kv_cache_blocks == int(avail // 2_097_152) == 2054
    assert p.max_concurrency == pytest.approx(2054 * 16 / 20_000)
    assert abs(2054 / 1952 - 1) < 0.10  # 0.6.4 counted the CUDA context (0.35 GiB)
    # record 11: 29000 tokens; vLLM refused with its own blocks (1478 x 16 = 23648)
    with pytest.raises(hw.VllmRefusal) as err:
        hw.vllm_memory_profile("rtx-3090-24gb", "llama-3.1-8b", version="v0",
                               max_model_len=29_000)
    assert err.value.field == "max_model_len"
    assert "The model's max seq len (29000) is larger than the maximum number of " \
           "tokens that can be stored in KV cache (25280)" in str(err.value)
    soft = hw.vllm_memory_profile("rtx-3090-24gb", "llama-3.1-8b", version="v0",
                                  max_model_len=29_000, strict=False)
    assert soft.refusal[0] == "max_model_len" and soft.kv_cache_tokens == 25_280


def test_fp8_weights_keep_embeddings_in_bf16():
    # CSV record 24: --quantization fp8, log "weights memory: 8.49GiB"
    p = hw.vllm_memory_profile("h100-80gb", "llama-3.1-8b", quantization="fp8",
                               gpu_memory_utilization=0.95, max_model_len=8192)
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14_336)
    assert linear == 6_979_321_856
    rest = 8_030_261_248 - linear  # embeddings, LM head, norms
    assert p.weights_bytes == linear + 2 * rest + 33_554_432 == 9_114_755_072
    assert round(p.weights_gib, 2) == 8.49


def test_awq_and_gptq_weights_by_hand():
    # Llama-3.1-8B per layer, as vLLM merges the matmuls (inputs k x outputs n):
    # qkv 4096 x 6144, o 4096 x 4096, gate_up 4096 x 28672, down 14336 x 4096.
    # 4-bit packed k*n/2 bytes: 12,582,912 + 8,388,608 + 58,720,256 + 29,360,128
    packed = 109_051_904
    # group 128: k/128 groups (32, 32, 32, 112) x n fp16 scales of 2 bytes
    scales = 32 * 6144 * 2 + 32 * 4096 * 2 + 32 * 28672 * 2 + 112 * 4096 * 2
    assert scales == 3_407_872
    zeros = scales // 4  # AWQ: one 4-bit zero point per scale
    g_idx = 8 * (4096 + 4096 + 4096 + 14336)  # GPTQ desc_act: g_idx + sort order, int32
    rest = 2 * (8_030_261_248 - 6_979_321_856) + 33_554_432  # bf16 rest + rope cache
    for q, per_layer in (("awq-4bit-g128", packed + scales + zeros),
                         ("gptq-4bit-g128", packed + scales),
                         ("gptq-4bit-g128-act", packed + scales + g_idx)):
        p = hw.vllm_memory_profile("h100-80gb", "llama-3.1-8b", quantization=q,
                                   max_model_len=8192)
        assert p.weights_bytes == 32 * per_layer + rest, q
    assert round(p.weights_gib, 3) == 5.347


def test_fp8_kv_cache_halves_the_bytes_per_token():
    base = hw.vllm_memory_profile("h100-80gb", "llama-3.1-8b", max_model_len=8192)
    fp8 = hw.vllm_memory_profile("h100-80gb", "llama-3.1-8b", max_model_len=8192,
                                 kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token == base.kv_bytes_per_token / 2 == 65_536
    assert fp8.kv_cache_blocks in (2 * base.kv_cache_blocks, 2 * base.kv_cache_blocks
                                   + 1)


def test_version_defaults():
    h100, a100 = hw.get_device("h100-80gb"), hw.get_device("a100-80gb")
    assert mp.vllm_defaults(h100) == {"max_num_batched_tokens": 8192,
                                      "max_num_seqs": 1024}
    assert mp.vllm_defaults(h100, usage_context="llm_class")[
        "max_num_batched_tokens"] == 16_384
    assert mp.vllm_defaults(a100) == {"max_num_batched_tokens": 2048,
                                      "max_num_seqs": 256}  # PR #17885: not A100
    p = hw.vllm_memory_profile("a100-80gb", "qwen3-8b")
    assert p.max_model_len == 40_960 and p.enable_chunked_prefill
    v0 = hw.vllm_memory_profile("a100-80gb", "qwen3-8b", version="v0",
                                max_model_len=16_384)
    assert not v0.enable_chunked_prefill and v0.max_num_batched_tokens == 16_384
    assert hw.vllm_memory_profile("a100-80gb", "qwen3-8b", enforce_eager=True
                                  ).cuda_graph_bytes == 0


def test_hugging_face_ids_and_presets():
    assert hw.get_model("Qwen/Qwen3-8B") is hw.get_model("qwen3-8b")
    assert hw.get_model("qwen/QWEN3-8b") is hw.get_model("qwen3-8b")
    assert hw.get_model("meta-llama/Meta-Llama-3-8B").name == "llama-3-8b"
    assert "Qwen/Qwen3-8B" not in hw.list_models()  # names only, not aliases
    with pytest.raises(ValueError, match="unknown model 'nope/x'.*qwen3-8b"):
        hw.get_model("nope/x")
    m = hw.get_model("mixtral-8x7b")  # all experts resident, 2 of 8 per token
    assert m.n_params == 46_702_792_704 and m.active_params == 12_879_925_248
    assert m.flops_per_token(0) == 2 * 12_879_925_248
    assert hw.get_model("qwen3-8b").n_params == 8_190_735_360
    assert hw.get_model("llama-3-8b").active_params == 8_030_261_248
    assert hw.get_model("openhermes-2.5-mistral-7b").vocab_size == 32_002
    with pytest.raises(ValueError, match="n_active_params"):
        dataclasses.replace(m, n_active_params=m.n_params + 1)
    for name in hw.list_models():
        spec = hw.get_model(name)
        for field in ("n_layers", "n_kv_heads", "head_dim", "vocab_size", "n_params",
                      "max_position"):
            assert spec.source(field), f"{name}.{field} has no source"
    for name in ("a100-40gb", "rtx-3090-24gb", "t4-16gb", "rtx-a6000-48gb",
                 "h100-80gb", "a100-80gb"):
        dev = hw.get_device(name)
        assert dev.driver_memory_bytes < dev.memory_bytes
        assert "vllm" in dev.source("driver_memory_bytes").lower()
    with pytest.raises(ValueError, match="driver_memory_bytes"):
        dataclasses.replace(hw.get_device("t4-16gb"), driver_memory_bytes=17 * GiB)


@pytest.mark.parametrize("kwargs, field", [
    (dict(device="t4-16gb", model="llama-3.1-70b", max_model_len=4096),
     "gpu_memory_utilization"),
    (dict(device="rtx-3090-24gb", model="llama-3.1-8b"), "max_model_len"),
    (dict(device="h100-80gb", model="qwen3-8b", max_model_len=50_000),
     "max_model_len"),
    (dict(device="h100-80gb", model="qwen3-8b", tp=3), "tp"),
    (dict(device="h100-80gb", model="qwen3-8b", max_model_len=16_384,
          enable_chunked_prefill=False, max_num_batched_tokens=8192),
     "max_num_batched_tokens"),
])
def test_refusals_name_the_field(kwargs, field):
    with pytest.raises(hw.VllmRefusal) as err:
        hw.vllm_memory_profile(kwargs.pop("device"), kwargs.pop("model"), **kwargs)
    assert err.value.field == field and str(err.value).startswith(field + ":")
    assert isinstance(err.value, hw.InfeasibleError)


@pytest.mark.parametrize("kwargs, field", [
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(block_size=7), "block_size"),
    (dict(kv_cache_dtype="int4"), "kv_cache_dtype"),
    (dict(quantization="awq"), "quantization"),
    (dict(quantization="awq-4bit-g100"), "quantization"),
    (dict(quantization="gptq-3bit-g128"), "quantization"),
    (dict(quantization="awq-4bit-g128-act"), "quantization"),
    (dict(version="v2"), "version"),
    (dict(tp=0), "tp"),
    (dict(max_num_seqs=0), "max_num_seqs"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=repr(field)):
        hw.vllm_memory_profile("h100-80gb", "qwen3-8b", **kwargs)
    with pytest.raises(ValueError, match="unknown device 'h200'.*h100-80gb"):
        hw.vllm_memory_profile("h200", "qwen3-8b")


def test_deployment_capacity_is_the_profile_tokens():
    p = hw.vllm_memory_profile("h100-80gb", "qwen-2.5-7b-instruct",
                               gpu_memory_utilization=0.95, max_model_len=8192)
    d = hw.deployment_from_profile(p)
    assert d.kv_capacity_tokens == p.kv_cache_tokens == 1_096_976
    assert d.weight_bytes_per_device == p.weights_bytes
    assert d.kv_bytes_per_token_per_device == 57_344  # 28 x 2 x 4 x 128 x 2
    e = hw.make_deployment("h100-80gb", "qwen-2.5-7b-instruct", engine="vllm-v1",
                           mem_util=0.95, engine_args={"max_model_len": 8192})
    assert e.kv_capacity_tokens == p.kv_cache_tokens and e.tp == 1
    # tp search: Llama-3.1-8B's 131072-token context needs 2 RTX 3090s under vLLM
    s = hw.make_deployment("rtx-3090-24gb", "llama-3.1-8b", engine="vllm-v1")
    assert s.tp == 2 and s.kv_capacity_tokens >= 131_072
    with pytest.raises(hw.InfeasibleError):
        hw.deployment_from_profile(hw.vllm_memory_profile(
            "rtx-3090-24gb", "llama-3.1-8b", strict=False))
    with pytest.raises(ValueError, match="engine"):
        hw.make_deployment("h100-80gb", "qwen3-8b", engine="sglang")


def test_cli_json_and_refusal(capsys):
    assert cli.main(["--hardware", "h100-80gb", "--model", "Qwen/Qwen3-8B", "--tp",
                     "1", "--max-model-len", "8192", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("kv_cache_tokens", "weights_gib", "activation_gib", "non_torch_gib",
                "kv_cache_gib", "kv_cache_blocks", "max_concurrency",
                "total_gpu_memory_gib", "cuda_graph_gib", "vllm_version_line"):
        assert key in out, key
    assert out["model"] == "qwen3-8b" and out["kv_cache_tokens"] > 0
    assert cli.main(["--hardware", "h100-80gb", "--model", "qwen3-8b"]) == 0
    assert "maximum concurrency" in capsys.readouterr().out
    assert cli.main(["--hardware", "rtx-3090-24gb", "--model", "llama-3.1-8b",
                     "--vllm-version", "v0", "--max-model-len", "29000"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1
    assert cap.err.startswith("error: max_model_len: The model's max seq len (29000)")
    with pytest.raises(SystemExit) as ex:
        cli.main(["--hardware", "h100-80gb", "--model", "qwen3-8b", "--tpp", "2"])
    cap = capsys.readouterr()
    assert ex.value.code == 2 and cap.out == "" and cap.err.count("\n") == 1


@pytest.mark.skipif(not mc.reference_path().is_file(),
                    reason="../shared/reference CSV not present")
def test_memory_check_runs_on_the_csv(tmp_path):
    assert mc.main(["--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "memory_check.json").read_text())
    md = (tmp_path / "memory_check.md").read_text()
    assert len(res["records"]) == 16 and "## KV cache tokens" in md
    by_id = {r["id"]: r for r in res["records"]}
    assert by_id["20"]["version_line"] == "v1" and by_id["10"]["version_line"] == "v0"
    assert by_id["2"]["version_line"].startswith("outside")
    assert by_id["11"]["predicted"]["refused"] and by_id["11"]["reported"]["refused"]
    assert all(by_id[r]["within_tolerance"] for r in ("19", "20", "24", "26", "27",
                                                      "32", "10", "11", "16"))
    assert res["summary"]["outside_tolerance"] == ["1"]  # unstated settings
    # the project's records: 4-bit GPTQ on an H100 (v0.19), AWQ 70B at TP 2 on L40S
    # (v0.16), fp16 on a V100 (V0); the 4-bit weights as logged
    x1, x2, x3 = by_id["x1"], by_id["x2"], by_id["x3"]
    assert x1["settings"]["quantization"] == "gptq-4bit-g128"
    assert abs(x1["errors"]["kv_cache_tokens"]) < 0.005
    assert round(x1["predicted"]["weights_gib"], 2) == 5.34  # log: 5.38 (Machete)
    assert round(x2["predicted"]["weights_gib"], 2) == x2["reported"]["weights_gib"]
    assert (x2["settings"]["device"], x3["settings"]["device"]) == ("l40s-48gb",
                                                                    "v100-32gb")
    assert abs(x3["errors"]["kv_cache_tokens"]) < 0.01
    sg = res["sglang"]  # SGLang's records: coverage and the pool from each log
    assert (sg["predicted"], sg["total"], sg["within"]) == (3, 3, 3)
    assert "## SGLang's token pool vs start-up logs" in md
    assert "`configs/qwen3-235b-a22b-fp8.json`" in md
    assert mc.main(["--out", str(tmp_path / "x"), "--csv",
                    str(tmp_path / "missing.csv")]) == 2
    assert not (tmp_path / "x").exists()


def test_hybrid_pool_reproduces_gemma3_27b_log():
    # vLLM 0.11.0rc2 start-up log of google/gemma-3-27b-it, TP 1, max_model_len 4096,
    # max_num_batched_tokens 8192 (a public GitHub document, code index text id
    # 9297248278): "Available KV cache memory: 109.86 GiB", "Add 8 padding layers",
    # "GPU KV cache size: 205,696 tokens", "Maximum concurrency for 4,096 tokens per
    # request: 50.05x", "num_gpu_blocks is: 89994". 62 layers, 10 global (layer i
    # global when (i + 1) % 6 == 0), window 1024; one layer's block 16 x 2 x 16 KV heads
    # x 128 x 2 bytes
    page = 16 * 2 * 16 * 128 * 2
    pool = mp.v1_kv_pool(89994 * page * 10, page, 10, 52, 1024, 16, 4096, 8192)
    # groups of min(10, 52) = 10 layers: 1 global + ceil(52 / 10) = 6 local (8 padding)
    assert (pool.group, pool.groups, pool.blocks) == (10, 7, 89994)
    assert pool.tokens == 89994 // 7 * 16 == 205_696
    # a request: 4096 / 16 = 256 blocks global, ceil(min(1023 + 8192, 4096) / 16) + 1
    # = 257 per local group
    assert pool.request_blocks == 256 + 6 * 257
    assert round(pool.concurrency, 2) == 50.05


def test_all_sliding_pool_reproduces_starcoder2_log():
    # github.com/vllm-project/vllm/pull/19029 (bigcode/starcoder2-3b, every layer a
    # 4096 window, H100, vllm serve defaults): "GPU KV cache size: 2,198,512 tokens"
    # before and after; concurrency for 16,384 tokens 134.19x before, 178.68x after
    page = 16 * 2 * 2 * 128 * 2
    pool = mp.v1_kv_pool(137_407 * page * 30 + page, page, 0, 30, 4096, 16, 16384, 8192)
    assert (pool.groups, pool.blocks, pool.tokens) == (1, 137_407, 2_198_512)
    assert pool.request_blocks == (4095 + 8192) // 16 + 1 + 1  # ceil(12287 / 16) + 1
    assert round(pool.concurrency, 2) == 178.68


def test_full_attention_pool_is_the_plain_block_count():
    for avail, layers, mml in ((5e10, 32, 8192), (7.3e9, 28, 4000), (1e6, 40, 2048)):
        page = 16 * 2 * 8 * 128 * 2
        pool = mp.v1_kv_pool(avail, page, layers, 0, None, 16, mml, 8192)
        blocks = int(avail // page // layers)
        assert (pool.blocks, pool.tokens, pool.groups) == (blocks, blocks * 16, 1)
        assert pool.concurrency == blocks / -(-mml // 16)


def test_a_gemma2_profile_holds_more_requests_than_its_tokens_say():
    spec = dataclasses.replace(hw.get_model("llama-3.1-8b"), name="swa-test",
                               sliding_window=1024, sliding_layers=16)
    kw = dict(max_model_len=32768, max_num_batched_tokens=2048, gpu_memory_utilization=0.9)
    full = hw.vllm_memory_profile("h100-80gb", "llama-3.1-8b", **kw)
    swa = hw.vllm_memory_profile("h100-80gb", spec, **kw)
    # 16 full + 16 sliding layers: two groups of 16 sharing twice the blocks; logged
    # tokens the same (no padding), a long request holds fewer blocks
    assert swa.kv_cache_blocks - 2 * full.kv_cache_blocks in (0, 1)  # floor rounding
    assert swa.kv_cache_tokens == full.kv_cache_tokens
    assert swa.max_concurrency == pytest.approx(
        swa.kv_cache_blocks / (2048 + (1023 + 2048 + 15) // 16 + 1))
    assert swa.max_concurrency > 1.8 * full.max_concurrency
    assert any("sliding window 1024" in n for n in swa.notes)
    with pytest.raises(ValueError, match="'pp'"):
        hw.vllm_memory_profile("h100-80gb", spec, pp=2, **kw)
    kw.update(version="v0", enable_chunked_prefill=True)  # V0: sized as full attention
    assert hw.vllm_memory_profile("h100-80gb", spec, **kw).kv_cache_tokens == \
        hw.vllm_memory_profile("h100-80gb", "llama-3.1-8b", **kw).kv_cache_tokens


def test_near_equal_layer_counts_share_one_group_size():
    # vLLM 0.18+ (kv_cache_utils.py _get_kv_cache_groups_uniform_page_size): when the
    # larger count is under 1.5x the smaller, groups take the larger one and the
    # smaller kind is padded: 13 full + 12 sliding -> two groups of 13, not three of 12
    pool = mp.v1_kv_pool(1000 * 4096 * 13, 4096, 13, 12, 512, 16, 4096, 2048)
    assert (pool.group, pool.groups, pool.blocks, pool.tokens) == (13, 2, 1000, 8000)
    pool = mp.v1_kv_pool(1000 * 4096 * 10, 4096, 10, 20, 512, 16, 4096, 2048)
    assert (pool.group, pool.groups) == (10, 3)  # 20 >= 1.5 x 10: groups of the smaller


@pytest.mark.parametrize("argv,engine,flags", [
    (["--context-gib", "-1"], "vllm", "--context-gib"),
    (["--context", "1"], "vllm", "--context-gib"),  # an abbreviation argparse accepts
    (["--mem-fraction-static=0.5", "--page-size", "4"], "vllm",
     "--mem-fraction-static, --page-size"),
    (["--engine", "sglang", "--max-num-seqs", "5"], "sglang", "--max-num-seqs"),
    (["--engine", "sglang", "--pipeline-parallel-size", "2"], "sglang",
     "--pipeline-parallel-size"),
])
def test_a_flag_the_engine_does_not_read_is_refused(argv, engine, flags, capsys):
    """Not silently ignored: one line naming the flags, exit 2, nothing printed."""
    rc = cli.main(["--hardware", "h100-80gb", "--model", "qwen3-8b", *argv])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: {flags}: not read by --engine {engine}"), lines


def test_each_engine_reads_its_own_flags(capsys):
    assert cli.main(["--hardware", "h100-80gb", "--model", "qwen3-8b", "--engine",
                     "sglang", "--page-size", "16", "--tp", "1"]) == 0
    assert cli.main(["--hardware", "h100-80gb", "--model", "qwen3-8b",
                     "--max-num-seqs", "64", "--block-size", "32"]) == 0
    assert "error" not in capsys.readouterr().err
