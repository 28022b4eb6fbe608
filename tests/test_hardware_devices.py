"""Device presets, validation, the registry, and device files (JSON / TOML)."""

import dataclasses
import json
import math

import pytest

import hardware as hw
from hardware import devices as devices_mod

GiB = 2**30


def test_every_device_number_has_a_source():
    for name in hw.list_devices():
        dev = hw.get_device(name)
        if name.startswith("test-"):
            continue
        for field in devices_mod.NUMERIC_FIELDS:
            assert dev.source(field), f"{name}.{field} has no source"


def test_new_fields_are_sourced_and_measured_where_claimed():
    new = ("tp_link_bw", "tp_allreduce_latency_s", "mfu", "bw_eff")
    assert set(new) <= set(devices_mod.NUMERIC_FIELDS)
    for name in ("a100-80gb", "h100-80gb", "h800-80gb", "l40s-48gb", "mlu370-x4"):
        dev = hw.get_device(name)
        for field in new:
            assert dev.source(field), f"{name}.{field} has no source"
    for name in ("a100-80gb", "h100-80gb"):  # published measurements, with URLs
        dev = hw.get_device(name)
        for field in ("tp_allreduce_latency_s", "mfu", "bw_eff"):
            assert "measured" in dev.source(field) and "github.com" in dev.source(field)
    for name in ("l40s-48gb", "mlu370-x4"):  # no measurement found: said so
        dev = hw.get_device(name)
        for field in ("tp_allreduce_latency_s", "mfu", "bw_eff"):
            assert "assumption" in dev.source(field)
    # NVLink per direction: half the datasheets' bidirectional figures
    links = {n: hw.get_device(n).tp_link_bw for n in ("a100-80gb", "h100-80gb")}
    assert links == {"a100-80gb": 300e9, "h100-80gb": 450e9}
    assert hw.get_device("h800-80gb").tp_link_bw == 200e9
    mlu = hw.get_device("mlu370-x4")
    assert mlu.tp_link_bw == mlu.host_link_bw  # PCIe: no MLU-Link on the X4


def test_device_validation():
    base = hw.get_device("a100-80gb")
    for field, bad in (
        ("alpha", 0.0),
        ("alpha", 1.5),
        ("memory_bytes", -1.0),
        ("stream_bw", "fast"),
        ("burst_bytes", math.nan),
        ("mfu", 0.0),
        ("bw_eff", 1.2),
        ("tp_link_bw", -1.0),
        ("tp_allreduce_latency_s", math.inf),
    ):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(base, **{field: bad})


def test_register_conflict_needs_overwrite():
    dev = dataclasses.replace(hw.get_device("a100-80gb"), name="test-dup")
    hw.register_device(dev)
    hw.register_device(dev)  # identical: fine
    other = dataclasses.replace(dev, alpha=0.5)
    with pytest.raises(ValueError, match="already registered"):
        hw.register_device(other)
    assert hw.register_device(other, overwrite=True) is hw.get_device("test-dup")


_FILE_DEV = {
    "name": "test-json-dev",
    "memory_bytes": 16 * GiB,
    "stream_bw": 1e11,
    "alpha": 0.4,
    "burst_bytes": 512,
    "peak_flops": 5e13,
    "host_link_bw": 1.6e10,
    "network_bw": 1.25e10,
    "memory_kind": "LPDDR4X",
}


def test_load_devices_json(tmp_path):
    path = tmp_path / "devs.json"
    second = dict(_FILE_DEV, name="test-json-dev2", sources={"alpha": "my bench"})
    path.write_text(json.dumps([_FILE_DEV, second]))
    devs = hw.load_devices(path, overwrite=True)
    assert [d.name for d in devs] == ["test-json-dev", "test-json-dev2"]
    assert hw.get_device("test-json-dev").burst_bytes == 512.0
    assert hw.get_device("test-json-dev2").source("alpha") == "my bench"
    assert str(path) in hw.get_device("test-json-dev").source("stream_bw")


