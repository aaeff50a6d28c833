"""Data-parallel training cost: the `cnn` step with 1 and 2 processes, and the share of communication.

    .venv/bin/python benchmarks/ddp.py [--steps 30] [--rounds 3] [--batch 64] [--json]

The `cnn` (widths 32, 64, 128: the config default) on CIFAR-shaped data (random float32 3×32×32
inputs, 10 classes, made in memory: no data loading is timed), AdamW with the project's default
settings, fp32, deterministic kernels as the default config, gloo on the CPU. Every process has
ONE torch thread: the fair per-rank comparison on a 2-core machine. Rounds alternate:

- N=1: one plain process (no DDP, no reduction: what `veritrain train` runs with one process),
  `--batch` samples per step;
- N=2: two ranks started by torchrun (`python -m torch.distributed.run --standalone
  --nproc-per-node 2`, as `veritrain train --nproc 2` starts them), `--batch` samples per rank, so a
  global batch of 2 × `--batch`. Each repetition times, in alternating order and each after a barrier
  (not timed): the step as the loop runs it (forward, the per-batch `distributed.reduce_batch` of 6
  floats, backward with DDP's gradient all-reduce, optimizer step) and the same step under
  `ddp.no_sync()` without the reduction (compute only); then, alone, `reduce_batch` and a broadcast of
  the BatchNorm buffers' bytes (DDP broadcasts rank 0's buffers before every forward, in both kinds of
  step). Each time is the slower rank's (a step ends when both ranks are done).
- for reference: one process with 2 threads (the same 2 cores as the two ranks).

Communication per step = synced step − no-sync step + buffer broadcast, and its share = that / synced
step. The synced step holds the reduction, so this is (synced − no-sync + reduce_batch) / (synced +
reduce_batch) with "synced" taken without it; the broadcast is added because the no-sync step holds it
too. What remains of it after the two small collectives is the gradient all-reduce (with the ranks
waiting for each other). The model behind the expected figures: with N ranks on N devices of their
own, each as fast as one process alone, throughput ≈ N × (1 − share(N)) × one process's; share(N)
scales the gradient all-reduce by 2(N−1)/N (the share of the gradient bytes each rank sends in a ring
all-reduce; 1 at N=2) and keeps the small collectives constant (optimistic: their latency grows with N).
Its limits: on GPUs with NCCL the compute is far faster, so the same bytes are a larger share; DDP
overlaps its bucketed all-reduce with the rest of backward, which hides part of it (little here: this
model's 95k parameters fill one or two buckets); and several nodes add a slower network.

THIS MACHINE CANNOT SHOW SPEED-UP: it has 2 cores, shared by the two 1-thread ranks, the launcher and
gloo's threads, so N=2 can at best match 2 × N=1's samples/s, and in practice does not. What N=2
gains over N=1 here is the second core, which one process with 2 threads also uses; it says nothing
of the speed-up on devices of their own. The figures are reported, with no target.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WIDTHS = [32, 64, 128]  # ModelConfig.widths default
CLASSES = 10
REDUCED_FLOATS = 6  # what the loop reduces per batch for classification: loss sum, samples, correct, 2 signal slots, checkpoint due
WARMUP = 5  # steps (or repetitions) not timed: allocator, first-call costs, gloo connections


# ---------------------------------------------------------------- one process (a rank, or the N=1 run)


def worker(steps: int, batch: int, threads: int, out: Path) -> None:
    """Time `steps` training steps after the warm-up and write them to `out` (as rank 0 under torchrun)."""
    import torch
    import torch.nn.functional as F

    from veritrain import models
    from veritrain.core.config import OptimConfig
    from veritrain.core.seeding import seed_everything
    from veritrain.train import distributed
    from veritrain.train.loop import build_optimizer

    torch.set_num_threads(threads)
    seed_everything(0, True)  # the default config: seed and deterministic kernels
    ranks = distributed.from_environment()
    rank = ranks.rank if ranks else 0
    model = models.build("cnn", [3, 32, 32], CLASSES, WIDTHS, [256], 0.0)
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own share of the data
    batches = [(torch.randn(batch, 3, 32, 32, generator=generator), torch.randint(0, CLASSES, (batch,), generator=generator)) for _ in range(4)]

    if ranks is None:
        optimizer = build_optimizer(OptimConfig(), model)
        times = []
        for step in range(WARMUP + steps):
            x, y = batches[step % len(batches)]
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.item()  # the loop reads the loss every batch (non-finite check, epoch sums)
            loss.backward()
            optimizer.step()
            if step >= WARMUP:
                times.append(time.perf_counter() - started)
        out.write_text(json.dumps({"processes": 1, "threads": threads, "step": times}))
        return

    ranks = distributed.start(ranks, "gloo", "cpu")
    result = measure_ranks(model, batches, steps, ranks)
    # the DDP wrapper must be gone before the group is destroyed, as in veritrain's worker (loop.run returns
    # first): a wrapper that outlives it takes the last reference to gloo's process group, whose destructor
    # then joins gloo's worker thread while holding the GIL that thread may need (a hang at exit, seen here)
    gc.collect()
    distributed.stop_group()
    if ranks.is_main:
        out.write_text(json.dumps({"processes": ranks.world_size, "threads": threads, **result}))


def measure_ranks(model: Any, batches: list[tuple[Any, Any]], steps: int, ranks: Any) -> dict[str, Any]:
    """Synced and no-sync steps, reduce_batch and the buffer broadcast on this rank; the slower rank's times."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from veritrain.core.config import OptimConfig
    from veritrain.train import distributed
    from veritrain.train.loop import build_optimizer

    ddp = torch.nn.parallel.DistributedDataParallel(model)  # as the loop wraps it: broadcast_buffers and bucket size by default
    optimizer = build_optimizer(OptimConfig(), model)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    buffers_stand_in = torch.zeros(buffer_bytes, dtype=torch.uint8)  # the same bytes in one broadcast, as DDP coalesces them

    def per_batch_reduction(loss_value: float, samples: int) -> None:
        distributed.reduce_batch([loss_value * samples, float(samples), *[0.0] * (REDUCED_FLOATS - 2)])  # zeros: no signal, no checkpoint due

    def step(x: torch.Tensor, y: torch.Tensor, synced: bool) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss_value = loss.item()
        if synced:  # where the loop reduces: after the forward, before backward
            per_batch_reduction(loss_value, len(y))
        loss.backward()
        optimizer.step()

    synced_times, nosync_times, reduce_times, broadcast_times = [], [], [], []
    for rep in range(WARMUP + steps):
        x, y = batches[rep % len(batches)]
        for synced in ((True, False) if rep % 2 == 0 else (False, True)):  # alternate the order: neither kind always goes first
            dist.barrier()
            started = time.perf_counter()
            if synced:
                step(x, y, True)
            else:
                with ddp.no_sync():  # gradients stay local: no all-reduce in backward (buffers are still broadcast)
                    step(x, y, False)
            elapsed = time.perf_counter() - started
            if rep >= WARMUP:
                (synced_times if synced else nosync_times).append(elapsed)
        # the two small collectives alone, each right after a barrier: their own cost, without the wait for a
        # slower rank's forward that the reduction inside a step also absorbs
        dist.barrier()
        started = time.perf_counter()
        per_batch_reduction(1.0, len(y))
        reduce_seconds = time.perf_counter() - started
        dist.barrier()
        started = time.perf_counter()
        dist.broadcast(buffers_stand_in, src=0)
        if rep >= WARMUP:
            reduce_times.append(reduce_seconds)
            broadcast_times.append(time.perf_counter() - started)

    # a step ends when its slower rank ends: the element-wise maximum over the ranks
    table = torch.tensor([synced_times, nosync_times, reduce_times, broadcast_times], dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    synced_max, nosync_max, reduce_max, broadcast_max = table.tolist()
    return {"step": synced_max, "nosync": nosync_max, "reduce_batch": reduce_max, "buffer_broadcast": broadcast_max,
            "gradient_bytes": sum(p.numel() for p in model.parameters()) * 4, "buffer_bytes": buffer_bytes}  # fp32 gradients


# ---------------------------------------------------------------- the coordinator


def launch(command: list[str], threads: int, what: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))  # torchrun would set 1 anyway; say it for both kinds of run
    # its own process group: a hung run is stopped with its ranks, not only the launcher
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=300)  # seconds: far above a run at the default --steps
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise SystemExit(f"error: the {what} run took over 300 s and was stopped; is the machine busy? try fewer --steps") from None
    if process.returncode != 0:
        tail = (stderr or stdout).strip().splitlines()[-5:]
        raise SystemExit(f"error: the {what} run failed (exit code {process.returncode}):\n" + "\n".join(tail))


