"""Preset models. Shapes come from each model's published Hugging Face ``config.json``.

``n_params`` is counted from the config's tensor shapes (Qwen2: QKV bias, untied
embeddings; Llama: no biases, untied; OPT: biases, learned positions with offset 2,
tied LM head) and checked against a published count where one was found.
``head_dim`` is ``hidden_size / num_attention_heads`` where the config has no
``head_dim`` key (transformers derives it the same way).
"""

from __future__ import annotations

from hardware.llm import LLMSpec

__all__ = ["PRESETS"]

_DTYPE = "assumption: fp16/bf16 serving (config torch_dtype bfloat16/float16)"


def _from_config(
    name, config, *, L, h, nh, kv, inter, vocab, maxpos, n_params, params, **notes
):
    """An LLMSpec whose config-derived fields cite ``config``; ``notes`` overrides
    the cited text of a field (e.g. OPT's ``ffn_dim``)."""
    cited = {
        "n_layers": f"num_hidden_layers={L}",
        "hidden_size": f"hidden_size={h}",
        "n_heads": f"num_attention_heads={nh}",
        "n_kv_heads": f"num_key_value_heads={kv}",
        "head_dim": f"hidden_size/num_attention_heads = {h}/{nh} = {h // nh}",
        "intermediate_size": f"intermediate_size={inter}",
        "vocab_size": f"vocab_size={vocab}",
        "max_position": f"max_position_embeddings={maxpos}",
        **notes,
    }
    sources = {field: f"{config}: {text}" for field, text in cited.items()}
    sources.update(n_params=params, dtype_bytes=_DTYPE)
    return LLMSpec(
        name=name,
        n_layers=L,
        hidden_size=h,
        n_heads=nh,
        n_kv_heads=kv,
        head_dim=h // nh,
        intermediate_size=inter,
        vocab_size=vocab,
        n_params=n_params,
        max_position=maxpos,
        sources=tuple(sources.items()),
    )


_COUNTED = "counted from config shapes = {:,}; matches {}"

PRESETS = (
    _from_config(
        "deepseek-r1-distill-qwen-7b",
        "huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-7B config.json (Qwen2; "
        "as copied with _name_or_path in huggingface.co/xl-zhao/PromptCoT-DS-7B)",
        L=28,
        h=3584,
        nh=28,
        kv=4,
        inter=18944,
        vocab=152064,
        maxpos=131072,
        n_params=7_615_616_512,
        params=_COUNTED.format(
            7_615_616_512,
            "Qwen2.5-7B (same architecture) GGUF general.parameter_count 7615616512",
        ),
    ),
    _from_config(
        "llama-2-7b",
        "huggingface.co/meta-llama/Llama-2-7b-hf config.json (as copied in "
        "huggingface.co/abhishek/llama-2-7b-hf-small-shards)",
        L=32,
        h=4096,
        nh=32,
        kv=32,
        inter=11008,
        vocab=32000,
        maxpos=4096,
        n_params=6_738_415_616,
        params=_COUNTED.format(
            6_738_415_616,
            "GGUF general.parameter_count 6738415616 (TheBloke/Llama-2-7B-Chat-GGUF)",
        ),
    ),
    _from_config(
        "llama-2-70b",
        "huggingface.co/meta-llama/Llama-2-70b-hf config.json (as copied in "
        "huggingface.co/TheBloke/Llama-2-70B-fp16)",
        L=80,
        h=8192,
        nh=64,
        kv=8,
        inter=28672,
        vocab=32000,
        maxpos=4096,
        n_params=68_976_648_192,
        params=_COUNTED.format(
            68_976_648_192,
            "TOTAL_PARAMS=68976648192 quoted for Llama-2-70B (AuroraGPT-70B study)",
        ),
    ),
    _from_config(
        "llama-3-8b",
        "huggingface.co/meta-llama/Meta-Llama-3-8B config.json (head_dim=128; as "
        "copied in huggingface.co/pandyamarut/Meta-Llama-3-8B)",
        L=32,
        h=4096,
        nh=32,
        kv=8,
        inter=14336,
        vocab=128256,
        maxpos=8192,
        n_params=8_030_261_248,
        params=_COUNTED.format(
            8_030_261_248, "GGUF general.parameter_count 8030261248 for llama3-8b"
        ),
    ),
    _from_config(
        "qwen-2.5-14b",
        "huggingface.co/Qwen/Qwen2.5-14B config.json (as copied in github.com/"
        "citsjtu2020/LLM-Prof sglang/Model_Config.md)",
        L=48,
        h=5120,
        nh=40,
        kv=8,
        inter=13824,
        vocab=152064,
        maxpos=131072,
        n_params=14_770_033_664,
        params=_COUNTED.format(
            14_770_033_664, "llama.cpp n_params 14770033664 for Qwen2.5-14B GGUFs"
        ),
    ),
    _from_config(
        "qwen-2.5-72b",
        "huggingface.co/Qwen/Qwen2.5-72B config.json (as copied in "
        "huggingface.co/BitStack/BitStack-Qwen2.5-72B)",
        L=80,
        h=8192,
        nh=64,
        kv=8,
        inter=29568,
        vocab=152064,
        maxpos=131072,
        n_params=72_706_203_648,
        params=_COUNTED.format(
            72_706_203_648,
            "a published table listing qwen2.5-72b-instruct = 72706203648",
        ),
    ),
    _from_config(
        "opt-13b",
        "huggingface.co/facebook/opt-13b config.json (rev 9c10d01)",
        L=40,
        h=5120,
        nh=40,
        kv=40,
        inter=20480,
        vocab=50272,
        maxpos=2048,
        n_params=12_853_473_280,
        params="counted from config shapes = 12,853,473,280 (biases, 2050 learned "
        "positions, tied LM head); published as '13B', no exact count found",
        n_kv_heads="multi-head attention, no num_key_value_heads: = heads = 40",
        intermediate_size="ffn_dim=20480",
    ),
)
