"""The bucketed systems' policies: which rule each phase of ``step`` applies.

A :class:`BucketPolicy` is static (pure functions and flags, hashable); ``step`` reads it
instead of comparing system names, so a new bucketed system is a new policy registered
under its name (with its :class:`models.registry.SystemSpec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax.numpy as jnp

from models.bucketed.memory import (grow_block, migrate, reserve_block, reserve_bucket,
                                    reserve_max_len, reserve_routed,
                                    reserve_routed_per_bucket, resume_block,
                                    resume_max_len)

__all__ = ["BucketPolicy", "POLICIES", "get_policy", "register_policy"]


def _contiguous(params, cfg):
    return jnp.float32(cfg.max_len)


def _block_chunk(params, cfg):
    return params["block_size"]


@dataclass(frozen=True)
class BucketPolicy:
    """How one bucketed system reserves, overflows and resumes.

    ``reserve(params, bounds, prompt, pred, u, t, cfg)`` -> (output reservation, large-
    pool weight) at admission; ``on_overflow`` the step-2 rule (``grow_block``,
    ``migrate`` or None: reservations never overflow); ``need_resume`` the tokens a
    preempted slot re-reserves (None: the system never preempts); ``chunk(params, cfg)``
    the contiguous KV run (tokens) the step-time model charges random access by.
    ``large_pool``: ``large_share`` of capacity is a large-bucket pool; ``adaptive_bounds``:
    bounds are sliding-window quantiles at ``levels`` (else the ``bounds`` parameter);
    ``counts_overflows``: admissions whose output outgrows their bucket are counted;
    ``priority``: running and preempted requests are ordered by (re)admission, vLLM's
    queues (else by slot); ``watermark``: admissions leave ``cfg.watermark_tokens`` free;
    ``borrow`` (set from the family option ``large_borrow``): the large pool may use free
    normal-pool memory; ``engine``: the server config comes from the engine arguments in
    the parameters (``models.bucketed.engine``), not from the scenario.
    """

    reserve: Callable
    on_overflow: Callable | None = None
    need_resume: Callable | None = None
    chunk: Callable = _contiguous
    large_pool: bool = False
    adaptive_bounds: bool = False
    counts_overflows: bool = False
    priority: bool = False
    watermark: bool = False
    borrow: bool = False
    engine: bool = False

    @property
    def preempts(self) -> bool:
        return self.need_resume is not None


POLICIES: dict[str, BucketPolicy] = {}


def register_policy(name: str, policy: BucketPolicy) -> BucketPolicy:
    POLICIES[name] = policy
    return policy


def get_policy(name: str) -> BucketPolicy:
    if name not in POLICIES:
        raise ValueError(f"no bucketed policy for system {name!r}; known: "
                         f"{', '.join(sorted(POLICIES))}")
    return POLICIES[name]


register_policy("static", BucketPolicy(reserve=reserve_max_len))
register_policy("paged", BucketPolicy(reserve=reserve_block, on_overflow=grow_block,
                                      need_resume=resume_block, chunk=_block_chunk,
                                      priority=True, watermark=True))
register_policy("s3", BucketPolicy(reserve=reserve_bucket, on_overflow=migrate,
                                   need_resume=resume_max_len, counts_overflows=True))
register_policy("odma", BucketPolicy(reserve=reserve_routed, on_overflow=migrate,
                                     need_resume=resume_max_len, large_pool=True,
                                     adaptive_bounds=True, counts_overflows=True))
register_policy("odma-pb", BucketPolicy(reserve=reserve_routed_per_bucket,
                                        on_overflow=migrate, need_resume=resume_max_len,
                                        large_pool=True, adaptive_bounds=True,
                                        counts_overflows=True))
register_policy("vllm-v1", BucketPolicy(reserve=reserve_block, on_overflow=grow_block,
                                        need_resume=resume_block, chunk=_block_chunk,
                                        priority=True, watermark=True, engine=True))
