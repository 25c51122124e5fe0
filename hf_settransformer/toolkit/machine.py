"""The machine a run runs on: what it is (`run_environment`: CPU model, GPU, precision, versions, for the results),
whether bf16 is fast on it, the dense peak FLOP/s of its GPU (for the MFU), and the Trainer settings a run on a GPU
takes where the command does not say."""

import os
import platform
import re
import sys
from pathlib import Path

import torch
import transformers


def quiet_deepspeed_on_cpu():
    """DeepSpeed (the `deepspeed` extra) picks its accelerator when first imported, which transformers and accelerate
    do at a save or a launch, and where it detects none warns "Setting accelerator to CPU. If you have GPU ..." in
    every run of a CPU machine. Where torch sees no accelerator, `DS_ACCELERATOR=cpu` tells it in advance (a value
    already set is kept; once DeepSpeed is imported its choice is made)."""
    if "deepspeed" not in sys.modules and not torch.accelerator.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def cpu_model_name():
    """The CPU's model name (`/proc/cpuinfo`), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fast_bf16_available(use_cpu=False):
    """Whether bf16 autocast is fast here: on the GPU (unless `use_cpu`), when it supports bf16; on the CPU, with
    AVX512-BF16 or AMX (~4x fp32 on this project's machine; without them bf16 matmuls are ~300x slower than fp32)."""
    if not use_cpu and torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def run_environment(trainer):
    """What a run's results should say about where it ran: {"cpu_model", "cpu_fast_bf16" (AVX512-BF16 or AMX: the
    CPU kind a CPU figure depends on), "threads_per_process", "precision" (what the Trainer's accelerator actually
    runs: "bf16", "fp16" or "fp32"), "torch_compile", "gpu_name" (the training device's `torch.cuda.get_device_name`,
    None off CUDA), "transformers_version", "torch_version"}."""
    mixed, device = trainer.accelerator.mixed_precision, trainer.args.device
    return {
        "cpu_model": cpu_model_name(),
        "cpu_fast_bf16": fast_bf16_available(use_cpu=True),
        "threads_per_process": torch.get_num_threads(),
        "precision": "fp32" if mixed in (None, "no") else mixed,
        "torch_compile": bool(trainer.args.torch_compile),
        "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }


# What a GPU user expects of the Trainer, where the command does not say (`gpu_training_defaults`). The dataloader
# settings go together: an explicit --dataloader_num_workers leaves --dataloader_persistent_workers to the user (it
# needs workers). `dataloader_pin_memory` is already transformers' default (True).
GPU_TRAINING_DEFAULTS = {
    "optim": "adamw_torch_fused",  # one kernel per parameter group (transformers 5.23's default already)
    "dataloader_num_workers": 4,  # batches are made while the GPU runs the step
    "dataloader_persistent_workers": True,  # not started again for every epoch and periodic evaluation
    "torch_compile": True,  # the models' training forward has no host sync (fullgraph=True compiles)
    "per_device_eval_batch_size": 64,  # 64 windows of 512 tokens: the evaluations fill the device, not 32 of 128
}


def gpu_training_defaults(is_cuda, explicit=frozenset()):
    """The `TrainingArguments` fields a run on CUDA takes from `GPU_TRAINING_DEFAULTS`: {} off CUDA, and none of the
    fields in `explicit` (the ones the command sets). A pure function of its arguments, so the choice is testable on
    a machine without a GPU."""
    if not is_cuda:
        return {}
    defaults = {name: value for name, value in GPU_TRAINING_DEFAULTS.items() if name not in explicit}
    if "dataloader_num_workers" in explicit:
        defaults.pop("dataloader_persistent_workers", None)
    return defaults


# Dense (no sparsity) peak TFLOP/s of one GPU: (pattern of `torch.cuda.get_device_name()`, bf16/fp16 tensor cores,
# fp32 without tensor cores). Source: NVIDIA datasheets (H100/H200: SXM; A100: SXM and PCIe alike; Ada whitepaper for
# the RTX 4090: bf16 with fp32 accumulate). The first pattern that matches wins; NVL variants are not listed (their
# peaks differ) and so give no MFU rather than a wrong one.
GPU_PEAK_TFLOPS = [
    (r"\bH100\b.*PCIe", 756.0, 51.0),
    (r"\bH100\b(?!.*NVL)", 989.4, 67.0),
    (r"\bH200\b(?!.*NVL)", 989.4, 67.0),
    (r"\bA100\b", 312.0, 19.5),
    (r"\bL40S\b", 362.05, 91.6),
    (r"\bL4\b", 121.0, 30.3),
    (r"\bRTX 4090\b", 165.2, 82.6),
]


def peak_flops(device_name, precision="bf16"):
    """-> (dense peak FLOP/s of one device at `precision` ("bf16", "fp16", "fp32") or None, a note: the entry used, or
    why there is none). `device_name`: `torch.cuda.get_device_name()`, None for a CPU."""
    if device_name is None:
        return None, "no peak table for CPUs"
    if precision not in ("bf16", "fp16", "fp32"):
        return None, f"no {precision} peaks in the table (GPU_PEAK_TFLOPS: bf16/fp16 and fp32)"
    for pattern, half, single in GPU_PEAK_TFLOPS:
        if re.search(pattern, device_name):
            tflops = single if precision == "fp32" else half
            kind = "fp32 (no tensor cores)" if precision == "fp32" else f"{precision} dense tensor-core"
            return tflops * 1e12, f"{device_name}: {tflops:g} TFLOPS {kind} peak (NVIDIA datasheet)"
    return None, f"no peak for {device_name!r} in the table (hf_settransformer.toolkit.machine.GPU_PEAK_TFLOPS)"
