"""Attention kernels side by side: time and memory, on the CPU or on a CUDA GPU (chosen automatically).

CPU: chapter 04's naive attention (the "math" backend), the tiled PyTorch version
(``minillm.flash.flash_attention``) and ``F.scaled_dot_product_attention``; one head,
d = 64, float32, causal, N = 256 ... 4,096; a training step's attention (forward and
backward) on one thread. Peak memory is the point here: it is the peak of live tensor bytes
(``minillm.flash.LiveTensorBytes``, what the dispatcher sees: a fused kernel's scratch
space inside one call is invisible to it). CPU time is shown but is not the point: the
tiled version runs its tiles one by one from Python.

GPU: naive, tiled PyTorch, the Triton kernel (``minillm.flash_triton``) and torch's SDPA
pinned to its flash backend (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``: on Hopper
cuDNN's backend can be faster and would blur the comparison); forward pass; time, TFLOP/s
and peak memory (``torch.cuda.max_memory_allocated`` above the inputs) for N = 1k ... 16k,
d = 64 and 128, float16 and bfloat16, causal and not, batch * N = 16k tokens, 16 heads.
The naive version is skipped where its N x N matrices would not fit, the tiled PyTorch
one beyond N = 8k (its Python loop launches tens of thousands of small kernels).

Needs only torch (and Triton for the kernel), run from the repository with PYTHONPATH=.;
prints the versions and the device, then a Markdown table. Usage:
PYTHONPATH=. python bench/flash_attention.py [--json FILE] [--quick]
"""
import argparse
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from minillm import flash
from minillm.attention import get_attention_backend

naive = get_attention_backend("math")


def median_seconds(fn, repeats: int, synchronize=lambda: None) -> float:
    """The median wall time of ``fn()`` over ``repeats`` runs, after one warm-up run."""
    fn()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def training_step(attention, q, k, v):
    """A function running attention forward and backward on fresh leaves copied from q, k, v."""
    def step():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        attention(*leaves).sum().backward()
    return step