def median_ms(values: list[float]) -> float:
    return 1000 * statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per process and round (N=2: repetitions of each kind of step)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the N=1, N=2 and 2-thread runs")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.batch, args.threads, Path(args.out))
        return

    script = str(Path(__file__).resolve())
    common = ["--worker", "--steps", str(args.steps), "--batch", str(args.batch)]
    pooled: dict[str, dict[str, list[float]]] = {"one": {}, "two": {}, "two_threads": {}}
    round_medians: dict[str, list[float]] = {"one": [], "two": [], "two_threads": []}
    info: dict[str, int] = {}
    load_before = os.getloadavg()[0]  # runnable processes, 1-minute average: above ~0.5, other work is sharing the 2 cores
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(args.rounds):
            runs = {
                "one": ([sys.executable, script, *common], 1, "N=1"),
                "two": ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
                         "--max-restarts=0", "--monitor-interval=0.1", script, *common], 1, "N=2 (torchrun)"),
                "two_threads": ([sys.executable, script, *common, "--threads", "2"], 2, "N=1, 2 threads"),
            }
            for key, (command, threads, what) in runs.items():
                out = Path(tmp) / f"{key}-{number}.json"
                launch([*command, "--out", str(out)], threads, what)
                result = json.loads(out.read_text())
                for name, values in result.items():
                    if isinstance(values, list):
                        pooled[key].setdefault(name, []).extend(values)
                    elif key == "two":
                        info[name] = values
                round_medians[key].append(median_ms(result["step"]))
                if not args.json:
                    print(f"  round {number + 1}: {what}: step {round_medians[key][-1]:.1f} ms", file=sys.stderr, flush=True)

    load_after = os.getloadavg()[0]  # 2 or more from this benchmark alone; far above: other work joined in
    one, two, two_threads = (median_ms(pooled[k]["step"]) for k in ("one", "two", "two_threads"))
    nosync = median_ms(pooled["two"]["nosync"])
    reduce_batch = median_ms(pooled["two"]["reduce_batch"])
    buffers = median_ms(pooled["two"]["buffer_broadcast"])
    # the step holds the reduction; the no-sync step holds compute and the buffer broadcast
    communication = two - nosync + buffers
    share = communication / two
    # the rest: the gradient all-reduce and the ranks waiting for each other (noise can make it negative)
    allreduce = max(0.0, two - nosync - reduce_batch)
    compute = nosync - buffers
    expected = {}
    for n in (2, 4, 8):
        comm_n = allreduce * (2 * (n - 1) / n) + reduce_batch + buffers  # ring all-reduce: each rank sends 2(N−1)/N of the gradient
        efficiency = compute / (compute + comm_n)  # = 1 − share(N)
        expected[n] = {"share": 1 - efficiency, "efficiency": efficiency, "speedup": n * efficiency}
    samples_one, samples_two, samples_two_threads = 1000 * args.batch / one, 1000 * 2 * args.batch / two, 1000 * args.batch / two_threads
    cannot = ("this 2-core machine cannot show speed-up: the two 1-thread ranks share its 2 cores with the launcher and gloo's threads, "
              "so N=2 can at best match 2 × N=1's samples/s and in practice does not; what N=2 gains over N=1 here is the second core, "
              "which one process with 2 threads also uses")
    document = {
        "model": {"name": "cnn", "widths": WIDTHS, "input": [3, 32, 32], "classes": CLASSES, "gradient_bytes": info["gradient_bytes"],
                  "buffer_bytes": info["buffer_bytes"]},
        "optimizer": "adamw (OptimConfig defaults)", "backend": "gloo", "threads_per_process": 1, "batch_per_rank": args.batch,
        "steps": args.steps, "rounds": args.rounds, "seconds": round(time.perf_counter() - started, 1),
        "cpu_count": os.cpu_count(), "load_average_before": load_before, "load_average_after": load_after,
        "n1": {"step_ms": one, "samples_per_s": samples_one, "round_step_ms": round_medians["one"]},
        "n2": {"step_ms": two, "samples_per_s": samples_two, "round_step_ms": round_medians["two"], "nosync_step_ms": nosync,
               "reduce_batch_ms": reduce_batch, "buffer_broadcast_ms": buffers, "gradient_allreduce_ms": allreduce,
               "communication_ms": communication, "communication_share": share},
        "n1_2threads": {"step_ms": two_threads, "samples_per_s": samples_two_threads, "round_step_ms": round_medians["two_threads"]},
        "measured_speedup_n2": samples_two / samples_one,
        "per_rank_slowdown_n2": compute / one,  # compute-only step of a rank at N=2 against the N=1 step: the cost of sharing the cores
        "expected": {str(n): v for n, v in expected.items()},
        "note": cannot,
    }
    if args.json:
        print(json.dumps(document, indent=2))
        return
    rows = [
        ("N=1 (1 process, 1 thread)", f"{one:.1f}", f"{samples_one:.0f}", "-"),
        ("N=2 (torchrun, 1 thread each)", f"{two:.1f}", f"{samples_two:.0f}", f"{100 * share:.1f}%"),
        ("  N=2 under no_sync (compute)", f"{nosync:.1f}", "-", "-"),
        ("N=1, 2 threads (reference)", f"{two_threads:.1f}", f"{samples_two_threads:.0f}", "-"),
    ]
    print(f"cnn {WIDTHS}, CIFAR-shaped, AdamW, gloo on the CPU, {args.batch} samples per rank; medians of {args.rounds} × {args.steps} steps")
    print(f"{os.cpu_count()} CPU cores, load average {load_before:.2f} before the run, {load_after:.2f} after "
          f"(the benchmark alone keeps about 2 busy; other work on the machine slows every figure, the 2-thread one most)")
    print(f"{'':31} {'step ms':>8} {'samples/s':>10} {'comm share':>11}")
    for name, step_ms, rate, comm in rows:
        print(f"{name:31} {step_ms:>8} {rate:>10} {comm:>11}")
    print(f"N=2 communication per step: {communication:.2f} ms = gradient all-reduce and waits {allreduce:.2f} ms "
          f"({info['gradient_bytes'] / 1e6:.2f} MB) + reduce_batch {reduce_batch:.2f} ms + buffer broadcast {buffers:.2f} ms")
    print(f"measured here: N=2 / N=1 samples/s = {samples_two / samples_one:.2f}× (a rank's compute is {compute / one:.2f}× the N=1 step: shared cores)")
    print("expected on devices of their own (throughput ≈ N × (1 − share(N)) × one process's; all-reduce × 2(N−1)/N):")
    for n, v in expected.items():
        print(f"  N={n}: efficiency {100 * v['efficiency']:.1f}%, {v['speedup']:.2f}× one process")
    print(f"note: {cannot}")


if __name__ == "__main__":
    main()
