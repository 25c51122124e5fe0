"""What the benchmark scripts share: the machine's description, contenders timed alternately with medians after
warm-up, peak memory of a call, the FLOP/s of a large matmul, optional peers, and the JSON + PNG output.

The machines are shared and noisy, so a benchmark never compares numbers from different runs: every contender of a
table is measured in the same process, round-robin (a, b, c, a, b, c, ...), and each reports the median of its
timed repetitions after `warmup` untimed ones.
"""

import argparse
import importlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch


def base_parser(doc):
    """An argparse parser with the options every benchmark takes (device, repetitions, output folder, --tiny)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per contender (medians are reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions per contender before the timed ones")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--output_dir", default="results")
    p.add_argument("--tiny", action="store_true", help="a seconds-long run with tiny sizes (for the tests)")
    return p


def add_contenders_flag(parser, names=None):
    """`--contenders NAME [NAME ...]`: run only these of the benchmark's contenders (`names`, listed in the help where
    they do not depend on other flags); `chosen_contenders` checks the names once they are known."""
    listed = f": {'; '.join(names)}" if names else " (the names its table's columns and rows give them)"
    parser.add_argument("--contenders", nargs="+", metavar="NAME", default=None,
                        help=f"run only these contenders (default: every one){listed}")


def chosen_contenders(parser, args, names):
    """The contenders `--contenders` chose, in the benchmark's order (`names`), every one without the flag; argparse's
    usage error, listing `names`, for a name not among them."""
    unknown = [name for name in args.contenders or () if name not in names]
    if unknown:
        parser.error(f"argument --contenders: invalid choice: {unknown[0]!r} (choose from "
                     f"{', '.join(map(repr, names))})")
    return [name for name in names if args.contenders is None or name in args.contenders]


def not_run(reference):
    """The cell of a ratio whose reference contender `--contenders` left out."""
    return f"{reference} not run"


def setup_device(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available on this machine.")


def describe_machine(device):
    """One line naming the hardware the numbers come from."""
    if str(device).startswith("cuda"):
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def time_alternating(contenders, device, repeats, warmup):
    """Run each callable of `contenders` (name -> fn()) `warmup + repeats` times, round-robin; returns
    name -> {"median_s", "samples_s"} over the timed repetitions."""
    samples = {name: [] for name in contenders}
    for r in range(warmup + repeats):
        for name, fn in contenders.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            if r >= warmup:
                samples[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(s), "samples_s": s} for name, s in samples.items()}


def peak_memory_bytes(fn, device):
    """Peak bytes allocated by one call of `fn` above what was allocated before it.

    CUDA: the caching allocator's peak. CPU: the largest "Total Allocated" of the CPU allocator's memory events
    recorded by `torch.profiler` during the call (a separate, untimed call: the profiler slows the code down)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    saved_stderr = os.dup(2)  # the profiler's native code logs its start and stop to stderr: keep tables clean
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    memory = [e["args"] for e in events if e.get("name") == "[memory]"]
    if not memory:
        return 0
    before = memory[0]["Total Allocated"] - memory[0]["Bytes"]
    return max(m["Total Allocated"] for m in memory) - before


def matmul_flops_per_second(device, size=4096, dtype=torch.float32, repeats=5):
    """FLOP/s of a large square matmul (2 * size**3 FLOPs): the denominator of model FLOPs utilisation."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    timing = time_alternating({"matmul": lambda: a @ b}, device, repeats, warmup=1)["matmul"]
    return 2 * size**3 / timing["median_s"]


def optional_peer(module):
    """Import a peer package of the `bench` extra, or return None (the benchmark then reports it as skipped)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def describe_error(error):
    """`Type: first line` of the innermost exception (inductor wraps a kernel's failure in BackendCompilerFailed)."""
    while getattr(error, "inner_exception", None) is not None or error.__cause__ is not None:
        error = getattr(error, "inner_exception", None) or error.__cause__
    line = next((text.strip() for text in str(error).splitlines() if text.strip()), "")
    return f"{type(error).__name__}: {line}"[:300]


def write_json(args, name, payload):
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    write_whole(path, json.dumps({"args": vars(args), **payload}, indent=2, default=str))
    return path


def write_whole(path, text):
    """`text` into `path` by a rename: a run killed while writing leaves the previous file, never half of one."""
    part = Path(path).with_name(Path(path).name + ".part")
    try:
        part.write_text(text)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def pyplot():
    """matplotlib.pyplot with a file backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[bench]').")
        return None
    return plt


def save_figure(fig, args, name, title):
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(args.output_dir) / f"{name}.png"
    fig.savefig(path, dpi=120)
    return path


def log_axes(ax, xlabel, ylabel):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def markdown_table(header, rows):
    """Print a Markdown table (header: list of column names, rows: lists of cells already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    print("\n".join(lines), flush=True)
    return lines
