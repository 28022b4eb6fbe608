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
# --- V100, RTX 4090, L4, H200, B200, MI300X --------------------------------------
# Not every vendor datasheet could be retrieved; each string names the page the
# figure was actually read from (a vendor page, or a page quoting the vendor's table).
_V100 = (
    "NVIDIA Tesla V100 SXM2: developer.nvidia.com 'Programming Tensor Cores in CUDA "
    "9' and gist.github.com/wolfram77/a42aeb021a2fec7b7e85ceb71b398772 (notes on "
    "the V100 whitepaper); V100 datasheet not retrieved"
)
_V100_LINKS = (
    "Alibaba Cloud ACK 'topology-aware GPU scheduling' (alibabacloud.com): six "
    "NVLinks per V100, 25 GB/s one way (50 both ways) each; 8 GPUs in a hybrid "
    "cube mesh, not all pairs linked; PCIe link 16 GB/s"
)
_RTX4090 = (
    "GeForce RTX 4090 board specs (octo24.com Inno3D RTX 4090 listing, "
    "pugetsystems.com RTX 4090 24GB)"
)
_ADA = (
    "Ada whitepaper figures for the GeForce RTX 4090 as tabulated by waredb.com/"
    "processor/nvidia-geforce-rtx-4090 and gigagpu.com ('BF16 / FP16 (FP32 "
    "accum)' row); the whitepaper itself was not retrieved"
)
_L4 = (
    "NVIDIA L4 datasheet as quoted by store.sourcecode.com (L4 spec table) and "
    "grokipedia.com/page/NVIDIA_L4_vs_L40S; datasheet itself not retrieved"
)
_H200 = (
    "NVIDIA H200 SXM: MLPerf Inference v4.1 NVIDIA system file H200-SXM-141GBx8"
    "_TRT_MaxQ.json (github.com/mlcommons/inference_results_v4.1) and AnandTech's "
    "SC23 H200 table (anandtech.com/show/21136)"
)
_MAMF_HEAD = "github.com/stas00/ml-engineering compute/accelerator/README.md"
_B200 = (
    "glennklockwood.com/garden/processors/B200 (HGX B200 at 1,000 W: BF16 matrix "
    "2,250 TFLOPS, 4,500 sparse; 8 TB/s; 2x 900 GB/s NVLink 5)"
)
_B200_MEM = (
    "DGX B200 user guide (docs.nvidia.com/dgx/dgxb200-user-guide): '8 x NVIDIA B200 "
    "GPUs that provide 1,440 GB total GPU memory' = 180 GB each; "
    f"{_MAMF_HEAD} (commit 744d01e1) lists B200 SXM at 180 GB, citing NVIDIA's "
    "HGX AI Factory components page; MLPerf v6.0 Nebius: 'NVIDIA B200-SXM-180GB'. "
    "192 GB (glennklockwood.com) is the whole 8-stack package. The HGX B200 "
    "datasheet itself was not retrieved"
)
_MI300X = (
    f"AMD Instinct MI300X: {_MAMF_HEAD} (commit 744d01e1 memory table: 192 GB "
    "HBM3, 5.30 TB/s; note 17 cites amd.com MI300X specifications)"
)
_XGMI = (
    "rocm.blogs.amd.com 'Understanding RCCL Bandwidth and xGMI Performance on AMD "
    "Instinct MI300X': each GPU linked to its 7 peers, 'up to 64 GB/s for each "
    "point-to-point link', ~48 GB/s usable"
)
_HBM3E_BURST = (
    _HBM_BURST + "; assumption: HBM3e keeps HBM3's 32 B pseudo-channel access"
)

