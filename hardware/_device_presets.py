"""Preset devices. Every number names its source; "assumption" marks our own choices.

Capacities: vendors' "GB" of device DRAM is binary (GiB). KunServe's Table 1 shares
(Qwen-2.5-14B params = 34.4% of one 80 GB GPU, 72B = 42.3% of four) only come out with
80 GiB, so every capacity below is N * 2**30 bytes.
"""

from __future__ import annotations

from hardware.devices import Device, register_device

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
    "derived, same rule as LPDDR5 (one row activation per random chunk): one HBM "
    "pseudo-channel access (32 B: 64-bit x BL4 on HBM2e, JESD235; 32-bit x BL8 on "
    "HBM3, JESD238) / alpha; alpha itself is an assumption"
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
# The figures below are the vendors' published specifications as listed in these
# documents (their numbers were not re-fetched for this entry).
_RTX3090 = "NVIDIA GeForce RTX 3090 specifications (nvidia.com, GeForce RTX 30 series)"
_GA102 = "NVIDIA Ampere GA102 GPU Architecture whitepaper (V2.1), Table 9"
_T4 = "NVIDIA T4 Tensor Core GPU datasheet (nvidia.com, T4 data sheet)"
_A6000 = "NVIDIA RTX A6000 datasheet (nvidia.com, 'NVIDIA RTX A6000' data sheet)"

# --- Total memory as the driver reports it (vLLM's total_gpu_memory) -------------
# torch.cuda.mem_get_info()[1]; vLLM prints it as "total_gpu_memory (X GiB)" (V0
# worker.py) or "total_memory=X GiB" (V1 gpu_worker.py). It is what
# gpu_memory_utilization multiplies, a little below the marketed capacity.
_CSV = (
    "../shared/reference/vllm-memory-profiles.csv record {rec} ({src}): "
    "vLLM log '{quote}'"
)
_DRIVER_H100 = _CSV.format(
    rec="19-32", src="llm-d-incubation/llm-d-planner commit d3121e0, vLLM v0.19.0 "
    "logs, H100-80GB", quote="total_memory=79.19GiB"
) + (
    "; also github.com/llm-d-incubation/llm-d-planner accuracy/results/v0.19.0/"
    "accuracy_report.md: 'H100-80GB (catalog 80 GiB, physical 79.19 GiB)'"
)
_DRIVER_A100_80 = (
    "a public vLLM 0.8.2 start-up log on 'NVIDIA A100-SXM4-80GB' (Unsloth GRPO "
    "tutorial, Phi-4): 'the current vLLM instance can use total_gpu_memory (79.15GiB) "
    "x gpu_memory_utilization (0.70)' and Unsloth's 'Max memory: 79.151 GB'; "
    "repository of that copy not resolved (public code index text id 6934259882)"
)

# --- Measured efficiencies (achieved / datasheet peak) -------------------------
# Dense BF16 GEMM: "Maximum Achievable Matmul FLOPS" (MAMF, best shape of a
# brute-force search, mean of 100 runs), github.com/stas00/ml-engineering
# compute/accelerator/README.md, table "Maximum Achievable Matmul FLOPS comparison
# table", BF16 (commit b9e29720). A ceiling: a serving step's GEMMs with a few
# hundred tokens reach less (Azure's ND A100 v4 cuBLASLt FP16: 119.4 TFLOPS at
# 1024^3 vs 256.5 at 16384^3).
_MAMF = (
    "measured: MAMF BF16 {got} of {peak} TFLOPS = {pct} (torch {torch}; "
    "github.com/stas00/ml-engineering compute/accelerator/README.md, 'Maximum "
    "Achievable Matmul FLOPS comparison table')"
)
# HBM: BabelStream kernels as run by Microsoft's AI-benchmarking-guide
# (github.com/Azure/AI-benchmarking-guide, Azure_Results/ND_*_results.md, table
# "HBM Bandwidth"); Triad (2 reads + 1 write), STREAM's figure of merit, is used.
_AZURE = (
    "measured: BabelStream Triad {got} TB/s of {peak} TB/s = {pct} on {gpu} "
    "(Copy {copy}, Dot {dot} TB/s; {where}, table 'HBM Bandwidth')"
)
_AZURE_A100 = (
    "github.com/Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md"
)
_AZURE_H100 = (
    "Azure AI-benchmarking-guide ND H100 v5 results, as copied in github.com/"
    "samuel-bohman/AI-benchmarking-guide Azure_Results/ND_H100_v5_results.md"
)

