"""Hardware and model facts, deployments, and the roofline step-time model.

Every preset number carries its source (``Device.sources`` / ``LLMSpec.sources``),
including the measured efficiencies and tensor-parallel fabric the roofline uses.
"""

from hardware import _device_presets, _model_presets  # noqa: F401  (register the presets)
from hardware.deploy import (
    Deployment,
    InfeasibleError,
    activation_reserve_bytes,
    make_deployment,
)
from hardware.devices import (
    Device,
    get_device,
    list_devices,
    load_devices,
    register_device,
)
from hardware.llm import LLMSpec, get_model, list_models, register_model
from hardware.memory_profile import (
    MemoryProfile,
    VllmRefusal,
    deployment_from_profile,
    vllm_memory_profile,
)
from hardware.roofline import (
    RooflineParams,
    Work,
    effective_bandwidth,
    iteration_time,
    roofline_params,
    tp_allreduce_time,
    work_time,
)

__all__ = [
    "Deployment",
    "Device",
    "InfeasibleError",
    "LLMSpec",
    "MemoryProfile",
    "RooflineParams",
    "VllmRefusal",
    "Work",
    "activation_reserve_bytes",
    "deployment_from_profile",
    "effective_bandwidth",
    "get_device",
    "get_model",
    "iteration_time",
    "list_devices",
    "list_models",
    "load_devices",
    "make_deployment",
    "register_device",
    "register_model",
    "roofline_params",
    "tp_allreduce_time",
    "vllm_memory_profile",
    "work_time",
]
