"""Accelerator descriptions: memory size, bandwidths, random-access penalty, compute,
the tensor-parallel interconnect, and the measured efficiencies the roofline uses.

A :class:`Device` holds per-device numbers only; how many devices a model spans is a
:class:`hardware.placement.Deployment`. Presets live in ``hardware/_device_presets.py``
with a source for every number; ``load_devices`` reads more from JSON or TOML.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    tomllib = None

from hardware._registry import Registry, check_positive, check_sources

__all__ = [
    "NUMERIC_FIELDS",
    "OPTIONAL_DEFAULTS",
    "Device",
    "get_device",
    "list_devices",
    "load_devices",
    "register_device",
    "device_record",
    "register_record",
]

NUMERIC_FIELDS = (
    "memory_bytes",
    "stream_bw",
    "alpha",
    "burst_bytes",
    "peak_flops",
    "host_link_bw",
    "network_bw",
    "tp_link_bw",
    "tp_allreduce_latency_s",
    "mfu",
    "bw_eff",
    "driver_memory_bytes",
)
# Fields a device file may leave out; the value used instead (and cited as such).
# tp_link_bw None means "the host link": no dedicated GPU-to-GPU fabric.
OPTIONAL_DEFAULTS = {
    "tp_link_bw": None,
    "tp_allreduce_latency_s": 25e-6,
    "mfu": 0.5,
    "bw_eff": 0.8,
    "driver_memory_bytes": None,
}
_DEFAULT_SOURCES = {
    "tp_link_bw": "default: no GPU-to-GPU fabric given, the host link (host_link_bw)",
    "tp_allreduce_latency_s": "default assumption (25 us, between the measured 10 us "
    "of 2 NVLink A100s and 42 us of 8 PCIe GPUs; see _device_presets.py)",
    "mfu": "default assumption (0.5; kvtune's former global default)",
    "bw_eff": "default assumption (0.8; kvtune's former global default)",
    "driver_memory_bytes": "default: no driver figure given, memory_bytes (the "
    "driver reports somewhat less: 79.19 GiB for an '80 GB' H100)",
}


@dataclass(frozen=True)
class Device:
    """One accelerator. All rates are per device and per direction.

    ``alpha`` is B_rand / B_seq for small scattered reads; ``burst_bytes`` is the
    contiguous chunk size at which half of that penalty is recovered (see
    :func:`hardware.roofline.effective_bandwidth`). ``tp_link_bw`` and
    ``tp_allreduce_latency_s`` describe the fabric tensor-parallel all-reduces use
    (NVLink, MLU-Link or PCIe); ``mfu`` and ``bw_eff`` are measured achievable shares
    of ``peak_flops`` and ``stream_bw``. ``driver_memory_bytes`` is the total memory
    as the driver reports it (``torch.cuda.mem_get_info()[1]``, what vLLM prints as
    ``total_gpu_memory``), the base of vLLM's ``gpu_memory_utilization`` budget. The
    last five have defaults (see :data:`OPTIONAL_DEFAULTS`) so older device files
    still load.
    """

    name: str
    memory_bytes: float  # device memory, bytes
    stream_bw: float  # sequential (streaming) peak bandwidth, bytes/s
    alpha: float  # random/sequential bandwidth ratio for tiny chunks, in (0, 1]
    burst_bytes: float  # chunk size recovering half the random-access penalty, bytes
    peak_flops: float  # dense fp16/bf16 peak, FLOP/s
    host_link_bw: float  # host (PCIe) link, bytes/s per direction
    network_bw: float  # inter-node network, bytes/s per device per direction
    memory_kind: str  # "LPDDR5", "HBM3", ...
    sources: tuple[tuple[str, str], ...] = ()  # (field, where the number came from)
    tp_link_bw: float | None = None  # TP fabric, bytes/s per direction (None: host)
    tp_allreduce_latency_s: float = OPTIONAL_DEFAULTS["tp_allreduce_latency_s"]
    mfu: float = OPTIONAL_DEFAULTS["mfu"]  # achievable share of peak_flops
    bw_eff: float = OPTIONAL_DEFAULTS["bw_eff"]  # achievable share of stream_bw
    driver_memory_bytes: float | None = None  # driver-reported total (None: memory)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(
                f"Device: field 'name' must be a non-empty string, got {self.name!r}"
            )
        owner = f"Device {self.name!r}"
        if self.tp_link_bw is None:
            object.__setattr__(self, "tp_link_bw", self.host_link_bw)
        if self.driver_memory_bytes is None:
            object.__setattr__(self, "driver_memory_bytes", self.memory_bytes)
        for field in NUMERIC_FIELDS:
            check_positive(owner, field, getattr(self, field))
        for field in ("alpha", "mfu", "bw_eff"):
            v = getattr(self, field)
            if not 0.0 < v <= 1.0:
                raise ValueError(
                    f"{owner}: field {field!r} must be in (0, 1], got {v!r}"
                )
        drv, mem = self.driver_memory_bytes, self.memory_bytes
        if isinstance(drv, (int, float)) and isinstance(mem, (int, float)) \
                and drv > mem:
            raise ValueError(
                f"{owner}: field 'driver_memory_bytes' ({drv!r}) exceeds "
                f"memory_bytes ({mem!r})"
            )
        if not isinstance(self.memory_kind, str) or not self.memory_kind:
            raise ValueError(
                f"{owner}: field 'memory_kind' must be a non-empty "
                f"string, got {self.memory_kind!r}"
            )
        object.__setattr__(self, "sources", check_sources(owner, self.sources))

    def source(self, field: str) -> str | None:
        """Where ``field`` came from, or None if no source is recorded."""
        return dict(self.sources).get(field)


_DEVICES: Registry[Device] = Registry("device")


def register_device(device: Device, *, overwrite: bool = False) -> Device:
    """Add ``device`` to the registry (names are case-insensitive)."""
    if not isinstance(device, Device):
        raise TypeError(f"register_device expects a Device, got {device!r}")
    return _DEVICES.register(device, overwrite=overwrite)


def get_device(name: str) -> Device:
    """The registered device called ``name``; ValueError lists the known names."""
    return _DEVICES.get(name)


def list_devices() -> list[str]:
    """Registered device names, sorted."""
    return _DEVICES.names()


_FIELDS = {f.name for f in dataclasses.fields(Device)}
_REQUIRED = _FIELDS - {"sources"} - set(OPTIONAL_DEFAULTS)


def _device_from_record(record, where: str) -> Device:
    if not isinstance(record, dict):  # bad file content: ValueError, as everywhere
        raise ValueError(  # noqa: TRY004
            f"{where}: expected a table/object of device fields, "
            f"got {type(record).__name__}"
        )
    unknown = sorted(set(record) - _FIELDS)
    if unknown:
        raise ValueError(
            f"{where}: unknown field {unknown[0]!r} "
            f"(allowed: {', '.join(sorted(_FIELDS))})"
        )
    missing = sorted(_REQUIRED - set(record))
    if missing:
        raise ValueError(f"{where}: missing field {missing[0]!r}")
    values = dict(record)
    for field in NUMERIC_FIELDS:  # store ints as floats; Device rejects the rest
        v = values.get(field)
        if isinstance(v, int) and not isinstance(v, bool):
            values[field] = float(v)
    given = {f: where for f in NUMERIC_FIELDS if f in record}
    values["sources"] = {
        **{f: _DEFAULT_SOURCES[f] for f in OPTIONAL_DEFAULTS if f not in record},
        **given,
        **dict(check_sources(where, values.get("sources", {}))),
    }
    try:
        return Device(**values)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def device_record(device: Device) -> dict:
    """``device`` as a device file holds it (one object: every field, its sources), so
    that a file written elsewhere (a calibrated profile) can carry it."""
    out = {f.name: getattr(device, f.name) for f in dataclasses.fields(Device)
           if f.name != "sources"}
    out["sources"] = dict(device.sources)
    return out


def register_record(record, where: str) -> Device:
    """Register the device ``record`` describes (a device file's object; ``where``
    names it in errors). A device of that name already registered with the same
    numbers is kept; one with other numbers is a ValueError naming ``where``."""
    dev = _device_from_record(record, where)
    if dev.name.lower() not in {n.lower() for n in _DEVICES.names()}:
        return register_device(dev)
    old = get_device(dev.name)
    differ = [f for f in (*NUMERIC_FIELDS, "memory_kind")
              if getattr(old, f) != getattr(dev, f)]
    if differ:
        raise ValueError(f"{where}: device {dev.name!r} is already known with another "
                         f"{differ[0]!r} ({getattr(old, differ[0])!r}, here "
                         f"{getattr(dev, differ[0])!r})")
    return old


def load_devices(path, *, overwrite: bool = False) -> list[Device]:
    """Read devices from a ``.json`` or ``.toml`` file and register them.

    The file holds one device object, a list of them, or (TOML) an array of
    ``[[device]]`` tables; JSON may also use ``{"device": [...]}``. ``sources`` is
    optional (a table field -> source); without it every number is attributed to the
    file. ``tp_link_bw``, ``tp_allreduce_latency_s``, ``mfu`` and ``bw_eff`` may be
    left out (:data:`OPTIONAL_DEFAULTS`; their sources then say so). Unknown or
    missing fields raise ValueError naming the file and the field.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"{path}: cannot read device file ({err})") from None
    suffix = path.suffix.lower()
    if suffix == ".json":
        parse = json.loads
    elif suffix == ".toml" and tomllib is not None:
        parse = tomllib.loads
    elif suffix == ".toml":  # pragma: no cover - Python 3.10
        raise ValueError(f"{path}: reading TOML needs Python >= 3.11")
    else:
        raise ValueError(f"{path}: device files must end in .json or .toml")
    try:
        data = parse(text)
    except ValueError as err:  # JSONDecodeError, TOMLDecodeError
        raise ValueError(f"{path}: not valid {suffix[1:].upper()} ({err})") from None
    if isinstance(data, dict) and set(data) == {"device"}:
        data = data["device"]
    records = data if isinstance(data, list) else [data]
    if not records:
        raise ValueError(f"{path}: no devices found")
    devices = [
        _device_from_record(rec, f"{path} device[{i}]") for i, rec in enumerate(records)
    ]
    try:
        _DEVICES.register_all(devices, overwrite=overwrite)
    except ValueError as err:  # a name clash: say which file brought it
        raise ValueError(f"{path}: {err}") from None
    return devices