def test_load_devices_optional_fields(tmp_path):
    """Files written before the TP/efficiency fields still load; defaults are cited."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps(dict(_FILE_DEV, name="test-old-dev")))
    (dev,) = hw.load_devices(path, overwrite=True)
    assert dev.tp_link_bw == dev.host_link_bw  # no fabric given: PCIe
    for field, want in devices_mod.OPTIONAL_DEFAULTS.items():
        if want is not None:
            assert getattr(dev, field) == want
        assert "default" in dev.source(field)
    assert str(path) in dev.source("stream_bw")
    full = dict(
        _FILE_DEV,
        name="test-new-dev",
        tp_link_bw=100e9,
        tp_allreduce_latency_s=5e-6,
        mfu=0.7,
        bw_eff=0.9,
        sources={"mfu": "my GEMM sweep"},
    )
    path.write_text(json.dumps(full))
    (dev,) = hw.load_devices(path, overwrite=True)
    assert (dev.tp_link_bw, dev.tp_allreduce_latency_s, dev.mfu, dev.bw_eff) == (
        100e9,
        5e-6,
        0.7,
        0.9,
    )
    assert dev.source("mfu") == "my GEMM sweep"
    assert str(path) in dev.source("bw_eff")
    p = hw.roofline_params(hw.make_deployment(dev, "llama-2-7b", tp=1))
    assert (p.mfu, p.bw_eff) == (0.7, 0.9)


def test_load_devices_toml(tmp_path):
    path = tmp_path / "devs.toml"
    path.write_text(
        '[[device]]\nname = "test-toml-dev"\nmemory_bytes = 25769803776\n'
        "stream_bw = 2e11\nalpha = 0.6\nburst_bytes = 1024\npeak_flops = 1e14\n"
        'host_link_bw = 3.2e10\nnetwork_bw = 1.25e10\nmemory_kind = "LPDDR5"\n'
        '[device.sources]\nalpha = "lab measurement"\n'
    )
    (dev,) = hw.load_devices(path, overwrite=True)
    assert dev == hw.get_device("test-toml-dev")
    assert dev.memory_bytes == 24 * GiB and dev.source("alpha") == "lab measurement"
    single = tmp_path / "one.toml"
    single.write_text(
        path.read_text()
        .replace("[[device]]\n", "")
        .replace("[device.sources]", "[sources]")
        .replace("test-toml-dev", "test-toml-one")
    )
    assert hw.load_devices(single, overwrite=True)[0].name == "test-toml-one"


@pytest.mark.parametrize(
    "change, field",
    [
        ({"colour": "red"}, "colour"),
        ({"stream_bw": None}, "stream_bw"),
        ({"alpha": 0.0}, "alpha"),
        ({"peak_flops": "96T"}, "peak_flops"),
        ({"mfu": 1.5}, "mfu"),
    ],
)
def test_load_devices_bad_fields_name_file_and_field(tmp_path, change, field):
    rec = {k: v for k, v in {**_FILE_DEV, **change}.items() if v is not None}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError) as err:
        hw.load_devices(path)
    assert str(path) in str(err.value) and repr(field) in str(err.value)


def test_load_devices_bad_files(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="json or .toml"):
        hw.load_devices(bad)
    broken = tmp_path / "b.toml"
    broken.write_text("name = ")
    with pytest.raises(ValueError, match="not valid TOML"):
        hw.load_devices(broken)


def test_load_devices_is_all_or_nothing(tmp_path):
    clash = dict(_FILE_DEV, name="a100-80gb")  # conflicts with the preset
    path = tmp_path / "clash.json"
    path.write_text(json.dumps({"device": [dict(_FILE_DEV, name="test-new"), clash]}))
    with pytest.raises(ValueError, match="already registered"):
        hw.load_devices(path)
    assert "test-new" not in hw.list_devices()
    assert hw.get_device("a100-80gb").stream_bw == 2.039e12


def test_hardware_flag_takes_a_device_file(tmp_path):
    """``--hardware FILE`` (a device file, not a profile) registers and uses its device;
    a file of two devices, or one that clashes with a preset, is one clear error."""
    import subprocess
    import sys

    from tuner.scenario import ScenarioSpec, build_scenario

    path = tmp_path / "mine.json"
    path.write_text(json.dumps(dict(_FILE_DEV, name="test-flag-dev")))
    sc = build_scenario(ScenarioSpec(model="qwen-2.5-0.5b", hardware=str(path),
                                     n_requests=20))
    assert sc.deployment.device.name == "test-flag-dev"
    assert sc.deployment.device.memory_bytes == _FILE_DEV["memory_bytes"]
    cmd = [sys.executable, "-m", "tuner.memory", "--model", "qwen-2.5-0.5b", "--json",
           "--hardware"]
    r = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["device"] == "test-flag-dev"
    two = tmp_path / "two.json"
    two.write_text(json.dumps([dict(_FILE_DEV, name="t-a"), dict(_FILE_DEV, name="t-b")]))
    clash = tmp_path / "clash.json"
    clash.write_text(json.dumps(dict(_FILE_DEV, name="h100-80gb")))
    for f, msg in ((two, "holds one device, found 2"), (clash, "already registered")):
        r = subprocess.run([*cmd, str(f)], capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr and str(f) in r.stderr
        assert "Traceback" not in r.stderr
