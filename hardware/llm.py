"""Decoder-only LLM shapes: what a memory manager and a roofline need to know.

Presets live in ``hardware/_model_presets.py``, each number with its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware._registry import Registry, check_positive, check_sources

__all__ = [
    "NUMERIC_FIELDS",
    "LLMSpec",
    "get_model",
    "list_models",
    "register_model",
]

NUMERIC_FIELDS = (
    "n_layers",
    "hidden_size",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "n_params",
    "dtype_bytes",
    "max_position",
)
_INT_FIELDS = NUMERIC_FIELDS[:-2] + ("max_position",)


@dataclass(frozen=True, kw_only=True)
class LLMSpec:
    """Shapes of one model; byte counts assume ``dtype_bytes`` per weight/KV value."""

    name: str
    n_layers: int
    hidden_size: int
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (GQA); == n_heads for MHA
    head_dim: int
    intermediate_size: int  # MLP inner width (ffn_dim for OPT)
    vocab_size: int
    n_params: int  # total parameter count, embeddings included
    dtype_bytes: float = 2  # bytes per weight and per KV value (fp16/bf16)
    max_position: int  # context limit (max_position_embeddings)
    sources: tuple[tuple[str, str], ...] = ()
    # Optional shape facts (defaults: a dense, gated-MLP decoder, untied LM head).
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    gated_mlp: bool = True  # SwiGLU gate+up+down (3 matrices); False: fc1+fc2 (OPT)
    n_experts: int = 0  # routed experts per MoE layer; 0: dense MLP
    n_experts_per_token: int = 0  # experts each token uses (MoE top-k)
    n_active_params: int | None = None  # parameters one token uses; None: n_params
    # Sliding-window attention: ``sliding_layers`` of the ``n_layers`` attend to the
    # last ``sliding_window`` tokens only (Mistral-7B-v0.1: all 32 at 4096; Gemma-2:
    # every other layer; Gemma-3: 5 of 6); None / 0: every layer attends to all
    sliding_window: int | None = None
    sliding_layers: int = 0
    aliases: tuple[str, ...] = ()  # other names (Hugging Face ids), case-insensitive
    # the Hugging Face config.json the shapes were read from (None: a preset)
    config_path: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(
                f"LLMSpec: field 'name' must be a non-empty string, got {self.name!r}"
            )
        owner = f"LLMSpec {self.name!r}"
        for field in _INT_FIELDS:
            check_positive(owner, field, getattr(self, field), integer=True)
        check_positive(owner, "dtype_bytes", self.dtype_bytes)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{owner}: field 'n_kv_heads' ({self.n_kv_heads}) must divide "
                f"n_heads ({self.n_heads})"
            )
        for field in ("tie_word_embeddings", "gated_mlp"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"{owner}: field {field!r} must be a bool")
        e, k = self.n_experts, self.n_experts_per_token
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (e, k)) \
                or e < 0 or (e == 0) != (k == 0) or k > e:
            raise ValueError(
                f"{owner}: field 'n_experts_per_token' ({k!r}) must be in "
                f"[1, n_experts] for an MoE model and 0 with n_experts={e!r}"
            )
        if self.n_active_params is not None:
            check_positive(owner, "n_active_params", self.n_active_params, integer=True)
            if self.n_active_params > self.n_params:
                raise ValueError(
                    f"{owner}: field 'n_active_params' ({self.n_active_params}) "
                    f"exceeds n_params ({self.n_params})"
                )
        w, n = self.sliding_window, self.sliding_layers
        if w is not None:
            check_positive(owner, "sliding_window", w, integer=True)
        if isinstance(n, bool) or not isinstance(n, int) or not (
                (w is None and n == 0) or (w is not None and 1 <= n <= self.n_layers)):
            raise ValueError(
                f"{owner}: field 'sliding_layers' ({n!r}) must be in [1, n_layers] "
                f"with a sliding_window and 0 without one (sliding_window={w!r})"
            )
        aliases = self.aliases
        if isinstance(aliases, str) or not all(
                isinstance(a, str) and a for a in aliases):
            raise ValueError(
                f"{owner}: field 'aliases' must be a tuple of non-empty strings, "
                f"got {aliases!r}"
            )
        object.__setattr__(self, "aliases", tuple(aliases))
        object.__setattr__(self, "sources", check_sources(owner, self.sources))

    @property
    def active_params(self) -> int:
        """Parameters one token's forward pass uses: ``n_active_params`` for an MoE
        model (shared weights plus ``n_experts_per_token`` experts), else ``n_params``.
        Weights in memory are always ``n_params`` (vLLM keeps every expert resident)."""
        return self.n_params if self.n_active_params is None else self.n_active_params

    @property
    def kv_bytes_per_token_layer(self) -> float:
        """Bytes of K and V one token stores in one layer (all KV heads)."""
        return 2 * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes of K and V one token stores across all layers."""
        return self.n_layers * self.kv_bytes_per_token_layer

    @property
    def weight_bytes(self) -> float:
        return self.n_params * self.dtype_bytes

    @property
    def attn_flops_per_ctx_token(self) -> float:
        """FLOPs one new token spends per cached token it attends to (QK^T and AV)."""
        return 4 * self.n_layers * self.n_heads * self.head_dim

    def flops_per_token(self, context_tokens):
        """FLOPs to produce one token attending to ``context_tokens`` cached tokens.

        ``2 * active_params`` for the matmuls (``n_params`` for a dense model) plus
        the attention term; works on floats, NumPy and traced JAX arrays.
        """
        return 2 * self.active_params + self.attn_flops_per_ctx_token * context_tokens

    def source(self, field: str) -> str | None:
        """Where ``field`` came from, or None if no source is recorded."""
        return dict(self.sources).get(field)


_MODELS: Registry[LLMSpec] = Registry("model")


def register_model(model: LLMSpec, *, overwrite: bool = False) -> LLMSpec:
    """Add ``model`` to the registry (names are case-insensitive)."""
    if not isinstance(model, LLMSpec):
        raise TypeError(f"register_model expects an LLMSpec, got {model!r}")
    return _MODELS.register(model, overwrite=overwrite)


def get_model(name: str) -> LLMSpec:
    """The registered model called ``name`` or one of its aliases (a Hugging Face id
    such as ``Qwen/Qwen3-8B``), case-insensitive; ValueError lists the known names."""
    return _MODELS.get(name)


def list_models() -> list[str]:
    """Registered model names, sorted."""
    return _MODELS.names()
