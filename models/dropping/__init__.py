"""The parameter-dropping family: KunServe (drop replicated weights under memory
throttling, pipeline across instances, restore) and its baselines vLLM (recompute), vLLM
PP, InferCept (swap) and Llumnix (migration) on one multi-instance cluster. Importing it
registers the family and its systems. Semantics: ``docs/kunserve-semantics.md``.

Parameters: ``kunserve`` ``theta``, ``margin``, ``min_tokens``, ``chunk_mib``; the
baselines none (see ``models.dropping.systems``). :func:`timeline` runs a cluster and
returns its memory over time.
"""

from models.dropping.family import DROPPING, POLICIES
from models.dropping.timeline import timeline
from models.family import register_family

register_family(DROPPING)

from models.dropping import systems  # noqa: E402  (registers the systems)

__all__ = ["DROPPING", "POLICIES", "systems", "timeline"]
