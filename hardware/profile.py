"""Device profiles: a device preset plus roofline efficiencies measured on a real server.

``python -m tuner.calibrate --out profile.json`` writes one (format
:data:`PROFILE_FORMAT`); every command that takes ``--hardware`` accepts its path in
place of a preset name. It is a hardware input: the device it names is a preset, or
one read from a device file whose fields the profile carries (``device_record``, as
the file held them; loading the profile registers it, so the profile works without
the file), and its ``params`` are fields of :class:`hardware.RooflineParams` that
replace the device's values (:data:`PROFILE_FIELDS`, the ones calibration fits).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from hardware.devices import get_device, register_record
from hardware.roofline import RooflineParams

__all__ = ["PROFILE_FIELDS", "PROFILE_FORMAT", "load_profile", "profile_values"]

PROFILE_FORMAT = "kvtune.device-profile/1"

# the RooflineParams fields a profile may set (tuner.calibration fits exactly these)
PROFILE_FIELDS = ("mfu", "bw_eff", "step_overhead_s", "token_overhead_s", "tp_comm_eff",
                  "request_overhead_s")
assert set(PROFILE_FIELDS) <= set(RooflineParams._fields)


def profile_values(profile: dict) -> dict:
    """The roofline fields of a device profile, as floats."""
    return {k: float(v) for k, v in profile["params"].items()}


def load_profile(path) -> dict:
    """A device profile file; ValueError naming the file and field on anything else."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: not a readable device profile ({e})") from None
    if not isinstance(d, dict) or d.get("format") != PROFILE_FORMAT:
        raise ValueError(f"{p}: field 'format': want {PROFILE_FORMAT!r}, got "
                         f"{d.get('format') if isinstance(d, dict) else type(d).__name__!r}")
    for key in ("device", "params"):
        if key not in d:
            raise ValueError(f"{p}: field {key!r} is missing")
    if "device_record" in d:  # a device from a device file: the profile carries it
        register_record(d["device_record"], f"{p} field 'device_record'")
        if d["device_record"].get("name") != d["device"]:
            raise ValueError(f"{p}: field 'device_record': name "
                             f"{d['device_record'].get('name')!r}, not the profile's "
                             f"device {d['device']!r}")
    get_device(d["device"])  # unknown device: the registry's error
    params = d["params"]
    if not isinstance(params, dict):
        raise ValueError(f"{p}: field 'params' must be an object")
    for k, v in params.items():
        if k not in PROFILE_FIELDS:
            raise ValueError(f"{p}: field 'params.{k}': unknown (known: "
                             f"{', '.join(PROFILE_FIELDS)})")
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{p}: field 'params.{k}': want a finite number >= 0, "
                             f"got {v!r}")
    return d
