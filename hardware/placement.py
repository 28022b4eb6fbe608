"""A placement of a model on devices (:class:`Deployment`) and the budget rule that
sizes its KV pool when no engine profile is given (see :mod:`hardware.deploy`, which
chooses the placement, and :mod:`hardware.memory_profile`, which sizes the pool as vLLM
does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hardware.devices import Device
from hardware.llm import LLMSpec

__all__ = ["DEFAULT_MAX_BATCHED_TOKENS", "DEFAULT_MAX_NUM_SEQS", "DEFAULT_MEM_UTIL",
           "Deployment", "InfeasibleError", "activation_reserve_bytes", "tp_splits_heads"]

# vLLM defaults: gpu_memory_utilization=0.9, max_num_seqs=256. 2048 batched tokens
# per step is a common chunked-prefill budget (assumption; tune per experiment).
DEFAULT_MEM_UTIL = 0.9


DEFAULT_MAX_BATCHED_TOKENS = 2048


DEFAULT_MAX_NUM_SEQS = 256


class InfeasibleError(ValueError):
    """The model does not fit on the devices asked for."""


def tp_splits_heads(model: LLMSpec, tp: int) -> bool:
    """vLLM's rule: tp divides the query heads and divides or is a multiple of the
    KV heads (KV heads are replicated when tp exceeds them)."""
    kv = model.n_kv_heads
    return model.n_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def activation_reserve_bytes(
    model: LLMSpec,
    tp: int = 1,
    *,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> float:
    """Peak activation/workspace bytes per device for one step (see module doc)."""
    per_token = model.dtype_bytes * (
        4 * model.hidden_size + 2 * model.intermediate_size / tp
    )
    logits = max_num_seqs * model.vocab_size * 4.0  # fp32 logits, gathered per rank
    return max_batched_tokens * per_token + logits


@dataclass(frozen=True)
class Deployment:
    """``model`` served by replicas of ``tp * pp`` devices each.

    ``n_devices`` counts all devices; it must be a multiple of ``tp * pp`` and
    ``n_devices // (tp * pp)`` replicas run side by side. Capacities are per replica.
    Construction raises :class:`InfeasibleError` when the weights do not fit or the
    KV pool holds less than one token.
    """

    device: Device
    model: LLMSpec
    n_devices: int
    tp: int
    pp: int = 1
    mem_util: float = DEFAULT_MEM_UTIL
    activation_bytes_per_device: float = 0.0
    # A vLLM memory profile (hardware.memory_profile.MemoryProfile) of this placement:
    # when set, weights, KV bytes per token and the KV pool are the profile's.
    profile: object | None = None

    def __post_init__(self):
        name = f"Deployment of {self.model.name!r} on {self.device.name!r}"
        for field in ("n_devices", "tp", "pp"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(
                    f"{name}: field {field!r} must be an integer >= 1, got {v!r}"
                )
        if self.n_devices % (self.tp * self.pp):
            raise ValueError(
                f"{name}: n_devices={self.n_devices} is not a multiple "
                f"of tp*pp={self.tp * self.pp}"
            )
        if not tp_splits_heads(self.model, self.tp):
            raise ValueError(
                f"{name}: tp={self.tp} must divide n_heads={self.model.n_heads} and "
                f"divide or be a multiple of n_kv_heads={self.model.n_kv_heads}"
            )
        if self.pp > self.model.n_layers:
            raise ValueError(
                f"{name}: pp={self.pp} exceeds n_layers={self.model.n_layers}"
            )
        if not isinstance(self.mem_util, (int, float)) or not 0 < self.mem_util <= 1:
            raise ValueError(
                f"{name}: field 'mem_util' must be in (0, 1], got {self.mem_util!r}"
            )
        act = self.activation_bytes_per_device
        if isinstance(act, bool) or not isinstance(act, (int, float)) or act < 0:
            raise ValueError(
                f"{name}: field 'activation_bytes_per_device' must be >= 0, got {act!r}"
            )
        if self.profile is not None:
            self._check_profile(name)
            return
        budget = self.device.memory_bytes * self.mem_util
        need = self.weight_bytes_per_device + act
        if need > budget:
            raise InfeasibleError(
                f"{name} (tp={self.tp}, pp={self.pp}): needs {need:,.0f} bytes per "
                f"device ({self.weight_bytes_per_device:,.0f} weights + {act:,.0f} "
                f"activations) but only {budget:,.0f} are available "
                f"({self.device.memory_bytes:,.0f} x mem_util {self.mem_util})"
            )
        if self.kv_capacity_tokens < 1:
            raise InfeasibleError(
                f"{name} (tp={self.tp}, pp={self.pp}): KV pool of "
                f"{self.kv_pool_bytes_per_device:,.0f} bytes per device holds no "
                f"token ({self.kv_bytes_per_token_per_device:,.0f} bytes each)"
            )

    def _check_profile(self, name: str) -> None:
        p = self.profile
        same = (p.device, p.model, p.tp, p.pp) == (self.device, self.model, self.tp,
                                                   self.pp)
        if not same:
            raise ValueError(f"{name}: field 'profile' is of another placement "
                             f"({p.model.name} on {p.device.name}, tp={p.tp}, "
                             f"pp={p.pp})")
        if p.refusal is not None:
            raise InfeasibleError(f"{name}: {p.refusal[0]}: {p.refusal[1]}")

    @property
    def n_replicas(self) -> int:
        return self.n_devices // (self.tp * self.pp)

    @property
    def weight_bytes_per_device(self) -> float:
        if self.profile is not None:
            return float(self.profile.weights_bytes)
        return self.model.weight_bytes / (self.tp * self.pp)

    @property
    def kv_heads_per_device(self) -> int:
        """KV heads each device stores; replicated when tp > n_kv_heads (as vLLM)."""
        return max(self.model.n_kv_heads // self.tp, 1)

    @property
    def kv_bytes_per_token_layer_device(self) -> float:
        """Bytes one token's K+V occupy in one layer on one device.

        A paged block of ``k`` tokens is ``k`` times this: the unit of a scattered read.
        """
        if self.profile is not None:  # its KV dtype (fp8: 1 byte)
            return self.profile.kv_bytes_per_token / math.ceil(
                self.model.n_layers / self.pp)
        m = self.model
        return 2 * self.kv_heads_per_device * m.head_dim * m.dtype_bytes

    @property
    def kv_bytes_per_token_per_device(self) -> float:
        """Bytes one token's K+V occupy on one device (its ``n_layers / pp`` layers)."""
        return self.model.n_layers / self.pp * self.kv_bytes_per_token_layer_device

    @property
    def kv_pool_bytes_per_device(self) -> float:
        if self.profile is not None:
            return float(self.profile.kv_cache_bytes)
        return (
            self.device.memory_bytes * self.mem_util
            - self.weight_bytes_per_device
            - self.activation_bytes_per_device
        )

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV one replica holds (each device stores its share of each);
        with a profile, vLLM's block-rounded count."""
        if self.profile is not None:
            return int(self.profile.kv_cache_tokens)
        pool = self.kv_pool_bytes_per_device
        return max(math.floor(pool / self.kv_bytes_per_token_per_device), 0)
