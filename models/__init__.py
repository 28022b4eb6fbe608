"""Memory-system simulators: one code path with an exact and a relaxed mode."""

from models import systems as _systems  # noqa: F401  (registers the systems)
from models.registry import (ParamSpec, SystemSpec, get_system, list_systems,
                             register_system, validate_params)
from models.server import ServerConfig
from models.simulate import (SimOptions, init_state, metrics, prior_from_predictions,
                             run_blocks, simulate, simulate_until_done)
from models.workload import Workload, make_workload

__all__ = [
    "ParamSpec", "SystemSpec", "get_system", "list_systems", "register_system",
    "validate_params", "ServerConfig", "SimOptions", "init_state", "metrics",
    "prior_from_predictions", "run_blocks", "simulate", "simulate_until_done",
    "Workload", "make_workload",
]
