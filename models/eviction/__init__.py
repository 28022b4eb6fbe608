"""The priced-eviction family: Token-PD (priced token eviction with a dual memory price)
and its baselines FIFO, LRU, H2O and no eviction, on one continuous-batching loop with an
explicit attention model. Importing it registers the family and its systems.
Semantics: ``docs/tokenpd-semantics.md``.

Parameters: ``token-pd`` ``eta``, ``lam``, ``mu_0``, ``delta``, ``budget``;
``token-pd-tiers`` the same, the first four per priority tier (vectors of 4); ``h2o``
``k``, ``r``; ``fifo``, ``lru``, ``no-evict`` none (see ``models.eviction.systems``).
"""

from models.eviction.family import EVICTION, POLICIES
from models.family import register_family

register_family(EVICTION)

from models.eviction import systems  # noqa: E402  (registers the systems)

__all__ = ["EVICTION", "POLICIES", "systems"]
