"""Preset models. Shapes come from each model's published Hugging Face ``config.json``.

``n_params`` is counted from the config's tensor shapes (Qwen2: QKV bias, untied
embeddings; Llama: no biases, untied; OPT: biases, learned positions with offset 2,
tied LM head) and checked against a published count where one was found.
``head_dim`` is ``hidden_size / num_attention_heads`` where the config has no
``head_dim`` key (transformers derives it the same way).

``aliases`` are the Hugging Face ids a preset answers to (``get_model`` is
case-insensitive); an alias is listed only where that repository's ``config.json``
has the same shapes and context as the preset. Later presets count their parameters
with :func:`count_params` (the layout is named in each source). MoE presets keep
every expert in ``n_params`` (vLLM loads them all) and give ``n_active_params``, the
parameters one token uses (shared weights plus ``num_experts_per_tok`` experts).
"""

from __future__ import annotations

from hardware.llm import LLMSpec, register_model

__all__ = ["PRESETS"]

_DTYPE = "assumption: fp16/bf16 serving (config torch_dtype bfloat16/float16)"


def _from_config(
    name, config, *, L, h, nh, kv, inter, vocab, maxpos, n_params, params,
    hd=None, aliases=(), tied=False, gated=True, experts=0, per_tok=0, active=None,
    active_src=None, **notes
):
    """An LLMSpec whose config-derived fields cite ``config``; ``notes`` overrides
    the cited text of a field (e.g. OPT's ``ffn_dim``). ``hd`` is the config's
    explicit ``head_dim`` (else hidden_size / num_attention_heads)."""
    head_dim = h // nh if hd is None else hd
    cited = {
        "n_layers": f"num_hidden_layers={L}",
        "hidden_size": f"hidden_size={h}",
        "n_heads": f"num_attention_heads={nh}",
        "n_kv_heads": f"num_key_value_heads={kv}",
        "head_dim": f"hidden_size/num_attention_heads = {h}/{nh} = {h // nh}"
        if hd is None else f"head_dim={hd}",
        "intermediate_size": f"intermediate_size={inter}",
        "vocab_size": f"vocab_size={vocab}",
        "max_position": f"max_position_embeddings={maxpos}",
        "tie_word_embeddings": f"tie_word_embeddings={str(tied).lower()}",
        **notes,
    }
    if experts:
        cited["n_experts"] = f"num_local_experts/num_experts={experts}"
        cited["n_experts_per_token"] = f"num_experts_per_tok={per_tok}"
    sources = {field: f"{config}: {text}" for field, text in cited.items()}
    sources.update(n_params=params, dtype_bytes=_DTYPE)
    if active is not None:
        sources["n_active_params"] = active_src
    return LLMSpec(
        name=name,
        n_layers=L,
        hidden_size=h,
        n_heads=nh,
        n_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        n_params=n_params,
        max_position=maxpos,
        tie_word_embeddings=tied,
        gated_mlp=gated,
        n_experts=experts,
        n_experts_per_token=per_tok,
        n_active_params=active,
        aliases=tuple(aliases),
        sources=tuple(sources.items()),
    )


def count_params(*, L, h, nh, kv, hd, inter, vocab, tied=False, qkv_bias=False,
                 qk_norm=False, experts=0, per_tok=0, active=False, norms=2) -> int:
    """Parameters of a Llama/Qwen/Mistral-layout decoder from its config shapes.

    Per layer: q, k, v, o projections (``h*nh*hd + 2*h*kv*hd + nh*hd*h``, plus the
    QKV bias for Qwen2 and the per-head q/k RMSNorm weights, ``2*hd``, for Qwen3),
    a SwiGLU MLP (``3*h*inter``) or ``experts`` of them with a router (``h*experts``),
    ``norms`` RMSNorms (``norms*h``; two, Gemma-2/3 four: pre- and post-norms around
    attention and MLP); then the embedding, the LM head unless tied, and the final
    norm. ``active=True`` counts ``per_tok`` experts instead of all of them.
    """
    attn = h * nh * hd + 2 * h * kv * hd + nh * hd * h
    attn += (nh * hd + 2 * kv * hd) if qkv_bias else 0
    attn += 2 * hd if qk_norm else 0
    if experts:
        used = per_tok if active else experts
        mlp = used * 3 * h * inter + h * experts
    else:
        mlp = 3 * h * inter
    return L * (attn + mlp + norms * h) + vocab * h * (1 if tied else 2) + h


def _hf(repo: str) -> str:
    return f"huggingface.co/{repo}/blob/main/config.json"


