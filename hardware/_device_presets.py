"""Preset devices. Every number names its source; "assumption" marks our own choices.

Capacities: vendors' "GB" of device DRAM is binary (GiB). KunServe's Table 1 shares
(Qwen-2.5-14B params = 34.4% of one 80 GB GPU, 72B = 42.3% of four) only come out with
80 GiB, so every capacity below is N * 2**30 bytes.
"""

from __future__ import annotations

from hardware.devices import Device

__all__ = ["PRESETS"]

GiB = 2**30


def _sources(**by_field: str) -> tuple[tuple[str, str], ...]:
    return tuple(by_field.items())


_ODMA = "ODMA papers (shared/seeds/odma-framework.txt §4, odma-strategy.txt §4)"
_GIB = "; 'GB' read as GiB (see module docstring)"
_HBM_ALPHA = (
    "assumption: SPEC.md 'HBM is close to 1 for KV-sized accesses'; 0.9 leaves a "
    "small paging penalty"
)
_HBM_BURST = (
    "assumption: one HBM pseudo-channel DRAM page (1 KB, JEDEC JESD235/238); a "
    "contiguous page-sized chunk amortises one activate, taken as the half point"
)
_A100 = (
    "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf, "
    "via glennklockwood.com/garden/processors/A100)"
)
_H100 = (
    "NVIDIA H100 SXM5 datasheet (via glennklockwood.com/garden/processors/h100 and "
    "archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html)"
)
_H800 = (
    "H800 = H100 SXM5 die with NVLink cut to 400 GB/s and FP64 cut "
    "(philisun.com 'NVIDIA H800 vs H100'); low-precision compute and HBM3 unchanged"
)
_L40S = "NVIDIA L40S datasheet (via mullet.se product 355414, itcreations.com L40S)"

PRESETS = (
    Device(
        name="mlu370-x4",
        memory_bytes=24 * GiB,
        stream_bw=307.2e9,
        alpha=0.5,
        burst_bytes=1024.0,
        peak_flops=96e12,
        host_link_bw=32e9,
        network_bw=12.5e9,
        memory_kind="LPDDR5",
        sources=_sources(
            memory_bytes=f"{_ODMA}: 24 GB LPDDR5 per card{_GIB}",
            stream_bw=f"{_ODMA}: 307.2 GB/s per card (Cambricon product page)",
            alpha=f"{_ODMA} §2.2 citing Steiner et al. arXiv:2209.14756: "
            "B_rand/B_seq 0.3-0.7 on LPDDR4/5; midpoint 0.5 chosen",
            burst_bytes="assumption: one LPDDR5 bank row (1 KB; systemverilog.io "
            "'LPDDR5 Tutorial: physical structure'); a row-sized "
            "chunk amortises one activate, taken as the half point; "
            "ODMA: tens-hundreds of bytes still pay ~alpha",
            peak_flops="Cambricon MLU370-X4 product page (cambricon.com): FP16 "
            "96 TFLOPS; same figure as the MLU370-X8 launch note "
            "(guangxilong.com/c/032129635H022.html); X4 page itself "
            "not retrieved",
            host_link_bw="PCIe 4.0 x16 (MLU370 family, MLU370-X8 launch note): "
            "64 GB/s bidirectional -> 32 GB/s per direction",
            network_bw="assumption: one 100 Gb/s NIC per card; the ODMA "
            "experiments use a single node",
        ),
    ),
    Device(
        name="a100-80gb",
        memory_bytes=80 * GiB,
        stream_bw=2.039e12,
        alpha=0.9,
        burst_bytes=1024.0,
        peak_flops=312e12,
        host_link_bw=32e9,
        network_bw=25e9,
        memory_kind="HBM2e",
        sources=_sources(
            memory_bytes=f"{_A100}: 80 GB HBM2e{_GIB}",
            stream_bw=f"{_A100}: 2,039 GB/s (SXM4 80GB)",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM_BURST,
            peak_flops=f"{_A100}: BF16 Tensor 312 TFLOPS dense (624 sparse)",
            host_link_bw=f"{_A100}: PCIe Gen4 x16, 32+32 GB/s",
            network_bw="DGX A100: one 200 Gb/s HDR InfiniBand HCA per GPU; "
            "KunServe Table 2 cluster A: 200 Gbps RDMA",
        ),
    ),
    Device(
        name="h100-80gb",
        memory_bytes=80 * GiB,
        stream_bw=3.35e12,
        alpha=0.9,
        burst_bytes=1024.0,
        peak_flops=989.4e12,
        host_link_bw=64e9,
        network_bw=50e9,
        memory_kind="HBM3",
        sources=_sources(
            memory_bytes=f"{_H100}: 80 GB HBM3{_GIB}",
            stream_bw=f"{_H100}: 3,350 GB/s",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM_BURST,
            peak_flops=f"{_H100}: BF16 Tensor 989.4 TFLOPS dense (1,979 with sparsity)",
            host_link_bw=f"{_H100}: PCIe Gen5 x16 128 GB/s bidirectional "
            "-> 64 GB/s per direction",
            network_bw="DGX H100: one 400 Gb/s ConnectX-7 per GPU",
        ),
    ),
    Device(
        name="h800-80gb",
        memory_bytes=80 * GiB,
        stream_bw=3.35e12,
        alpha=0.9,
        burst_bytes=1024.0,
        peak_flops=989.4e12,
        host_link_bw=64e9,
        network_bw=50e9,
        memory_kind="HBM3",
        sources=_sources(
            memory_bytes=f"{_H800}; 80 GB HBM3 (KunServe Table 2){_GIB}",
            stream_bw=f"{_H800}; {_H100}: 3,350 GB/s",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM_BURST,
            peak_flops=f"{_H800}; {_H100}: BF16 989.4 TFLOPS dense",
            host_link_bw=f"{_H800}; PCIe Gen5 x16, 64 GB/s per direction",
            network_bw="KunServe (shared/seeds/kunserve.txt) Table 2 cluster B: "
            "400 Gbps RDMA scale-out, unidirectional, per GPU",
        ),
    ),
    Device(
        name="l40s-48gb",
        memory_bytes=48 * GiB,
        stream_bw=864e9,
        alpha=0.7,
        burst_bytes=2048.0,
        peak_flops=362.05e12,
        host_link_bw=32e9,
        network_bw=12.5e9,
        memory_kind="GDDR6",
        sources=_sources(
            memory_bytes=f"{_L40S}: 48 GB GDDR6 with ECC{_GIB} (ECC-on "
            "drivers expose slightly less)",
            stream_bw=f"{_L40S}: 864 GB/s",
            alpha="assumption: GDDR6 sits between LPDDR5 (0.3-0.7, ODMA §2.2) "
            "and HBM (~1, SPEC.md); top of the LPDDR range chosen",
            burst_bytes="assumption: one GDDR6 channel page (2 KB, JEDEC "
            "JESD250), taken as the half point",
            peak_flops=f"{_L40S}: BF16 Tensor 362.05 TFLOPS dense (733 with sparsity)",
            host_link_bw=f"{_L40S}: PCIe Gen4 x16 64 GB/s bidirectional "
            "-> 32 GB/s per direction",
            network_bw="assumption: one 100 Gb/s NIC per GPU (PCIe server)",
        ),
    ),
)
