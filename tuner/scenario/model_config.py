"""A model from its Hugging Face ``config.json``: ``model_from_config(path)`` (the
operator's input beside the presets of ``hardware/``).

An operator's model need not be a preset: give the ``config.json`` of its checkpoint (or
the folder holding it) and the shapes a memory manager and a roofline need are read from
it, each with the field it came from as its source. Parameters are counted from the
shapes with :func:`hardware._model_presets.count_params` (the layouts below); weights in
memory are every parameter (MoE: every expert resident), FLOPs use the active ones.

Fields read, and what they mean here (a field outside this list is not read; a field
that would change what is computed and is not interpreted is refused by name, never
given a default):

- ``model_type``: the layout, one of :data:`LAYOUTS` (else refused);
- ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``intermediate_size``
  (MoE: ``moe_intermediate_size`` for Qwen3-MoE, the per-expert width), ``vocab_size``,
  ``max_position_embeddings``: the shapes, required;
- ``num_key_value_heads``: KV heads (grouped-query attention); absent means one per
  query head (multi-head attention), as the transformers configuration classes of
  these layouts document;
- ``head_dim``: explicit head width; absent means ``hidden_size /
  num_attention_heads`` for the Llama, Mistral, Mixtral and Qwen2 layouts (their
  classes derive it so); required for Qwen3, Qwen3-MoE, Gemma and Gemma-2 (their
  classes default to 128 / 256, which a config of another width would silently
  contradict);
- Gemma-3 (text) alone: ``num_attention_heads``, ``num_key_value_heads``,
  ``head_dim``, ``vocab_size`` and ``max_position_embeddings`` absent take
  Gemma3TextConfig's defaults (8, 4, 256, 262,208, 131,072; :data:`_CLASS_DEFAULTS`),
  because its multimodal checkpoints write a sparse ``text_config`` (Gemma-3-4B's
  published parameter count confirms them); each such field's source says so;
- ``tie_word_embeddings``: the LM head shares the embedding matrix; absent means
  the layout's configuration class default: false, except Gemma (true);
- ``attention_bias`` (Llama, Mistral): q/k/v/o biases; only false is interpreted;
- ``num_local_experts`` (Mixtral) / ``num_experts`` (Qwen3-MoE) and
  ``num_experts_per_tok``: routed experts and the top-k each token uses;
  ``decoder_sparse_step`` must be 1 and ``mlp_only_layers`` empty (every layer MoE);
- ``sliding_window`` and which layers use it: ``layer_types`` when given (each
  ``full_attention`` or ``sliding_attention``), else the layout's rule: Mistral and
  Mixtral every layer when the window is not null; Gemma-2 the even layers; Gemma-3
  all but every ``sliding_window_pattern``-th (default 6). The memory profile sizes
  the KV cache as vLLM's hybrid allocator does
  (:func:`hardware.memory_profile.v1_kv_pool`); the simulators charge a token as in
  full attention (exact up to the window, conservative beyond it). Qwen2/Qwen3 with
  ``use_sliding_window`` true are refused (``max_window_layers`` is not interpreted),
  and so is a window in another layout;
- Gemma-2/3's ``attn_logit_softcapping``, ``final_logit_softcapping`` and
  ``query_pre_attn_scalar`` change the arithmetic of a step, not its size: not read;
- ``torch_dtype`` (or ``dtype``): bfloat16 / float16, 2 bytes per weight and KV value;
  anything else is refused;
- ``quantization_config.quant_method``: ``fp8`` means 1-byte weights (vLLM's
  ``--quantization fp8``, which :func:`hardware.vllm_memory_profile` models);
  ``compressed-tensors`` (llm-compressor's checkpoints, e.g. "FP8-dynamic") means the
  same when every ``config_groups`` entry targets ``["Linear"]`` with 8-bit ``float``
  ``weights``, ``ignore`` names at most ``lm_head`` (kept in the model dtype, as the fp8
  profile keeps it) and ``kv_cache_scheme`` is absent or null (the per-channel scales
  are not counted: a hidden-sized vector per matrix); its weight-only integer schemes
  (``format`` ``pack-quantized``, e.g. RedHatAI's "w4a16": 4- or 8-bit ``int``
  ``weights``, ``symmetric``, ``strategy`` ``group`` with its ``group_size`` or
  ``channel``, ``actorder`` null / ``group`` / ``weight``, no ``input_activations``)
  mean the GPTQ form of the same bits, group and act order: vLLM runs them
  (``CompressedTensorsWNA16``) with the Marlin kernels GPTQ uses, on the same bytes;
  any other scheme (quantized activations, asymmetric weights, layers left
  unquantized, a quantized KV cache) is refused naming the field; ``gptq`` (``bits`` 4 or 8, ``group_size`` -1 / 32 / 64 /
  128, ``desc_act``, ``sym`` true) and ``awq`` (``bits`` 4, ``group_size``,
  ``zero_point`` true, ``version`` gemm / gemv) mean integer weights as vLLM's Marlin
  kernels hold them (:func:`hardware.memory_profile.weight_quantization`, e.g.
  ``"awq-4bit-g128"``); ``modules_to_not_convert`` or GPTQ's ``dynamic`` overrides
  (layers left in the model dtype or quantized otherwise) are refused;
- ``text_config``: a multimodal wrapper's language model; with a ``vision_config``,
  the vision tower's and projector's weights are counted into the resident weights
  (not into a text token's FLOPs) for Mistral3's Pixtral tower and Gemma-3's SigLIP
  tower (see :func:`_vision_params`, :func:`_siglip_params`; another tower is refused
  by name). The share of the vision
  encoder in vLLM's profiling run (its activation peak with dummy images) is not
  modelled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hardware._model_presets import count_params
from hardware.llm import LLMSpec
from hardware.memory_profile import weight_quantization

__all__ = ["LAYOUTS", "ConfigModel", "model_from_config", "is_config_path"]

# model_type -> (layout note, QKV bias, per-head q/k norm, MoE, head_dim derivable)
LAYOUTS = {
    # Gemma (v1): the Llama layout's matrices (a gated GeLU MLP has the same three),
    # two RMSNorms a layer, tied embeddings by default; its class defaults head_dim to
    # 256, so the config must say it
    "gemma": ("Gemma layout: Llama layout, gated GeLU MLP, tied embeddings", False, False,
              False, False),
    # Gemma-2: Gemma's matrices, four RMSNorms a layer (before and after attention and
    # MLP), every other layer a sliding window (the even ones, as Gemma2Config's
    # layer_types default has it)
    "gemma2": ("Gemma-2 layout: Gemma layout, four norms a layer, alternating local / "
               "global attention", False, False, False, False),
    # Gemma-3 (text): Gemma-2's layout plus per-head q/k RMSNorm; layer i global when
    # (i + 1) % sliding_window_pattern == 0 (6: five local layers to one global)
    "gemma3_text": ("Gemma-3 text layout: Gemma-2 layout with per-head q/k norm, five "
                    "local layers to one global", False, True, False, False),
    "llama": ("Llama layout: no biases, SwiGLU, RMSNorm", False, False, False, True),
    "mistral": ("Mistral layout = Llama layout", False, False, False, True),
    "mixtral": ("Mixtral layout: Llama attention, SwiGLU experts with a router", False,
                False, True, True),
    "qwen2": ("Qwen2 layout: QKV bias, SwiGLU, RMSNorm", True, False, False, True),
    "qwen3": ("Qwen3 layout: per-head q/k RMSNorm, SwiGLU", False, True, False, False),
    "qwen3_moe": ("Qwen3-MoE layout: per-head q/k RMSNorm, SwiGLU experts with a router",
                  False, True, True, False),
}
_DTYPES = {"bfloat16": 2, "float16": 2}
_TIED = frozenset({"gemma", "gemma2", "gemma3_text"})  # tie by default in their classes
_NORMS = {"gemma2": 4, "gemma3_text": 4}  # RMSNorms a layer where not two
# Fields a layout's configuration class fills in when its config.json leaves them out
# (Hugging Face writes only non-default values: Gemma-3's multimodal checkpoints give a
# sparse text_config). Gemma3TextConfig's defaults, which Gemma-3-4B's published count
# (4,300,079,472 parameters with its SigLIP tower) confirms.
_CLASS_DEFAULTS = {"gemma3_text": {"num_attention_heads": 8, "num_key_value_heads": 4,
                                   "head_dim": 256, "vocab_size": 262_208,
                                   "max_position_embeddings": 131_072}}
_SPEC_FIELD = {"num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
               "head_dim": "head_dim", "vocab_size": "vocab_size",
               "max_position_embeddings": "max_position"}


@dataclass(frozen=True)
class ConfigModel:
    """What a ``config.json`` says: the model's shapes and the weight quantization
    vLLM would load it with (``None``, ``"fp8"`` or a GPTQ / AWQ form such as
    ``"awq-4bit-g128"``)."""

    spec: LLMSpec
    quantization: str | None
    path: str
    notes: tuple[str, ...] = ()  # what the profile does not model for this model


def is_config_path(value: str) -> bool:
    """Whether a ``--model`` value names a file or a folder (not a preset name): it
    exists, or it ends in ``.json`` (a missing config file is then its own error)."""
    return str(value).endswith(".json") or Path(value).expanduser().exists()


def _file(path) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"{p}: no such file (give a config.json or the folder "
                         "holding one)")
    return p


def _load(p: Path) -> dict:
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{p}: not a readable JSON file ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: a config.json is a JSON object, got "
                         f"{type(doc).__name__}")
    return doc


def model_from_config(path) -> ConfigModel:
    """The model a Hugging Face ``config.json`` describes (see the module doc for the
    fields read). One ``ValueError`` naming the file and the field for anything it
    cannot interpret."""
    p = _file(path)
    cfg = _load(p)
    where = str(p)
    vision = None
    if "text_config" in cfg:
        if not isinstance(cfg["text_config"], dict):
            raise ValueError(f"{where}: field 'text_config' must be an object")
        if "vision_config" in cfg:
            vision = _vision_params(cfg, where)
        outer, cfg = cfg, {**cfg["text_config"]}
        for k in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings"):
            if k not in cfg and k in outer:
                cfg[k] = outer[k]
        where += " text_config"
    return _interpret(cfg, where, p, vision)


def _field(d: dict, name: str, where: str, kind=int, required=True, default=None):
    """``d[name]``: a positive integer (or with ``kind=bool`` true / false); absent or
    null gives ``default`` unless ``required``; one ValueError naming the field."""
    if name not in d or d[name] is None:
        if required:
            raise ValueError(f"{where}: field '{name}' is missing")
        return default
    v = d[name]
    ok = (isinstance(v, bool) if kind is bool
          else isinstance(v, int) and not isinstance(v, bool) and v > 0)
    if not ok:
        want = "true or false" if kind is bool else "a positive integer"
        raise ValueError(f"{where}: field '{name}' must be {want}, got {v!r}")
    return v


def _vision_params(cfg: dict, where: str) -> tuple[int, str]:
    """Parameters of a multimodal wrapper's vision tower and projector, with how they
    were counted. Interpreted: Mistral3's Pixtral tower (``model_type`` ``mistral3``,
    ``vision_config.model_type`` ``pixtral``): a bias-free patch convolution
    (``num_channels x patch_size^2 x hidden``), a pre-norm, ``num_hidden_layers`` layers
    of attention (q, k, v, o: ``4 x hidden x num_attention_heads x head_dim``), a gated
    MLP (``3 x hidden x intermediate_size``) and two RMSNorms, then the projector: a
    norm, the patch merger (``hidden x spatial_merge_size^2 -> hidden``) and two linear
    layers to and within the text width (biases with ``multimodal_projector_bias``).
    Anything else is refused naming the field."""
    vc = cfg["vision_config"]
    vw = f"{where} vision_config"
    if not isinstance(vc, dict):
        raise ValueError(f"{where}: field 'vision_config' must be an object")
    if cfg.get("model_type") == "gemma3" and vc.get("model_type") == "siglip_vision_model":
        return _siglip_params(cfg, vc, where, vw)
    if cfg.get("model_type") != "mistral3" or vc.get("model_type") != "pixtral":
        raise ValueError(
            f"{where}: field 'vision_config' (model_type {vc.get('model_type')!r} in a "
            f"{cfg.get('model_type')!r} wrapper): only Mistral3's pixtral and Gemma-3's "
            "SigLIP towers are counted (another tower's weights would be missing from "
            "the memory profile)")
    if cfg.get("vision_feature_layer", -1) != -1:
        raise ValueError(f"{where}: field 'vision_feature_layer' "
                         f"{cfg['vision_feature_layer']!r}: only -1 (every layer loaded) "
                         "is interpreted")
    h, inter = _field(vc, "hidden_size", vw), _field(vc, "intermediate_size", vw)
    layers, heads = _field(vc, "num_hidden_layers", vw), _field(
        vc, "num_attention_heads", vw)
    hd = _field(vc, "head_dim", vw, required=False, default=h // heads)
    patch, ch = _field(vc, "patch_size", vw), _field(vc, "num_channels", vw)
    merge = _field(cfg, "spatial_merge_size", where)
    text_h = _field(cfg["text_config"], "hidden_size", f"{where} text_config")
    bias = _field(cfg, "multimodal_projector_bias", where, bool, required=False,
                  default=False)
    tower = ch * patch * patch * h + h + layers * (
        4 * h * heads * hd + 3 * h * inter + 2 * h)
    projector = h + h * merge * merge * h + h * text_h + text_h * text_h \
        + (2 * text_h if bias else 0)
    n = tower + projector
    return n, (f"vision_config (pixtral: {layers} layers, hidden {h}, MLP {inter}, "
               f"patch {patch}) and projector (merge {merge}) = {n:,}")


def _siglip_params(cfg: dict, vc: dict, where: str, vw: str) -> tuple[int, str]:
    """Gemma-3's SigLIP tower (``vision_config.model_type`` ``siglip_vision_model``) and
    its projector: a patch convolution with bias (``num_channels x patch_size^2 x
    hidden + hidden``), a learned position embedding per patch (``(image_size /
    patch_size)^2 x hidden``), ``num_hidden_layers`` layers of attention with biases
    (``4 x (hidden^2 + hidden)``), two LayerNorms (weight and bias) and an MLP with
    biases (``2 x hidden x intermediate + intermediate + hidden``), a final LayerNorm;
    the projector's ``hidden x text hidden`` matrix and its RMSNorm. Gemma-3-4B's
    shapes give its published 4,300,079,472 parameters (tests)."""
    h, inter = _field(vc, "hidden_size", vw), _field(vc, "intermediate_size", vw)
    layers = _field(vc, "num_hidden_layers", vw)
    patch, image = _field(vc, "patch_size", vw), _field(vc, "image_size", vw)
    ch = _field(vc, "num_channels", vw, required=False, default=3)
    if image % patch:
        raise ValueError(f"{where}: field 'vision_config.image_size' {image} is not a "
                         f"multiple of patch_size {patch}")
    if vc.get("vision_use_head") is not False:  # SiglipVisionConfig's default is true
        raise ValueError(f"{where}: field 'vision_config.vision_use_head' must be false "
                         "(Gemma-3's tower has no pooling head; a head is not counted)")
    text_h = _field(cfg["text_config"], "hidden_size", f"{where} text_config")
    tower = ch * patch * patch * h + h + (image // patch) ** 2 * h + layers * (
        4 * (h * h + h) + 4 * h + 2 * h * inter + inter + h) + 2 * h
    projector = h * text_h + h
    n = tower + projector
    return n, (f"vision_config (siglip: {layers} layers, hidden {h}, MLP {inter}, "
               f"{image}px / patch {patch}) and projector = {n:,}")


def _interpret(cfg: dict, where: str, p: Path, vision=None) -> ConfigModel:
    def field(name, kind=int, required=True, default=None):
        return _field(cfg, name, where, kind, required, default)

    mt = cfg.get("model_type")
    if mt not in LAYOUTS:
        raise ValueError(f"{where}: field 'model_type' {mt!r} is not interpreted "
                         f"(known layouts: {', '.join(LAYOUTS)})")
    layout, qkv_bias, qk_norm, moe, derive_hd = LAYOUTS[mt]
    _refuse_unread(cfg, where, mt)
    filled = {k: v for k, v in _CLASS_DEFAULTS.get(mt, {}).items() if cfg.get(k) is None}
    cfg = {**cfg, **filled}
    L, h = field("num_hidden_layers"), field("hidden_size")
    nh = field("num_attention_heads")
    kv = field("num_key_value_heads", required=False, default=nh)
    hd = field("head_dim", required=not derive_hd, default=None)
    if hd is None:
        if h % nh:
            raise ValueError(f"{where}: field 'head_dim' is missing and hidden_size "
                             f"{h} is not a multiple of num_attention_heads {nh}")
        hd = h // nh
    vocab, maxpos = field("vocab_size"), field("max_position_embeddings")
    tied = field("tie_word_embeddings", bool, required=False, default=mt in _TIED)
    experts = per_tok = 0
    if moe:
        experts = field("num_local_experts" if mt == "mixtral" else "num_experts")
        per_tok = field("num_experts_per_tok")
        inter = field("moe_intermediate_size" if mt == "qwen3_moe"
                      else "intermediate_size")
    else:
        inter = field("intermediate_size")
    dt = cfg.get("torch_dtype", cfg.get("dtype"))
    if dt not in _DTYPES:
        raise ValueError(f"{where}: field 'torch_dtype' {dt!r} is not interpreted "
                         f"(known: {', '.join(_DTYPES)})")
    quant = _quantization(cfg.get("quantization_config"), where)
    window, n_sliding, how = _sliding(cfg, mt, L, where)
    shape = dict(L=L, h=h, nh=nh, kv=kv, hd=hd, inter=inter, vocab=vocab, tied=tied,
                 qkv_bias=qkv_bias, qk_norm=qk_norm, experts=experts, per_tok=per_tok,
                 norms=_NORMS.get(mt, 2))
    try:
        n = count_params(**shape)
        active = count_params(**shape, active=True) if experts else None
        if vision is not None:  # resident weights; a text token's FLOPs skip the tower
            active, n = (active or n), n + vision[0]
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    src = f"{p}"
    cite = {"n_layers": f"num_hidden_layers={L}", "hidden_size": f"hidden_size={h}",
            "n_heads": f"num_attention_heads={nh}",
            "n_kv_heads": (f"num_key_value_heads={kv}" if "num_key_value_heads" in cfg
                           else "num_key_value_heads absent: one per query head"),
            "head_dim": (f"head_dim={hd}" if cfg.get("head_dim") is not None
                         else f"hidden_size/num_attention_heads = {h}/{nh}"),
            "intermediate_size": f"{'moe_' if mt == 'qwen3_moe' else ''}"
                                 f"intermediate_size={inter}",
            "vocab_size": f"vocab_size={vocab}",
            "max_position": f"max_position_embeddings={maxpos}",
            "tie_word_embeddings": (f"tie_word_embeddings={str(tied).lower()}"
                                    if "tie_word_embeddings" in cfg else
                                    f"tie_word_embeddings absent: {mt}'s default, "
                                    f"{str(tied).lower()}"),
            "dtype_bytes": f"torch_dtype={dt}: {_DTYPES[dt]} bytes",
            "n_params": f"counted from the config's shapes ({layout}; "
                        f"hardware._model_presets.count_params) = {n:,}"}
    if experts:
        cite["n_experts"] = f"experts={experts}"
        cite["n_experts_per_token"] = f"num_experts_per_tok={per_tok}"
        cite["n_active_params"] = f"counted with {per_tok} of {experts} experts = {active:,}"
    for k, v in filled.items():
        cite[_SPEC_FIELD[k]] = f"{k} absent: the {mt} configuration class's default {v}"
    if window is not None:
        cite["sliding_window"] = f"sliding_window={window}"
        cite["sliding_layers"] = how
    if vision is not None:
        cite["n_params"] += f" including the {vision[1]}"
        cite["n_active_params"] = f"the language model's parameters = {active:,}"
    name = cfg.get("_name_or_path") or p.parent.name or p.stem
    spec = LLMSpec(name=f"{name} (config.json)", n_layers=L, hidden_size=h, n_heads=nh,
                   n_kv_heads=kv, head_dim=hd, intermediate_size=inter,
                   vocab_size=vocab, n_params=n, dtype_bytes=_DTYPES[dt],
                   max_position=maxpos, tie_word_embeddings=tied, n_experts=experts,
                   n_experts_per_token=per_tok, n_active_params=active,
                   sliding_window=window, sliding_layers=n_sliding,
                   sources=tuple((k, f"{src}: {v}") for k, v in cite.items()),
                   config_path=str(p))
    notes = () if vision is None else (
        f"{p}: the vision tower's weights are counted; its share of vLLM's profiling "
        "run (the encoder on dummy images) is not, so the KV cache may be smaller than "
        "predicted",)
    return ConfigModel(spec=spec, quantization=quant, path=str(p), notes=notes)


def _refuse_unread(cfg: dict, where: str, mt: str) -> None:
    """Fields of these layouts that change the shapes or the KV cache and are not
    interpreted: one error naming the first."""
    if cfg.get("attention_bias"):
        raise ValueError(f"{where}: field 'attention_bias' true is not interpreted "
                         "(q/k/v/o biases are not counted)")
    if cfg.get("decoder_sparse_step", 1) != 1:
        raise ValueError(f"{where}: field 'decoder_sparse_step' "
                         f"{cfg['decoder_sparse_step']!r}: only 1 (every layer MoE) is "
                         "interpreted")
    if cfg.get("mlp_only_layers"):
        raise ValueError(f"{where}: field 'mlp_only_layers' is not empty: dense layers "
                         "among MoE ones are not interpreted")


_QWEN = ("qwen2", "qwen3", "qwen3_moe")


def _sliding(cfg: dict, mt: str, L: int, where: str) -> tuple[int | None, int, str]:
    """``(sliding_window, layers using it, how they were counted)``; ``(None, 0, "")``
    when every layer attends to all tokens. One error naming the field otherwise."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        kinds = {"full_attention", "sliding_attention"}
        if not isinstance(types, list) or len(types) != L or not set(types) <= kinds:
            raise ValueError(f"{where}: field 'layer_types' must list {L} entries, each "
                             "full_attention or sliding_attention (others are not "
                             "interpreted)")
        n = types.count("sliding_attention")
        how = f"layer_types: {n} of {L} sliding_attention"
    elif mt in ("mistral", "mixtral"):  # a window, when set, applies to every layer
        n, how = (0 if window is None else L), f"every layer ({mt}: sliding_window set)"
    elif mt == "gemma2":
        n, how = (L + 1) // 2, "layers 0, 2, 4, ... (Gemma2Config's layer_types default)"
    elif mt == "gemma3_text":
        pattern = _field(cfg, "sliding_window_pattern", where, required=False, default=6)
        n = L - L // pattern
        how = (f"all but every {pattern}th layer (sliding_window_pattern={pattern}; "
               "Gemma3TextConfig's default 6)")
    elif mt in _QWEN:
        n, how = 0, ""
        if cfg.get("use_sliding_window") and window is not None:
            raise ValueError(f"{where}: field 'use_sliding_window' is true: the layers "
                             f"a {mt} window applies to (max_window_layers) are not "
                             "interpreted")
    else:
        n, how = 0, ""
        if window is not None:
            raise ValueError(f"{where}: field 'sliding_window' ({window}) is set: a "
                             f"window is not part of the {mt} layout here")
    if n == 0:
        return None, 0, ""
    return _field(cfg, "sliding_window", where), n, how