# Total memory as the driver reports it, for these parts.
_DRIVER_V100 = (
    "PyTorch on a 'V100 32GB': 'GPU 0; 31.74 GiB total capacity' (github.com/"
    "liucongg/ChatGLM-Finetuning/issues/73); a public vLLM 0.8.5 log on V100 "
    "(float16, Qwen2.5-7B-Instruct): 'the current vLLM instance can use "
    "total_gpu_memory (31.74GiB) x gpu_memory_utilization (0.90)' (repository of "
    "that copy not resolved, public code index text id 33435952071)"
)
_DRIVER_RTX4090 = (
    "github.com/vllm-project/vllm/issues/42049 (3x RTX 4090, vLLM 0.20.1): "
    "'Tried to allocate 23.04 GiB (GPU 0; 23.52 GiB total; 0 bytes free)'; "
    "Unsloth on 'NVIDIA GeForce RTX 4090': 'Max memory: 23.527 GB' (torch "
    "total_memory / 2**30; text id 12562085162). No vLLM total_gpu_memory line "
    "naming a 4090 was found"
)
_DRIVER_L4 = (
    "vLLM CI on L4: 'GPU 0 has a total capacity of 22.05 GiB' (github.com/"
    "vllm-project/vllm/issues/20214; a copy of its text says 'the OOM is specific "
    "to the L4 we use in CI') and 'Free memory on device cuda:0 (1.54/22.05 GiB) "
    "on startup' (vllm-project/vllm/issues/33297); Unsloth on 'NVIDIA L4' printed "
    "'Max memory: 22.161 GB' (text id 10982666894), ~0.5% more"
)
_DRIVER_H200 = (
    "public vLLM logs on one H200: 'Memory profiling results: total_gpu_memory="
    "139.80GiB' (vLLM v0.6.4.post1, text id 54021851790) and 'total_gpu_memory "
    "(139.81GiB) x gpu_memory_utilization (0.85)' (vLLM 0.7.3, nvidia-smi 'NVIDIA "
    "H200 ... 143771MiB', text id 20903468563); repositories not resolved"
)
_DRIVER_B200 = (
    "github.com/pytorch/ao/pull/4002 (device query on 'NVIDIA B200'): 'Total "
    "Global Memory: 178.35 GB' (GiB despite the label); vLLM start-up check 'Free "
    "memory on device cuda:0 (48.48/178.35 GiB) on startup' (text id 54853090387, "
    "GPU not named there, repository not resolved)"
)
_DRIVER_MI300X = (
    "vLLM V1 start-up on one MI300X (DigitalOcean gpu-mi300x1-192gb): 'Free memory "
    "on device (191.36/191.69 GiB) on startup' (text id 68960951502, repository "
    "not resolved); PyTorch HIP OOMs on MI300X also say 'total capacity of 191.69 "
    "GiB'. Older ROCm stacks: 191.98 GiB, and a vLLM 0.7.4 log 'total_gpu_memory "
    "(191.45GiB)' (text id 6563470627)"
)

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
    Device(
        name="v100-32gb",
        memory_bytes=32 * GiB,
        stream_bw=900e9,
        alpha=0.9,
        burst_bytes=HBM_ACCESS_BYTES / 0.9,
        peak_flops=125e12,
        host_link_bw=16e9,
        network_bw=12.5e9,
        memory_kind="HBM2",
        tp_link_bw=150e9,
        tp_allreduce_latency_s=10.14e-6,
        mfu=0.5,
        bw_eff=0.8,
        driver_memory_bytes=31.74 * GiB,
        sources=_sources(
            memory_bytes=f"{_V100}: SXM2 32 GB HBM2{_GIB} (NVML on a Tesla "
            "V100-SXM2-32GB: total 34058272768 B, pastebin.com/AaFUPNi5)",
            driver_memory_bytes=_DRIVER_V100,
            stream_bw=f"{_V100}: HBM2 900 GB/s (4096-bit)",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM_BURST,
            peak_flops=f"{_V100}: 'up to 125 Tensor TFLOPS' (FP16 multiply, FP32 "
            "accumulate; dense, Volta has no sparsity); no BF16 on Volta, so vLLM "
            "serves fp16",
            host_link_bw=f"{_V100_LINKS}; PCIe Gen3 x16, 16 GB/s per direction",
            network_bw="assumption: one 100 Gb/s NIC per GPU; no V100 system's NIC "
            "layout was verified",
            tp_link_bw=f"{_V100_LINKS}: 6 x 25 = 150 GB/s per direction (NVLink2, "
            "300 GB/s both ways); only an 8-GPU ring uses all six links, a pair has "
            "1-2 links (25-50 GB/s)",
            tp_allreduce_latency_s="assumption: no small-message NCCL measurement on "
            "NVLink2 V100s found; the A100 figure is reused (closest measured "
            "NVLink part; V100 has no NVSwitch, so likely optimistic): "
            + _NCCL_A100,
            mfu="assumption: no published V100 GEMM measurement used; kvtune's former "
            "global default 0.5",
            bw_eff="assumption: no published V100 bandwidth measurement used; "
            "kvtune's former global default 0.8",
        ),
    ),
    Device(
        name="rtx-4090-24gb",
        memory_bytes=24 * GiB,
        stream_bw=1008e9,
        alpha=0.7,
        burst_bytes=GDDR6_ACCESS_BYTES / 0.7,
        peak_flops=165.2e12,
        host_link_bw=32e9,
        network_bw=12.5e9,
        memory_kind="GDDR6X",
        tp_link_bw=32e9,
        tp_allreduce_latency_s=25e-6,
        mfu=0.5,
        bw_eff=0.8,
        driver_memory_bytes=23.52 * GiB,
        sources=_sources(
            memory_bytes=f"{_RTX4090}: 24 GB GDDR6X{_GIB}",
            driver_memory_bytes=_DRIVER_RTX4090,
            stream_bw=f"{_RTX4090}: 1008 GB/s (21 Gbit/s x 384-bit)",
            alpha="assumption: GDDR6X taken as GDDR6 (0.7, see l40s-48gb)",
            burst_bytes="derived, same rule as LPDDR5: one 32 B GDDR6X access "
            "(x16 channel x BL16 equivalent) / alpha; alpha itself is an assumption",
            peak_flops=f"{_ADA}: BF16 Tensor with FP32 accumulate 165.2 TFLOPS "
            "dense (330.3 with sparsity; FP16 with FP16 accumulate 330.3 dense, "
            "which PyTorch matmuls do not use); a stock-card instruction benchmark "
            "measured 165.5 TF/s BF16->FP32 (github.com/JustAResearcher/"
            "gpu-unlock-ada README)",
            host_link_bw=f"{_RTX4090}: PCI Express 4.0 x16, 32 GB/s per direction",
            network_bw="assumption: one 100 Gb/s NIC per GPU (workstation/PCIe server)",
            tp_link_bw=f"{_RTX4090}: no NVLink (Puget: 'Multi-GPU Technology Not "
            "Available'); tensor parallelism over PCIe Gen4 x16, 32 GB/s per "
            "direction",
            tp_allreduce_latency_s=_PCIE_LATENCY,
            mfu="assumption: no published RTX 4090 GEMM efficiency used; kvtune's "
            "former global default 0.5",
            bw_eff="assumption: no published RTX 4090 bandwidth measurement used; "
            "kvtune's former global default 0.8",
        ),
    ),
    Device(
        name="l4-24gb",
        memory_bytes=24 * GiB,
        stream_bw=300e9,
        alpha=0.7,
        burst_bytes=GDDR6_ACCESS_BYTES / 0.7,
        peak_flops=121e12,
        host_link_bw=32e9,
        network_bw=12.5e9,
        memory_kind="GDDR6",
        tp_link_bw=32e9,
        tp_allreduce_latency_s=25e-6,
        mfu=0.5,
        bw_eff=0.8,
        driver_memory_bytes=22.05 * GiB,
        sources=_sources(
            memory_bytes=f"{_L4}: 24 GB GDDR6, ECC on by default{_GIB}",
            driver_memory_bytes=_DRIVER_L4,
            stream_bw=f"{_L4}: 300 GB/s (192-bit GDDR6)",
            alpha="assumption: GDDR6, as l40s-48gb (0.7)",
            burst_bytes="derived, as l40s-48gb: one 32 B GDDR6 access / alpha",
            peak_flops=f"{_L4}: FP16/BF16 Tensor 242 TFLOPS with sparsity -> 121 "
            "dense (grokipedia quotes the FP16 figure; BF16 runs at the FP16 rate "
            "on Ada, hmc-tech.com computes 125.3 for both at the 2,040 MHz boost); "
            "a BF16 line of the datasheet itself was not seen",
            host_link_bw=f"{_L4}: PCI Express 4.0 x16, 32 GB/s per direction",
            network_bw="assumption: one 100 Gb/s NIC per GPU (PCIe server)",
            tp_link_bw=f"{_L4}: no NVLink; tensor parallelism over PCIe Gen4 x16, "
            "32 GB/s per direction",
            tp_allreduce_latency_s=_PCIE_LATENCY,
            mfu="assumption: no published L4 GEMM measurement found; kvtune's "
            "former global default 0.5",
            bw_eff="assumption: no published L4 bandwidth measurement found; "
            "kvtune's former global default 0.8",
        ),
    ),
    Device(
        name="h200-141gb",
        memory_bytes=141 * GiB,
        stream_bw=4.8e12,
        alpha=0.9,
        burst_bytes=HBM_ACCESS_BYTES / 0.9,
        peak_flops=989.4e12,
        host_link_bw=64e9,
        network_bw=50e9,
        memory_kind="HBM3e",
        tp_link_bw=450e9,
        tp_allreduce_latency_s=6e-6,
        mfu=794.5 / 989.4,
        bw_eff=4.15 / 4.8,
        driver_memory_bytes=139.80 * GiB,
        sources=_sources(
            memory_bytes=f"{_H200}: 141 GB HBM3e{_GIB}",
            driver_memory_bytes=_DRIVER_H200,
            stream_bw=f"{_H200}: 4.8 TB/s ({_MAMF_HEAD} memory table: 4.80 TB/s)",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM3E_BURST,
            peak_flops=f"{_H100}: BF16 Tensor 989.4 TFLOPS dense; the H200 has the "
            f"same GH100 compute ({_MAMF_HEAD} TFLOPS table: H200 SXM bf16 989, "
            "'H200 is the same as H100' but for memory)",
            host_link_bw=f"{_H200}: 'PCIe Gen5 x16' -> 64 GB/s per direction "
            "(measured 52 GB/s host-to-device on Azure ND H200 v5, github.com/Azure/"
            "AI-benchmarking-guide)",
            network_bw="DGX H200 (docs.nvidia.com DGX BasePOD 'Core Components'): "
            "eight single-port ConnectX-7, up to 400 Gb/s -> one per GPU",
            tp_link_bw=f"{_H200}: '18x 4th Gen NVLink, 900GB/s' (both ways) -> 450 "
            "GB/s per direction",
            tp_allreduce_latency_s="H100 figure, same GH100 die, NVLink4 and "
            f"NVSwitch as the HGX H100: {_NCCL_H100}",
            mfu=_MAMF.format(
                got=794.5,
                peak=989,
                pct="80.3%",
                torch="2.7.0+cu126; H100 SXM row, whose note says 'H200 is the "
                "same', commit 744d01e1",
            ),
            bw_eff=_AZURE.format(
                got=4.15,
                peak=4.8,
                pct="86.5%",
                gpu="NVIDIA H200 141GB",
                copy=4.01,
                dot=4.48,
                where="github.com/Azure/AI-benchmarking-guide Azure_Results/"
                "ND_H200_v5_results.md, commit 7f20e5fa",
            ),
        ),
    ),
    Device(
        name="b200-180gb",
        memory_bytes=180 * GiB,
        stream_bw=8e12,
        alpha=0.9,
        burst_bytes=HBM_ACCESS_BYTES / 0.9,
        peak_flops=2.25e15,
        host_link_bw=64e9,
        network_bw=50e9,
        memory_kind="HBM3e",
        tp_link_bw=900e9,
        tp_allreduce_latency_s=6e-6,
        mfu=1745.0 / 2250.0,
        bw_eff=0.8,
        driver_memory_bytes=178.35 * GiB,
        sources=_sources(
            memory_bytes=f"{_B200_MEM}{_GIB}",
            driver_memory_bytes=_DRIVER_B200,
            stream_bw=f"{_B200}: 8 TB/s; the driver reports a 7680-bit bus at 3996 "
            "MHz, ~7.67 TB/s (github.com/pytorch/ao/pull/4002)",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM3E_BURST,
            peak_flops=f"{_B200}: BF16 2.25 PFLOPS dense, 4.5 sparse per HGX GPU; "
            f"{_MAMF_HEAD} TFLOPS table: B200 SXM bf16 2250 (DGX B200 datasheet)",
            host_link_bw="MLPerf Inference v6.0 Nebius B200 system file (github.com/"
            "mlcommons/inference_results_v6.0): 'PCIe Gen5 x16' -> 64 GB/s per "
            "direction; glennklockwood.com lists PCIe Gen6 capability",
            network_bw="DGX B200 user guide: 8 x ConnectX-7 single-port cards, "
            "InfiniBand up to 400Gbps -> one 400 Gb/s link per GPU",
            tp_link_bw=f"{_B200}: NVLink 5 1.8 TB/s (both ways) -> 900 GB/s per "
            "direction (docs.vultr.com HGX B200 overview: NV18 between all pairs)",
            tp_allreduce_latency_s="assumption: no small-message NCCL measurement on "
            "B200 found; the H100 figure is reused (NVLink5 + NVSwitch is the next "
            f"generation of the same switched fabric): {_NCCL_H100}",
            mfu=_MAMF.format(
                got=1745.0,
                peak=2250,
                pct="77.6%",
                torch="2.7.1+cu128; B200 SXM row, commit 744d01e1",
            ),
            bw_eff="assumption: no published B200 STREAM measurement found; kvtune's "
            "former global default 0.8 (the 7.67 TB/s bus figure is 96% of 8 TB/s)",
        ),
    ),
    Device(
        name="mi300x-192gb",
        memory_bytes=192 * GiB,
        stream_bw=5.3e12,
        alpha=0.9,
        burst_bytes=HBM_ACCESS_BYTES / 0.9,
        peak_flops=1307.4e12,
        host_link_bw=64e9,
        network_bw=50e9,
        memory_kind="HBM3",
        tp_link_bw=448e9,
        tp_allreduce_latency_s=5.39e-6,
        mfu=668.4 / 1307.4,
        bw_eff=0.8,
        driver_memory_bytes=191.69 * GiB,
        sources=_sources(
            memory_bytes=f"{_MI300X}: 192 GB HBM3{_GIB}; MLPerf v4.1 AMD system "
            "file: 'AMD Instinct MI300X-NPS1-SPX-192GB-750W'",
            driver_memory_bytes=_DRIVER_MI300X,
            stream_bw=f"{_MI300X}: 5.3 TB/s",
            alpha=_HBM_ALPHA,
            burst_bytes=_HBM_BURST,
            peak_flops=f"{_MAMF_HEAD} (commit b9e29720): 2100 MHz x 256 x 2 x 1216 "
            "= 1307.4 TFLOPS BF16 dense, 'matches the published spec' (1300 "
            "rounded); also 'BF16 dense 1307.4 TFLOP/s' in github.com/"
            "alpharomercoma/MI300X-vs-H200 REPORT.md",
            host_link_bw="MLPerf Inference v4.1 AMD system file 8xMI300X_2xEPYC-"
            "9374F.json: 'PCIe Gen5 x16' -> 64 GB/s per direction",
            network_bw="Azure ND MI300X v5 (MicrosoftDocs/azure-docs "
            "nd-mi300x-v5-series.md): '8x400 Gigabit NDR' for 8 MI300X -> 400 Gb/s "
            "per GPU",
            tp_link_bw=f"{_XGMI}: 7 x 64 = 448 GB/s per direction, reached only when "
            "all 7 links carry traffic (TP=8); fewer GPUs get a fraction "
            "(github.com/ROCm/rccl/pull/1270 README note), TP=2 one 64 GB/s link",
            tp_allreduce_latency_s="measured: RCCL-tests with MSCCL++ on 8 MI300X, "
            "1 KiB fp16 all-reduce 5.39 us out-of-place (github.com/microsoft/"
            "mscclpp/pull/736); plain RCCL was not measured here",
            mfu=_MAMF.format(
                got=668.4,
                peak=1300,
                pct="51.4%",
                torch="2.5.1+6.3.42131, PYTORCH_TUNABLEOP_ENABLED=1, commit "
                "744d01e1",
            )
            + "; taken against this preset's 1307.4: 51.1%",
            bw_eff="assumption: no published MI300X STREAM measurement found; "
            "kvtune's former global default 0.8",
        ),
    ),
)

for _dev in PRESETS:  # the registry is filled here, where the presets are defined
    register_device(_dev)
del _dev