def cpu_table(lengths, repeats: int) -> list[dict]:
    methods = {
        "naive (math)": lambda q, k, v: naive(q, k, v, causal=True),
        "tiled PyTorch (flash_attention, 128 x 128)": lambda q, k, v: flash.flash_attention(q, k, v, causal=True,
                                                                                          block_q=128, block_k=128),
        "F.scaled_dot_product_attention": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    rows = []
    torch.set_num_threads(1)
    for n in lengths:
        q, k, v = torch.randn(3, 1, 1, n, 64, generator=torch.Generator().manual_seed(n)).unbind(0)
        row = {"N": n}
        for name, attention in methods.items():
            step = training_step(attention, q, k, v)
            row[name] = {"seconds": median_seconds(step, repeats), "peak_bytes": flash.peak_tensor_bytes(step)}
        rows.append(row)
        print(f"  N = {n}: done", file=sys.stderr)
    return rows


def print_cpu_table(rows) -> None:
    names = [name for name in rows[0] if name != "N"]
    baseline = names[0]
    print("\n| N | " + " | ".join(f"{name}: ms, MiB" for name in names) + " | memory, naive / tiled |")
    print("| ---: |" + " ---: |" * (len(names) + 1))
    for row in rows:
        cells = [f"{row[name]['seconds'] * 1e3:.1f} ms ({row[name]['seconds'] / row[baseline]['seconds']:.2f}x), "
                 f"{row[name]['peak_bytes'] / 2**20:.2f} MiB" for name in names]
        ratio = row[baseline]["peak_bytes"] / row[names[1]]["peak_bytes"]
        print(f"| {row['N']:,d} | " + " | ".join(cells) + f" | {ratio:.1f}x |")
    print("\nTimes: median of a training step's attention (forward + backward), one thread; in brackets, "
          "the ratio to the naive version in the same run. Memory: peak of live tensor bytes above the inputs.")


def gpu_table(lengths, repeats: int) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        from minillm import flash_triton
    except ImportError as error:
        flash_triton = None
        print(f"Triton kernel skipped: {error}", file=sys.stderr)

    def sdpa(q, k, v, causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    methods = {
        "naive": lambda q, k, v, causal: naive(q, k, v, causal=causal),
        "tiled PyTorch": lambda q, k, v, causal: flash.flash_attention(q, k, v, causal=causal, block_q=128, block_k=128),
        "Triton": None if flash_triton is None else
        (lambda q, k, v, causal: flash_triton.triton_attention_forward(q, k, v, causal, **flash_triton.launch_options(q))[0]),
        "torch SDPA (flash)": sdpa,
    }
    free_bytes = torch.cuda.mem_get_info()[0]
    rows = []
    for d in (64, 128):
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                for n in lengths:
                    batch, heads = max(1, 16384 // n), 16
                    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=dtype) for _ in range(3))
                    flops = 4 * batch * heads * n * n * d / (2 if causal else 1)
                    row = {"N": n, "d": d, "dtype": str(dtype).split(".")[-1], "causal": causal}
                    for name, fn in methods.items():
                        naive_bytes = 4 * batch * heads * n * n * 4  # a few N x N matrices, the softmax in float32
                        if fn is None or (name == "naive" and naive_bytes > 0.6 * free_bytes) or (name == "tiled PyTorch" and n > 8192):
                            row[name] = None
                            continue
                        with torch.no_grad():
                            torch.cuda.synchronize()
                            torch.cuda.reset_peak_memory_stats()
                            base = torch.cuda.memory_allocated()
                            seconds = median_seconds(lambda: fn(q, k, v, causal), repeats, torch.cuda.synchronize)
                            peak = torch.cuda.max_memory_allocated() - base
                        row[name] = {"seconds": seconds, "tflops": flops / seconds / 1e12, "peak_bytes": peak}
                    rows.append(row)
                    del q, k, v
                    torch.cuda.empty_cache()
                    print(f"  d = {d}, {row['dtype']}, causal = {causal}, N = {n}: done", file=sys.stderr)
    return rows


def print_gpu_table(rows) -> None:
    names = [name for name in rows[0] if name not in ("N", "d", "dtype", "causal")]
    print("\n| d | dtype | causal | N | " + " | ".join(f"{name}: ms, TFLOP/s, MiB" for name in names) +
          " | Triton / SDPA time |")
    print("| ---: | --- | --- | ---: |" + " ---: |" * (len(names) + 1))
    for row in rows:
        cells = ["—" if row[name] is None else
                 f"{row[name]['seconds'] * 1e3:.2f}, {row[name]['tflops']:.0f}, {row[name]['peak_bytes'] / 2**20:.0f}"
                 for name in names]
        triton, sdpa = row.get("Triton"), row.get("torch SDPA (flash)")
        ratio = "—" if triton is None or sdpa is None else f"{triton['seconds'] / sdpa['seconds']:.2f}x"
        print(f"| {row['d']} | {row['dtype']} | {row['causal']} | {row['N']:,d} | " + " | ".join(cells) + f" | {ratio} |")
    print("\nForward pass, batch * N = 16,384 tokens, 16 heads; time: median; TFLOP/s: 4 N^2 d per head "
          "(halved when causal) over that time; memory: peak allocated above the inputs. —: not run (see the docstring).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the rows, the command and its duration to this JSON file")
    parser.add_argument("--quick", action="store_true", help="two lengths and one repeat: checks that the script runs")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton
        versions["triton"] = triton.__version__
    except ImportError:
        versions["triton"] = "not installed"
    versions["device"] = torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})"
    print(" · ".join(f"{key} {value}" for key, value in versions.items()))
    start = time.perf_counter()
    if cuda:
        lengths = [1024, 2048] if args.quick else [1024, 2048, 4096, 8192, 16384]
        rows = gpu_table(lengths, repeats=1 if args.quick else 10)
        print_gpu_table(rows)
    else:
        lengths = [256, 512] if args.quick else [256, 512, 1024, 2048, 4096]
        rows = cpu_table(lengths, repeats=1 if args.quick else 3)
        print_cpu_table(rows)
    seconds = time.perf_counter() - start
    print(f"\n{len(rows)} rows in {seconds:.0f} s")
    if args.json:
        record = {"command": "PYTHONPATH=. python " + " ".join(["bench/flash_attention.py", *sys.argv[1:]]),
                  "seconds": round(seconds, 1), "versions": versions, "rows": rows}
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(record, file, indent=1)
            file.write("\n")


if __name__ == "__main__":
    main()