def _quantization(q, where: str) -> str | None:
    if q is None:
        return None
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method == "fp8":
        return "fp8"
    if method == "compressed-tensors":
        return _compressed_tensors(q, where)
    if method in ("gptq", "awq"):
        return _integer(q, method, where)
    raise ValueError(f"{where}: field 'quantization_config' (quant_method {method!r}) is "
                     "not interpreted (fp8, compressed-tensors fp8, gptq and awq are)")


def _integer(q: dict, method: str, where: str) -> str:
    """The :func:`hardware.memory_profile.weight_quantization` form of a GPTQ or AWQ
    ``quantization_config`` (see the module doc); one error naming the field that
    vLLM's Marlin kernels would not run or that would change the bytes counted."""
    f = f"{where}: field 'quantization_config"
    bits, group = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size"))
    for name, v in (("bits", bits), ("group_size", group)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{f}.{name}' must be an integer, got {v!r}")
    act = False
    if method == "gptq":
        if q.get("sym", True) is not True:
            raise ValueError(f"{f}.sym' is {q.get('sym')!r}: asymmetric GPTQ weights "
                             "(zero points kept) are not interpreted")
        act = q.get("desc_act", False)
        if not isinstance(act, bool):
            raise ValueError(f"{f}.desc_act' must be true or false, got {act!r}")
        fmt = q.get("checkpoint_format", "gptq")
        if fmt != "gptq":
            raise ValueError(f"{f}.checkpoint_format' {fmt!r}: only 'gptq' is "
                             "interpreted")
    else:
        if q.get("zero_point", True) is not True:
            raise ValueError(f"{f}.zero_point' is {q.get('zero_point')!r}: AWQ without "
                             "zero points is not interpreted")
        version = str(q.get("version", "gemm")).lower()
        if version not in ("gemm", "gemv"):
            raise ValueError(f"{f}.version' {version!r}: only gemm / gemv packing "
                             "is interpreted")
    if q.get("modules_to_not_convert"):
        raise ValueError(f"{f}.modules_to_not_convert' "
                         f"{q['modules_to_not_convert']!r}: linear layers left in the "
                         "model dtype are not interpreted")
    if q.get("dynamic"):
        raise ValueError(f"{f}.dynamic' is set: per-module overrides are not interpreted")
    form = f"{method}-{bits}bit-g{group}" + ("-act" if act else "")
    try:
        weight_quantization(form)
    except ValueError as e:
        raise ValueError(f"{where}: field 'quantization_config': {e}") from None
    return form


def _compressed_tensors(q: dict, where: str) -> str:
    """The weight form of a compressed-tensors scheme (see the module doc): ``fp8``
    where every group's weights are 8-bit floats; the GPTQ form (Marlin's bytes) where
    they are symmetric 4- or 8-bit integers packed (``pack-quantized``, vLLM's
    ``CompressedTensorsWNA16``, run by its Marlin kernels); one error naming the first
    field that is neither."""
    f = f"{where}: field 'quantization_config"
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError(f"{f}.config_groups' must be a non-empty object "
                         "(compressed-tensors)")
    forms = set()
    for name, g in groups.items():
        if not isinstance(g, dict) or g.get("targets") != ["Linear"]:
            raise ValueError(f"{f}.config_groups.{name}.targets' must be [\"Linear\"] "
                             "(other targets are not interpreted)")
        forms.add(_ct_weights(q, g, f"{f}.config_groups.{name}"))
    if len(forms) > 1:
        raise ValueError(f"{f}.config_groups' mixes weight forms {sorted(forms)}: one "
                         "form for every linear layer is interpreted")
    ignore = q.get("ignore") or []
    if not isinstance(ignore, list) or any(x != "lm_head" for x in ignore):
        raise ValueError(f"{f}.ignore' {ignore!r}: only lm_head may stay unquantized "
                         "(other layers' weights would be counted quantized)")
    if q.get("kv_cache_scheme") is not None:
        raise ValueError(f"{f}.kv_cache_scheme' is set: a quantized KV cache from the "
                         "checkpoint is not interpreted (give --kv-cache-dtype instead)")
    return forms.pop()


def _ct_weights(q: dict, g: dict, f: str) -> str:
    """One compressed-tensors config group's weight form (``fp8`` or a GPTQ form)."""
    w = g.get("weights")
    if isinstance(w, dict) and w.get("num_bits") == 8 and w.get("type") == "float":
        return "fp8"
    if not (isinstance(w, dict) and w.get("type") == "int"
            and w.get("num_bits") in (4, 8)):
        got = (f"num_bits {w.get('num_bits')!r}, type {w.get('type')!r}"
               if isinstance(w, dict) else repr(w))
        raise ValueError(f"{f}.weights' ({got}) is not interpreted (8-bit float, and "
                         "4- or 8-bit int weights, are)")
    if g.get("input_activations") is not None:
        raise ValueError(f"{f}.input_activations' is set: quantized activations "
                         "(W4A8, W8A8) are not interpreted, only weight-only schemes")
    if q.get("format") != "pack-quantized":
        raise ValueError(f"{f[:f.rindex('.')]}.format' {q.get('format')!r}: integer "
                         "weights are interpreted in the 'pack-quantized' format")
    if w.get("symmetric") is not True:
        raise ValueError(f"{f}.weights.symmetric' is {w.get('symmetric')!r}: "
                         "asymmetric integer weights (zero points kept) are not "
                         "interpreted")
    strategy = w.get("strategy")
    if strategy == "channel":
        group = -1
    elif strategy == "group":
        group = w.get("group_size")
        if isinstance(group, bool) or not isinstance(group, int):
            raise ValueError(f"{f}.weights.group_size' must be an integer, got "
                             f"{group!r}")
    else:
        raise ValueError(f"{f}.weights.strategy' {strategy!r}: 'group' or 'channel' "
                         "is interpreted")
    # compressed-tensors' ActivationOrdering: "dynamic" is an alias of "group", "static"
    # of "weight" (its quant_args.py); by group a g_idx is kept (Marlin sorts by it, as
    # for GPTQ's desc_act); by weight the order is applied to the checkpoint, no index
    order = w.get("actorder")
    if order not in (None, False, "group", "dynamic", "weight", "static"):
        raise ValueError(f"{f}.weights.actorder' {order!r}: null, 'group' / 'dynamic' "
                         "or 'weight' / 'static' is interpreted")
    form = f"gptq-{w['num_bits']}bit-g{group}" + ("-act" if order in ("group", "dynamic")
                                                  else "")
    try:
        weight_quantization(form)
    except ValueError as e:
        raise ValueError(f"{f}.weights': {e}") from None
    return form