def _counted(n: int, layout: str, published: str) -> str:
    return (f"counted from config shapes ({layout}; hardware._model_presets."
            f"count_params) = {n:,}; published: {published}")


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
        aliases=("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",),
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
        aliases=("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"),
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
        aliases=("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf"),
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
        aliases=("meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct"),
    ),
    _from_config(
        "llama-3-8b-262k",
        "huggingface.co/gradientai/Llama-3-8B-Instruct-262k config.json (as copied in "
        "huggingface.co/spjabech/th_pos_neg_3epochs config.json, _name_or_path "
        "gradientai/Llama-3-8B-Instruct-262k): Llama-3-8B's layers and heads, "
        "max_position_embeddings 262144, rope_theta 283461213; the eLLM paper's "
        "Llama3-8B-262K (shared/seeds/ellm.txt section 6)",
        L=32,
        h=4096,
        nh=32,
        kv=8,
        inter=14336,
        vocab=128256,
        maxpos=262144,
        n_params=8_030_261_248,
        params=_COUNTED.format(
            8_030_261_248, "same shapes as llama3-8b (GGUF general.parameter_count "
            "8030261248)"
        ),
        aliases=("gradientai/Llama-3-8B-Instruct-262k",),
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
        aliases=("Qwen/Qwen2.5-14B",),
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
        aliases=("Qwen/Qwen2.5-72B",),
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
        tied=True,
        gated=False,
        gated_mlp="OPT's MLP is fc1 + fc2 (ReLU), not gated",
        aliases=("facebook/opt-13b",),
    ),
)

# The presets above give their counts literally; those below are counted by
# count_params from the same config shapes they cite.

_LLAMA = "Llama layout: no biases, SwiGLU, RMSNorm"
_QWEN2 = "Qwen2 layout: QKV bias, SwiGLU, RMSNorm"
_QWEN3 = "Qwen3 layout: no QKV bias, per-head q/k RMSNorm, SwiGLU"
_MISTRAL = "Mistral layout = Llama layout"


def _counted_preset(name, repo, layout, published, *, aliases=(), qkv_bias=False,
                    qk_norm=False, notes=None, **shape):
    """A preset whose ``n_params`` (and, for MoE, ``n_active_params``) is counted
    from its config shapes; ``repo`` names the Hugging Face repository cited."""
    hd = shape.get("hd") or shape["h"] // shape["nh"]
    kw = dict(L=shape["L"], h=shape["h"], nh=shape["nh"], kv=shape["kv"], hd=hd,
              inter=shape["inter"], vocab=shape["vocab"],
              tied=shape.get("tied", False), qkv_bias=qkv_bias, qk_norm=qk_norm,
              experts=shape.get("experts", 0), per_tok=shape.get("per_tok", 0))
    n = count_params(**kw)
    active = active_src = None
    if kw["experts"]:
        active = count_params(**kw, active=True)
        active_src = _counted(active, layout + f", {kw['per_tok']} of "
                              f"{kw['experts']} experts per token", published)
    return _from_config(
        name, _hf(repo), n_params=n, params=_counted(n, layout, published),
        aliases=(repo, *aliases), active=active, active_src=active_src,
        **shape, **(notes or {}),
    )


