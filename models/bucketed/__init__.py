"""The bucketed family: static worst-case pre-allocation, vLLM-style paged KV, S3-style
static buckets and ODMA (adaptive quantile buckets, uncertainty routing, a large-bucket
safety pool, mid-decode migration). Importing it registers the family and its systems.

Policy parameters are a dict of float32 leaves: ``static`` none; ``paged``
``block_size`` (tokens); ``s3`` ``bounds`` [B-1] (tokens, increasing); ``odma``
``levels`` [B-1] quantile levels, ``gamma`` (inflation), ``tau`` (routing threshold on
u), ``large_share`` (share of KV capacity in the large pool); ``vllm-v1`` (paged's rules
under vLLM V1's scheduler, ``models.bucketed.engine``) ``max_num_seqs``,
``max_num_batched_tokens``, ``gpu_memory_utilization`` and ``block_size``: vLLM's engine
arguments, which set the run's batch limits and KV capacity.
"""

from models.bucketed.family import BUCKETED
from models.family import register_family

register_family(BUCKETED)

from models.bucketed import systems  # noqa: E402  (registers the systems)
from models.bucketed.policies import BucketPolicy, get_policy, register_policy  # noqa: E402

__all__ = ["BUCKETED", "BucketPolicy", "get_policy", "register_policy", "systems"]
