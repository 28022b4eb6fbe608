"""Accelerator descriptions: memory size, bandwidths, random-access penalty, compute.

A :class:`Device` holds per-device numbers only; how many devices a model spans is a
:class:`hardware.deploy.Deployment`. Presets live in ``hardware/_device_presets.py``
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
    "Device",
    "get_device",
    "list_devices",
    "load_devices",
    "register_device",
]

NUMERIC_FIELDS = (
    "memory_bytes",
    "stream_bw",
    "alpha",
    "burst_bytes",
    "peak_flops",
    "host_link_bw",
    "network_bw",
)


@dataclass(frozen=True)
class Device:
    """One accelerator. All rates are per device and per direction.

    ``alpha`` is B_rand / B_seq for small scattered reads; ``burst_bytes`` is the
    contiguous chunk size at which half of that penalty is recovered (see
    :func:`hardware.roofline.effective_bandwidth`).
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

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(
                f"Device: field 'name' must be a non-empty string, got {self.name!r}"
            )
        owner = f"Device {self.name!r}"
        for field in NUMERIC_FIELDS:
            check_positive(owner, field, getattr(self, field))
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(
                f"{owner}: field 'alpha' must be in (0, 1], got {self.alpha!r}"
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
_REQUIRED = _FIELDS - {"sources"}


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
        v = values[field]
        if isinstance(v, int) and not isinstance(v, bool):
            values[field] = float(v)
    values.setdefault("sources", {f: where for f in NUMERIC_FIELDS})
    try:
        return Device(**values)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def load_devices(path, *, overwrite: bool = False) -> list[Device]:
    """Read devices from a ``.json`` or ``.toml`` file and register them.

    The file holds one device object, a list of them, or (TOML) an array of
    ``[[device]]`` tables; JSON may also use ``{"device": [...]}``. ``sources`` is
    optional (a table field -> source); without it every number is attributed to the
    file. Unknown or missing fields raise ValueError naming the file and the field.
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
    _DEVICES.register_all(devices, overwrite=overwrite)
    return devices


from hardware import _device_presets  # (registers the presets)

for _dev in _device_presets.PRESETS:
    register_device(_dev)
del _dev
