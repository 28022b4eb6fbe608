"""The elastic family: eLLM's unified KV/activation pool with a CPU buffer and its vLLM
baselines (static activation reservation, chunked prefill). Importing it registers the
family and its systems. Semantics: ``docs/elastic-semantics.md``.

Parameters: ``vllm`` none; ``vllm-cp`` ``chunk`` (tokens); ``ellm`` ``a``, ``theta``,
``cpu_buffer_gib``, ``k``, ``w`` (see ``models.elastic.systems``).
"""

from models.elastic.family import ELASTIC, POLICIES
from models.family import register_family

register_family(ELASTIC)

from models.elastic import systems  # noqa: E402  (registers ellm, vllm, vllm-cp)

__all__ = ["ELASTIC", "POLICIES", "systems"]
