"""The GPU check's tools without a GPU: profile_sim's HLO and trace parsing,
gpu_summary's reading of times.txt, and their bad-argument errors."""

import subprocess
import sys

from experiments import gpu_summary, profile_sim

HLO = """HloModule m

%fused_computation.3 (p0: f32[4,100]) -> f32[4,100] {
  %p0 = f32[4,100]{1,0} parameter(0)
  %c = f32[] constant(1)
  %b = f32[4,100]{1,0} broadcast(f32[] %c), dimensions={}
  ROOT %add.1 = f32[4,100]{1,0} add(f32[4,100]{1,0} %p0, f32[4,100]{1,0} %b)
}

ENTRY %main (a: f32[4,100], i: s32[4,7]) -> f32[4,100] {
  %a = f32[4,100]{1,0} parameter(0)
  %fusion.3 = f32[4,100]{1,0} fusion(f32[4,100]{1,0} %a), kind=kLoop, calls=%fused_computation.3
  ROOT %sort.2 = f32[4,100]{1,0} sort(f32[4,100]{1,0} %fusion.3), dimensions={1}
}
"""


def test_hlo_ops_names_a_fusions_operations_and_shape():
    ops = profile_sim.hlo_ops(HLO)
    assert ops["fusion.3"].startswith("broadcast, add") or \
        ops["fusion.3"].startswith("add, broadcast")
    assert "f32[4,100]" in ops["fusion.3"]
    assert ops["sort.2"].startswith("sort")


def test_op_table_sums_gpu_kernels_by_name():
    ev = [{"ph": "M", "name": "process_name", "pid": 7,
           "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "host"}},
          {"ph": "X", "pid": 7, "name": "fusion.3", "dur": 3000},
          {"ph": "X", "pid": 7, "name": "fusion.3", "dur": 1000},
          {"ph": "X", "pid": 7, "name": "sort.2", "dur": 4000},
          {"ph": "X", "pid": 1, "name": "fusion.3", "dur": 99000}]  # host: not counted
    rows, total, lanes = profile_sim.op_table(ev, profile_sim.hlo_ops(HLO))
    assert lanes == "GPU kernels" and total == 8.0
    assert [(r["name"], r["ms"], r["calls"]) for r in rows] == \
        [("fusion.3", 4.0, 2), ("sort.2", 4.0, 1)]
    assert rows[1]["ops"].startswith("sort") and rows[0]["share"] == 0.5


def test_parse_times_reads_exit_and_seconds():
    text = ("bench_sim: exit 124 (timeout 200 s)\nbench_sim: 201 s\n"
            "profile_sim kunserve: 8 s\n"
            "main job (cold compilation cache): exit 124, 100.3 s whole process\n")
    assert gpu_summary.parse_times(text) == [
        {"part": "bench_sim", "exit": 124, "seconds": 201.0},
        {"part": "profile_sim kunserve", "exit": 0, "seconds": 8.0},
        {"part": "main job (cold compilation cache)", "exit": 124, "seconds": 100.3}]


def test_parse_times_keeps_skipped_parts():
    text = ("main job (GPU, cold compilation cache): exit 124, 150.2 s whole process\n"
            "main job (GPU, warm compilation cache): skipped (the cold run exited 124)\n")
    rows = gpu_summary.parse_times(text)
    assert rows[1] == {"part": "main job (GPU, warm compilation cache)", "exit": None,
                       "seconds": None, "skipped": "the cold run exited 124"}
    assert gpu_summary._row(rows[1]).startswith("| main job (GPU, warm compilation "
                                                "cache) | skipped: the cold run")
    assert gpu_summary._row(rows[0]) == ("| main job (GPU, cold compilation cache) | "
                                         "124 (time limit) | 150.2 |")


def test_bad_arguments_one_line_no_traceback(tmp_path):
    for mod, args in (("experiments.profile_sim", ["--system", "nope", "--out", str(tmp_path)]),
                      ("experiments.profile_sim", ["--configs", "0", "--out", str(tmp_path)]),
                      ("experiments.gpu_summary", ["--times", str(tmp_path / "x"),
                                                   "--env", str(tmp_path / "y"),
                                                   "--out", str(tmp_path)])):
        p = subprocess.run([sys.executable, "-m", mod, *args], capture_output=True,
                           text=True)
        assert p.returncode == 2, (mod, args, p.stderr)
        assert "Traceback" not in p.stderr and "error" in p.stderr
    assert list(tmp_path.iterdir()) == []