# --- Tensor-parallel fabric --------------------------------------------------
_NCCL_A100 = (
    "measured: nccl-tests all_reduce_perf on 2 NVLink A100-SXM4-40GB (NVLink3 + "
    "NVSwitch, as the 80GB SXM4), 32-byte all-reduce 10.14 us out-of-place "
    "(github.com/NVIDIA/nccl/issues/583)"
)
_NCCL_H100 = (
    "measured: 2 H100 80GB HBM3 on an HGX board, NCCL 2.20.5, NVLSTree, CUDA "
    "graphs, 128 B - 64 KiB all-reduces: 'with 2 GPUs the latency is approximately "
    "6us' (github.com/NVIDIA/nccl/issues/1259)"
)
_PCIE_LATENCY = (
    "assumption: no small-message all-reduce measurement for this card's PCIe "
    "fabric found; NCCL over PCIe measures 42.1 us for an 8-byte all-reduce on 8 "
    "RTX 4090s (github.com/NVIDIA/nccl/issues/1530) and 8.3 us (TP2 "
    "reduce-scatter) / 13.6 us (TP4 all-gather) for one 4096-wide row "
    "(github.com/flashinfer-ai/flashinfer/pull/5023); 25 us taken for 2-4 ranks"
)

# --- LPDDR5 random access ----------------------------------------------------
# Steiner et al., "Unveiling the Real Performance of LPDDR5 Memories", MEMSYS 2022,
# arXiv:2209.14756 (DRAMSys simulations of LPDDR5-6400): random traffic of single
# bursts is capped near 66% of peak by command-bus occupancy even in favourable
# modes, sequential traffic reaches close to peak (as the ODMA papers quote it,
# odma-framework.txt §2.2; the paper body itself was not retrieved here, only its
# abstract). That is the only LPDDR5 random/sequential measurement
# found; it is for one-burst (64 B: BL32 x 16-bit channel, JESD209-5) accesses.
# No published LPDDR5 figure for random reads of KV-block size (4-32 KiB) was
# found. A random chunk pays its row activation once, so a chunk of c bytes gets
# c / (c + c0) of streaming with c0 = 64 (1 - a) / a; burst_bytes = 64 / a makes
# effective_bandwidth's penalty (1 - a) b / (c + b) equal c0 / (c + c0) for chunks
# of several bursts, while keeping the measured a as the small-access ratio.
LPDDR5_ACCESS_BYTES = 64.0
LPDDR5_RANDOM_RATIO = 0.66
# The same rule for the other memories, whose alpha is still an assumption: the
# smallest DRAM access (JEDEC burst x channel width) over alpha. (These replaced
# one-page half points, 1 KB HBM / 2 KB GDDR6, which gave HBM a larger penalty
# than measured LPDDR5 for chunks over ~300 B.)
HBM_ACCESS_BYTES = 32.0
GDDR6_ACCESS_BYTES = 32.0
PRESETS = (
    Device(
        name="mlu370-x4",
        memory_bytes=24 * GiB,
        stream_bw=307.2e9,
        alpha=LPDDR5_RANDOM_RATIO,
        burst_bytes=LPDDR5_ACCESS_BYTES / LPDDR5_RANDOM_RATIO,
        peak_flops=96e12,
        host_link_bw=32e9,
        network_bw=12.5e9,
        memory_kind="LPDDR5",
        tp_link_bw=32e9,
        tp_allreduce_latency_s=25e-6,
        mfu=0.5,
        bw_eff=0.8,
        sources=_sources(
            driver_memory_bytes="default: no driver-reported total published for the "
            "MLU370-X4; memory_bytes",
            memory_bytes=f"{_ODMA}: 24 GB LPDDR5 per card{_GIB}",
            stream_bw=f"{_ODMA}: 307.2 GB/s per card (Cambricon product page)",
            alpha="measured (simulated): Steiner et al. arXiv:2209.14756 (MEMSYS "
            "2022), LPDDR5 random single-burst (64 B) traffic capped near 66% of "
            "peak, sequential near peak, as quoted by ODMA §2.2 (B_rand/B_seq "
            "0.3-0.7 for LPDDR4/5). AMD WP570 measures ~80% for 64-byte LPDDR5 "
            "random reads on Versal controllers; 0.66 is the conservative one",
            burst_bytes="derived: 64 B / alpha = 97 B. Each random chunk pays one "
            "row activation; calibrated on the measured 64-byte point this gives "
            "c/(c + 64(1-alpha)/alpha) of streaming, which effective_bandwidth "
            "matches for chunks of a few bursts and more. No published LPDDR5 "
            "measurement at KV-block size (4-32 KiB) was found; a 16-token block "
            "of DeepSeek-R1-Distill-Qwen-7B at tp=4 (8 KiB per layer per card) "
            "gets 0.996 of streaming",
            peak_flops="Cambricon MLU370-X4 product page (cambricon.com): FP16 "
            "96 TFLOPS; same figure as the MLU370-X8 launch note "
            "(guangxilong.com/c/032129635H022.html); X4 page itself "
            "not retrieved",
            host_link_bw="PCIe 4.0 x16 (MLU370 family, MLU370-X8 launch note): "
            "64 GB/s bidirectional -> 32 GB/s per direction",
            network_bw="assumption: one 100 Gb/s NIC per card; the ODMA "
            "experiments use a single node",
            tp_link_bw="PCIe 4.0 x16, 32 GB/s per direction: MLU-Link (200 GB/s "
            "per card) is announced for the MLU370-X8 with a 4-card bridge "
            "(guangxilong.com/c/032129635H022.html, rencaizhenjiang.com "
            "20220324/124384); no MLU-Link is documented for the X4",
            tp_allreduce_latency_s=_PCIE_LATENCY,
            mfu="assumption: no published MLU370 GEMM measurement found; kvtune's "
            "former global default 0.5",
            bw_eff="assumption: no published MLU370 bandwidth measurement found; "
            "kvtune's former global default 0.8 (inside the 60-85% model-"
            "bandwidth-utilisation band quoted for vLLM/TensorRT-LLM decode)",
        ),
    ),
    Device(
        name="a100-80gb",
        memory_bytes=80 * GiB,
        stream_bw=2.039e12,
        alpha=0.9,
        burst_bytes=HBM_ACCESS_BYTES / 0.9,
        peak_flops=312e12,
        host_link_bw=32e9,
        network_bw=25e9,
        memory_kind="HBM2e",
        tp_link_bw=300e9,
        tp_allreduce_latency_s=10.14e-6,
        mfu=271.2 / 312.0,
        bw_eff=1.70 / 2.039,
        driver_memory_bytes=79.15 * GiB,
        sources=_sources(
            driver_memory_bytes=_DRIVER_A100_80,
            memory_bytes=f"{_A100}: 80 GB HBM2e{_GIB}",
            stream_bw=f"{_A100}: 2,039 GB/s (SXM4 80GB)",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM_BURST,
            peak_flops=f"{_A100}: BF16 Tensor 312 TFLOPS dense (624 sparse)",
            host_link_bw=f"{_A100}: PCIe Gen4 x16, 32+32 GB/s",
            network_bw="DGX A100: one 200 Gb/s HDR InfiniBand HCA per GPU; "
            "KunServe Table 2 cluster A: 200 Gbps RDMA",
            tp_link_bw=f"{_A100}: third-generation NVLink 600 GB/s (bidirectional) "
            "-> 300 GB/s per direction",
            tp_allreduce_latency_s=_NCCL_A100,
            mfu=_MAMF.format(
                got=271.2, peak=312, pct="86.9%", torch="2.6.0+cu126 (A100 SXM)"
            ),
            bw_eff=_AZURE.format(
                got=1.70,
                peak=2.039,
                pct="83.4%",
                gpu="A100-SXM4-80GB",
                copy=1.61,
                dot=1.75,
                where=_AZURE_A100,
            )
            + "; 1.72 TB/s Triad on Tursa's A100-SXM4-80GB (github.com/ukri-bench/"
            "benchmark-BabelStream README)",
        ),
    ),
    Device(
        name="h100-80gb",
        memory_bytes=80 * GiB,
        stream_bw=3.35e12,
        alpha=0.9,
        burst_bytes=HBM_ACCESS_BYTES / 0.9,
        peak_flops=989.4e12,
        host_link_bw=64e9,
        network_bw=50e9,
        memory_kind="HBM3",
        tp_link_bw=450e9,
        tp_allreduce_latency_s=6e-6,
        mfu=794.5 / 989.4,
        bw_eff=2.97 / 3.35,
        driver_memory_bytes=79.19 * GiB,
        sources=_sources(
            driver_memory_bytes=_DRIVER_H100,
            memory_bytes=f"{_H100}: 80 GB HBM3{_GIB}",
            stream_bw=f"{_H100}: 3,350 GB/s",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM_BURST,
            peak_flops=f"{_H100}: BF16 Tensor 989.4 TFLOPS dense (1,979 with sparsity)",
            host_link_bw=f"{_H100}: PCIe Gen5 x16 128 GB/s bidirectional "
            "-> 64 GB/s per direction",
            network_bw="DGX H100: one 400 Gb/s ConnectX-7 per GPU",
            tp_link_bw=f"{_H100}: NVLink 900 GB/s (bidirectional) -> 450 GB/s per "
            "direction (~380 GB/s achieved p2p, github.com/NVIDIA/nccl/issues/1264)",
            tp_allreduce_latency_s=_NCCL_H100,
            mfu=_MAMF.format(
                got=794.5, peak=989, pct="80.3%", torch="2.7.0+cu126 (H100 SXM)"
            ),
            bw_eff=_AZURE.format(
                got=2.97,
                peak=3.35,
                pct="88.7%",
                gpu="H100 80GB HBM3",
                copy=2.90,
                dot=3.18,
                where=_AZURE_H100,
            ),
        ),
    ),
    Device(
        name="h800-80gb",
        memory_bytes=80 * GiB,
        stream_bw=3.35e12,
        alpha=0.9,
        burst_bytes=HBM_ACCESS_BYTES / 0.9,
        peak_flops=989.4e12,
        host_link_bw=64e9,
        network_bw=50e9,
        memory_kind="HBM3",
        tp_link_bw=200e9,
        tp_allreduce_latency_s=6e-6,
        mfu=794.5 / 989.4,
        bw_eff=2.97 / 3.35,
        sources=_sources(
            driver_memory_bytes="default: no driver-reported total found for the "
            "H800; memory_bytes (the H100 SXM5 with the same 80 GB HBM3 reports 79.19 "
            "GiB, so vLLM budgets here are ~1% high)",
            memory_bytes=f"{_H800}; 80 GB HBM3 (KunServe Table 2){_GIB}",
            stream_bw=f"{_H800}; {_H100}: 3,350 GB/s",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM_BURST,
            peak_flops=f"{_H800}; {_H100}: BF16 989.4 TFLOPS dense",
            host_link_bw=f"{_H800}; PCIe Gen5 x16, 64 GB/s per direction",
            network_bw="KunServe (shared/seeds/kunserve.txt) Table 2 cluster B: "
            "400 Gbps RDMA scale-out, unidirectional, per GPU",
            tp_link_bw=f"{_H800}: NVLink 400 GB/s (bidirectional) -> 200 GB/s per "
            "direction; DeepSeek reports ~160 GB/s achieved (github.com/deepseek-ai/"
            "DeepSeek-V3/issues/28, deepseek-ai/DeepEP/issues/16)",
            tp_allreduce_latency_s=f"{_H800}; H100 figure, same NVLink4/NVSwitch "
            f"generation: {_NCCL_H100}. NVIDIA/nccl#1984 reports 3.5 us for 1 KiB "
            "on 4 H800s without CUDA graphs",
            mfu=f"{_H800}; H100 SXM figure: "
            + _MAMF.format(got=794.5, peak=989, pct="80.3%", torch="2.7.0+cu126"),
            bw_eff=f"{_H800}; H100 SXM figure: "
            + _AZURE.format(
                got=2.97,
                peak=3.35,
                pct="88.7%",
                gpu="H100 80GB HBM3",
                copy=2.90,
                dot=3.18,
                where=_AZURE_H100,
            ),
        ),
    ),
    Device(
        name="l40s-48gb",
        memory_bytes=48 * GiB,
        stream_bw=864e9,
        alpha=0.7,
        burst_bytes=GDDR6_ACCESS_BYTES / 0.7,
        peak_flops=362.05e12,
        host_link_bw=32e9,
        network_bw=12.5e9,
        memory_kind="GDDR6",
        tp_link_bw=32e9,
        tp_allreduce_latency_s=25e-6,
        mfu=0.5,
        bw_eff=0.8,
        sources=_sources(
            driver_memory_bytes="default: no driver-reported total found for the "
            "L40S; memory_bytes (ECC-on drivers report less)",
            memory_bytes=f"{_L40S}: 48 GB GDDR6 with ECC{_GIB} (ECC-on "
            "drivers expose slightly less)",
            stream_bw=f"{_L40S}: 864 GB/s",
            alpha="assumption: GDDR6 sits between LPDDR5 (0.3-0.7, ODMA §2.2) "
            "and HBM (~1, SPEC.md); top of the LPDDR range chosen",
            burst_bytes="derived, same rule as LPDDR5 (one row activation per "
            "random chunk): one GDDR6 access (32 B: x16 channel x BL16, JEDEC "
            "JESD250) / alpha; alpha itself is an assumption",
            peak_flops=f"{_L40S}: BF16 Tensor 362.05 TFLOPS dense (733 with sparsity)",
            host_link_bw=f"{_L40S}: PCIe Gen4 x16 64 GB/s bidirectional "
            "-> 32 GB/s per direction",
            network_bw="assumption: one 100 Gb/s NIC per GPU (PCIe server)",
            tp_link_bw=f"{_L40S}: no NVLink; tensor parallelism runs over PCIe "
            "Gen4 x16, 32 GB/s per direction",
            tp_allreduce_latency_s=_PCIE_LATENCY,
            mfu="assumption: no published L40S GEMM measurement found; kvtune's "
            "former global default 0.5",
            bw_eff="assumption: no published L40S bandwidth measurement found; "
            "kvtune's former global default 0.8",
        ),
    ),
    Device(
        name="a100-40gb",
        memory_bytes=40 * GiB,
        stream_bw=1.555e12,
        alpha=0.9,
        burst_bytes=HBM_ACCESS_BYTES / 0.9,
        peak_flops=312e12,
        host_link_bw=32e9,
        network_bw=25e9,
        memory_kind="HBM2",
        tp_link_bw=300e9,
        tp_allreduce_latency_s=10.14e-6,
        mfu=271.2 / 312.0,
        bw_eff=1.70 / 2.039,
        driver_memory_bytes=39.50 * GiB,
        sources=_sources(
            memory_bytes=f"{_A100}: 40 GB HBM2 (SXM4 40GB){_GIB}",
            driver_memory_bytes=_CSV.format(
                rec=1, src="github.com/vllm-project/vllm/issues/12330, A100 40GB",
                quote="total_gpu_memory (39.50GiB) x gpu_memory_utilization (0.90)"),
            stream_bw=f"{_A100}: 1,555 GB/s (SXM4 40GB)",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM_BURST,
            peak_flops=f"{_A100}: BF16 Tensor 312 TFLOPS dense (624 sparse)",
            host_link_bw=f"{_A100}: PCIe Gen4 x16, 32+32 GB/s",
            network_bw="DGX A100 (40GB, 2020): one 200 Gb/s HDR InfiniBand HCA per GPU",
            tp_link_bw=f"{_A100}: third-generation NVLink 600 GB/s (bidirectional) "
            "-> 300 GB/s per direction",
            tp_allreduce_latency_s=_NCCL_A100,
            mfu="A100-SXM4-80GB figure, same GA100 die and clocks: "
            + _MAMF.format(got=271.2, peak=312, pct="86.9%", torch="2.6.0+cu126"),
            bw_eff="assumption: the A100-SXM4-80GB's measured share (BabelStream "
            f"Triad 1.70 of 2.039 TB/s, {_AZURE_A100}) applied to the 40GB's HBM2; no "
            "40GB measurement found",
        ),
    ),
    Device(
        name="rtx-3090-24gb",
        memory_bytes=24 * GiB,
        stream_bw=936e9,
        alpha=0.7,
        burst_bytes=GDDR6_ACCESS_BYTES / 0.7,
        peak_flops=71e12,
        host_link_bw=32e9,
        network_bw=12.5e9,
        memory_kind="GDDR6X",
        tp_link_bw=32e9,
        tp_allreduce_latency_s=25e-6,
        mfu=0.5,
        bw_eff=0.8,
        driver_memory_bytes=23.58 * GiB,
        sources=_sources(
            memory_bytes=f"{_RTX3090}: 24 GB GDDR6X{_GIB}",
            driver_memory_bytes=_CSV.format(
                rec="10-11", src="github.com/vllm-project/vllm/issues/10517, RTX "
                "3090 24GB", quote="total_gpu_memory=23.58GiB"),
            stream_bw=f"{_RTX3090}: 936 GB/s (19.5 Gbps x 384-bit)",
            alpha="assumption: GDDR6X taken as GDDR6 (0.7, see l40s-48gb)",
            burst_bytes="derived, same rule as LPDDR5: one 32 B GDDR6X access "
            "(x16 channel x BL16 equivalent) / alpha; alpha itself is an assumption",
            peak_flops=f"{_GA102}: GeForce RTX 3090 peak FP16/BF16 Tensor TFLOPS "
            "with FP32 accumulate 71 dense (142 with sparsity; 142 dense with FP16 "
            "accumulate, which PyTorch matmuls do not use)",
            host_link_bw=f"{_RTX3090}: PCIe Gen4 x16, 32 GB/s per direction",
            network_bw="assumption: one 100 Gb/s NIC per GPU (workstation/PCIe server)",
            tp_link_bw=f"{_RTX3090}: tensor parallelism over PCIe Gen4 x16, 32 GB/s "
            "per direction (a 2-way NVLink bridge, 112.5 GB/s total, is optional)",
            tp_allreduce_latency_s=_PCIE_LATENCY,
            mfu="assumption: no published RTX 3090 GEMM measurement used; kvtune's "
            "former global default 0.5",
            bw_eff="assumption: no published RTX 3090 bandwidth measurement used; "
            "kvtune's former global default 0.8",
        ),
    ),
    Device(
        name="t4-16gb",
        memory_bytes=16 * GiB,
        stream_bw=320e9,
        alpha=0.7,
        burst_bytes=GDDR6_ACCESS_BYTES / 0.7,
        peak_flops=65e12,
        host_link_bw=16e9,
        network_bw=12.5e9,
        memory_kind="GDDR6",
        tp_link_bw=16e9,
        tp_allreduce_latency_s=25e-6,
        mfu=0.5,
        bw_eff=0.8,
        driver_memory_bytes=14.74 * GiB,
        sources=_sources(
            memory_bytes=f"{_T4}: 16 GB GDDR6{_GIB} (ECC on by default; the driver "
            "exposes 15,360 MiB)",
            driver_memory_bytes=_CSV.format(
                rec=16, src="github.com/orca3/llm-model-serving ch02 notebook, Colab "
                "T4, vLLM v0.8.5.post1", quote="total_gpu_memory (14.74GiB)"),
            stream_bw=f"{_T4}: 320+ GB/s",
            alpha="assumption: GDDR6, as l40s-48gb (0.7)",
            burst_bytes="derived, as l40s-48gb: one 32 B GDDR6 access / alpha",
            peak_flops=f"{_T4}: mixed-precision (FP16/FP32) 65 TFLOPS; no BF16 "
            "(Turing), vLLM serves fp16",
            host_link_bw=f"{_T4}: PCIe Gen3 x16, 16 GB/s per direction (~15.75)",
            network_bw="assumption: one 100 Gb/s NIC per GPU (PCIe server)",
            tp_link_bw=f"{_T4}: no NVLink; tensor parallelism over PCIe Gen3 x16",
            tp_allreduce_latency_s=_PCIE_LATENCY,
            mfu="assumption: no published T4 GEMM measurement used; kvtune's former "
            "global default 0.5",
            bw_eff="assumption: no published T4 bandwidth measurement used; kvtune's "
            "former global default 0.8",
        ),
    ),
    Device(
        name="rtx-a6000-48gb",
        memory_bytes=48 * GiB,
        stream_bw=768e9,
        alpha=0.7,
        burst_bytes=GDDR6_ACCESS_BYTES / 0.7,
        peak_flops=154.8e12,
        host_link_bw=32e9,
        network_bw=12.5e9,
        memory_kind="GDDR6",
        tp_link_bw=32e9,
        tp_allreduce_latency_s=25e-6,
        mfu=0.5,
        bw_eff=0.8,
        driver_memory_bytes=47.54 * GiB,
        sources=_sources(
            memory_bytes=f"{_A6000}: 48 GB GDDR6 with ECC{_GIB}",
            driver_memory_bytes="github.com/vllm-project/vllm/issues/10360 (comment "
            "by paulcx, 2024-11-30, GPU 'A6000 (48G)', vLLM 0.6.4.post1): 'Memory "
            "profiling results: total_gpu_memory=47.54GiB'",
            stream_bw=f"{_A6000}: 768 GB/s",
            alpha="assumption: GDDR6, as l40s-48gb (0.7)",
            burst_bytes="derived, as l40s-48gb: one 32 B GDDR6 access / alpha",
            peak_flops=f"{_A6000}: peak FP16/BF16 Tensor TFLOPS with FP32 "
            "accumulate 154.8 dense (309.7 with sparsity)",
            host_link_bw=f"{_A6000}: PCIe Gen4 x16, 32 GB/s per direction",
            network_bw="assumption: one 100 Gb/s NIC per GPU (workstation/PCIe server)",
            tp_link_bw=f"{_A6000}: tensor parallelism over PCIe Gen4 x16, 32 GB/s per "
            "direction (a 2-way NVLink bridge, 112.5 GB/s total, is optional)",
            tp_allreduce_latency_s=_PCIE_LATENCY,
            mfu="assumption: no published RTX A6000 GEMM measurement used; kvtune's "
            "former global default 0.5",
            bw_eff="assumption: no published RTX A6000 bandwidth measurement used; "
            "kvtune's former global default 0.8",
        ),
    ),
)

for _dev in PRESETS:  # the registry is filled here, where the presets are defined
    register_device(_dev)
del _dev
