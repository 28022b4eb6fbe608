"""Memory-system simulators: one code path with an exact and a relaxed mode.

The core (``family``, ``simulate``, ``server``, ``outcomes``, ``registry``, ``domains``,
``relax``, ``workload``) runs any registered family; each family is one sub-package
(``models.bucketed``, ``models.elastic``, ``models.eviction``, ``models.dropping``) that registers itself and its systems when
imported here.
"""

from models.domains import DOMAINS, Domain
from models.family import (Family, Inputs, IterLog, Metric, SimOptions, deployment_values,
                           family_of, get_family, list_families, make_inputs,
                           make_options, register_family)
from models.registry import (ParamSpec, SystemSpec, get_system, list_systems,
                             register_system, validate_params)
from models.server import ServerConfig
from models.simulate import (compile_many, init_state, metrics, run_blocks, simulate,
                             simulate_until_done, simulate_until_done_many, trace_guard)
from models.workload import Workload, make_workload

from models import bucketed  # noqa: E402,F401  (registers the bucketed family)
from models import elastic  # noqa: E402,F401  (registers the elastic family)
from models import eviction  # noqa: E402,F401  (registers the eviction family)
from models import dropping  # noqa: E402,F401  (registers the parameter-dropping family)

__all__ = [
    "DOMAINS", "Domain", "Family", "Inputs", "IterLog", "Metric", "ParamSpec",
    "ServerConfig",
    "SimOptions", "SystemSpec", "Workload", "deployment_values", "family_of",
    "get_family", "get_system", "init_state", "list_families", "list_systems",
    "make_inputs", "make_options", "make_workload", "metric_specs", "metrics",
    "register_family", "register_system", "run_blocks", "simulate",
    "simulate_until_done", "simulate_until_done_many", "trace_guard", "validate_params",
    "compile_many",
]


def metric_specs(system: str | None = None) -> dict:
    """Declared metrics (name -> :class:`Metric`) of ``system``'s family, or of every
    registered family."""
    fams = ([family_of(system)] if system else [get_family(f) for f in list_families()])
    out: dict = {}
    for fam in fams:
        out.update(fam.metrics_spec)
    return out
