"""What data-parallel training communicates: two CPU processes (gloo) train the shipped model's
shape (``minillm.recipe.recipe_config``, randomly initialized) with ``DistributedDataParallel``.

For each way of grouping the gradients into all-reduce calls, bucketed (DDP's default
buckets of 25 MB) and one call a parameter (``bucket_cap_mb`` near zero), it measures:
- the all-reduce calls per step and the bytes they carry (counted by a DDP communication
  hook that wraps the default all-reduce);
- the median time of a training step (forward, backward, AdamW) with the all-reduce, and
  of the same step under ``no_sync()`` (no communication), interleaved in the same
  processes; the difference over the first is communication's share of the step.
On one machine with 2 cores the two processes already share the cores, so data
parallelism brings no speedup here; the point is what it costs. Usage:
python bench/ddp_comm.py [--steps 20] [--batch-size 8] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from minillm.model import GPT
from minillm.recipe import recipe_config

WORLD_SIZE = 2
GROUPINGS = {"bucketed (25 MB buckets, the default)": 25.0, "one all-reduce a parameter": 1e-6}


def _counting_hook(counter: dict):
    def hook(state, bucket):
        counter["calls"] += 1
        counter["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
        return default_hooks.allreduce_hook(state, bucket)
    return hook


def _step(model, optimizer, x, y, sync: bool) -> float:
    """One training step, with the all-reduce (sync) or without it (no_sync): its seconds."""
    started = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    if sync:
        model(x, y)[1].backward()
    else:
        with model.no_sync():
            model(x, y)[1].backward()
    optimizer.step()
    return time.perf_counter() - started


def _median_times(model, optimizer, x, y, steps: int) -> tuple[float, float]:
    """Median seconds of a step with and without the all-reduce, the two kinds interleaved so
    that a change in the machine's load hits both alike."""
    synced, alone = [], []
    for _ in range(steps):
        synced.append(_step(model, optimizer, x, y, sync=True))
        alone.append(_step(model, optimizer, x, y, sync=False))
    return statistics.median(synced), statistics.median(alone)


def _worker(rank: int, port: int, args, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        config = recipe_config(2048)
        rows = []
        for name, cap in GROUPINGS.items():
            torch.manual_seed(0)
            model = DistributedDataParallel(GPT(config), bucket_cap_mb=cap)
            counter = {"calls": 0, "bytes": 0}
            model.register_comm_hook(None, _counting_hook(counter))
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randint(0, config.vocab_size, (args.batch_size // WORLD_SIZE, config.context_length))
            for _ in range(3):  # warm up (and let DDP rebuild its buckets after the first step)
                _step(model, optimizer, x, x, sync=True)
            counter.update(calls=0, bytes=0)
            synced, alone = _median_times(model, optimizer, x, x, args.steps)
            calls, sent = counter["calls"] / args.steps, counter["bytes"] / args.steps
            times = torch.tensor([synced, alone])
            dist.all_reduce(times)  # the mean over the ranks
            synced, alone = (times / WORLD_SIZE).tolist()
            gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
            rows.append(dict(grouping=name, bucket_cap_mb=cap, calls_per_step=calls, bytes_per_step=sent,
                             gradient_bytes=gradient_bytes, step_s=synced, step_without_allreduce_s=alone,
                             communication_share=(synced - alone) / synced))
        if rank == 0:
            queue.put(dict(parameters=sum(p.numel() for p in model.parameters()), rows=rows))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each kind (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8, help="the global batch (default: %(default)s)")
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args(argv)
    started = time.time()
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_worker, args=(_free_port(), args, queue), nprocs=WORLD_SIZE, join=True, start_method="spawn")
    result = queue.get()
    print(f"{WORLD_SIZE} processes (gloo, one thread each), the shipped model's shape: {result['parameters']:,d} "
          f"parameters, global batch {args.batch_size} x 128 tokens, {args.steps} timed steps of each kind")
    print(f"{'grouping':40s} {'calls/step':>10s} {'MB/step':>8s} {'step ms':>8s} {'no-sync ms':>10s} {'comm share':>10s}")
    for row in result["rows"]:
        print(f"{row['grouping']:40s} {row['calls_per_step']:10.0f} {row['bytes_per_step'] / 1e6:8.2f} "
              f"{row['step_s'] * 1e3:8.1f} {row['step_without_allreduce_s'] * 1e3:10.1f} "
              f"{row['communication_share']:10.1%}")
    bucketed, per_parameter = result["rows"]
    print(f"one call a parameter against buckets: {per_parameter['calls_per_step'] / bucketed['calls_per_step']:.0f}x "
          f"the calls, a step {per_parameter['step_s'] / bucketed['step_s']:.2f}x as long; every step all-reduces the "
          f"whole gradient, {bucketed['gradient_bytes'] / 1e6:.2f} MB")
    if args.json:
        result.update(command="python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
                      seconds=round(time.time() - started, 1), torch=str(torch.__version__), steps=args.steps,
                      batch_size=args.batch_size)
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
            out.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