PRESETS = PRESETS + (
    _counted_preset(
        "llama-3.1-8b", "meta-llama/Llama-3.1-8B", _LLAMA,
        "8,030,261,248 (Llama-3-8B shapes; model card '8B')",
        aliases=("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B",
                 "meta-llama/Meta-Llama-3.1-8B-Instruct"),
        L=32, h=4096, nh=32, kv=8, inter=14336, vocab=128256, maxpos=131072,
    ),
    _counted_preset(
        "llama-3.1-70b", "meta-llama/Llama-3.1-70B", _LLAMA,
        "model card '70B' (70.6B)",
        aliases=("meta-llama/Llama-3.1-70B-Instruct",
                 "meta-llama/Meta-Llama-3.1-70B-Instruct",
                 "meta-llama/Llama-3.3-70B-Instruct"),
        L=80, h=8192, nh=64, kv=8, inter=28672, vocab=128256, maxpos=131072,
    ),
    _counted_preset(
        "llama-3.2-1b", "meta-llama/Llama-3.2-1B", _LLAMA + ", tied LM head",
        "model card '1.23B'", aliases=("meta-llama/Llama-3.2-1B-Instruct",),
        L=16, h=2048, nh=32, kv=8, hd=64, inter=8192, vocab=128256, maxpos=131072,
        tied=True,
    ),
    _counted_preset(
        "llama-3.2-3b", "meta-llama/Llama-3.2-3B", _LLAMA + ", tied LM head",
        "model card '3.21B'", aliases=("meta-llama/Llama-3.2-3B-Instruct",),
        L=28, h=3072, nh=24, kv=8, hd=128, inter=8192, vocab=128256, maxpos=131072,
        tied=True,
    ),
    _counted_preset(
        "codellama-7b", "codellama/CodeLlama-7b-hf", _LLAMA,
        "model card '7B'; = llama-2-7b + 16 extra vocabulary rows x 2 x 4096",
        aliases=("codellama/CodeLlama-7b-Instruct-hf",),
        L=32, h=4096, nh=32, kv=32, inter=11008, vocab=32016, maxpos=16384,
        notes={"n_kv_heads": "num_key_value_heads=32 (multi-head attention)"},
    ),
    _counted_preset(
        "mistral-7b", "mistralai/Mistral-7B-v0.1", _MISTRAL,
        "7,241,732,096 (Mistral-7B-v0.1 safetensors total)",
        aliases=("mistralai/Mistral-7B-Instruct-v0.1",),
        L=32, h=4096, nh=32, kv=8, inter=14336, vocab=32000, maxpos=32768,
        notes={"max_position": "max_position_embeddings=32768 (sliding_window=4096: "
               "attention sees 4,096 tokens; not modelled, KV kept for all tokens)"},
    ),
    _counted_preset(
        "mistral-7b-v0.3", "mistralai/Mistral-7B-v0.3", _MISTRAL,
        "model card '7.25B'", aliases=("mistralai/Mistral-7B-Instruct-v0.3",),
        L=32, h=4096, nh=32, kv=8, inter=14336, vocab=32768, maxpos=32768,
    ),
    _counted_preset(
        "openhermes-2.5-mistral-7b", "teknium/OpenHermes-2.5-Mistral-7B", _MISTRAL,
        "a Mistral-7B-v0.1 fine-tune; 2 added tokens (vocab 32002)",
        L=32, h=4096, nh=32, kv=8, inter=14336, vocab=32002, maxpos=32768,
    ),
    _counted_preset(
        "mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", _MISTRAL + ", 8 SwiGLU "
        "experts per layer with a router", "46.7B total, 12.9B active per token "
        "(Mistral AI, 'Mixtral of experts' announcement)",
        aliases=("mistralai/Mixtral-8x7B-Instruct-v0.1",),
        L=32, h=4096, nh=32, kv=8, inter=14336, vocab=32000, maxpos=32768,
        experts=8, per_tok=2,
        notes={"intermediate_size": "intermediate_size=14336 (per expert)"},
    ),
    _counted_preset(
        "qwen-2.5-0.5b", "Qwen/Qwen2.5-0.5B", _QWEN2 + ", tied LM head",
        "494,032,768 (Qwen2.5 model card: 0.49B)",
        aliases=("Qwen/Qwen2.5-0.5B-Instruct",), qkv_bias=True,
        L=24, h=896, nh=14, kv=2, inter=4864, vocab=151936, maxpos=32768, tied=True,
    ),
    _counted_preset(
        "qwen-2.5-7b", "Qwen/Qwen2.5-7B", _QWEN2,
        "7,615,616,512 (GGUF general.parameter_count; model card 7.61B)",
        qkv_bias=True,
        L=28, h=3584, nh=28, kv=4, inter=18944, vocab=152064, maxpos=131072,
    ),
    _counted_preset(
        "qwen-2.5-7b-instruct", "Qwen/Qwen2.5-7B-Instruct", _QWEN2,
        "7,615,616,512 (as Qwen2.5-7B; the Instruct config sets "
        "max_position_embeddings=32768)", qkv_bias=True,
        L=28, h=3584, nh=28, kv=4, inter=18944, vocab=152064, maxpos=32768,
    ),
    _counted_preset(
        "qwen-2.5-14b-instruct", "Qwen/Qwen2.5-14B-Instruct", _QWEN2,
        "14,770,033,664 (as Qwen2.5-14B; Instruct config max_position_embeddings="
        "32768)", qkv_bias=True,
        L=48, h=5120, nh=40, kv=8, inter=13824, vocab=152064, maxpos=32768,
    ),
    _counted_preset(
        "qwen-2.5-72b-instruct", "Qwen/Qwen2.5-72B-Instruct", _QWEN2,
        "72,706,203,648 (as Qwen2.5-72B; Instruct config max_position_embeddings="
        "32768)", qkv_bias=True,
        L=80, h=8192, nh=64, kv=8, inter=29568, vocab=152064, maxpos=32768,
    ),
    _counted_preset(
        "qwen3-8b", "Qwen/Qwen3-8B", _QWEN3, "model card 8.2B", qk_norm=True,
        L=36, h=4096, nh=32, kv=8, hd=128, inter=12288, vocab=151936, maxpos=40960,
    ),
    _counted_preset(
        "qwen3-14b", "Qwen/Qwen3-14B", _QWEN3, "model card 14.8B", qk_norm=True,
        L=40, h=5120, nh=40, kv=8, hd=128, inter=17408, vocab=151936, maxpos=40960,
    ),
    _counted_preset(
        "qwen3-32b", "Qwen/Qwen3-32B", _QWEN3, "model card 32.8B", qk_norm=True,
        L=64, h=5120, nh=64, kv=8, hd=128, inter=25600, vocab=151936, maxpos=40960,
    ),
    _counted_preset(
        "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", _QWEN3 + ", 128 SwiGLU experts per "
        "layer with a router", "model card 30.5B total, 3.3B activated",
        qk_norm=True,
        L=48, h=2048, nh=32, kv=4, hd=128, inter=768, vocab=151936, maxpos=40960,
        experts=128, per_tok=8,
        notes={"intermediate_size": "moe_intermediate_size=768 (per expert; every "
               "layer is MoE, decoder_sparse_step=1)"},
    ),
)

for _model in PRESETS:  # the registry is filled here, where the presets are defined
    register_model(_model)
del _model
