#!/usr/bin/env python3
"""The indexed-dataset loader against the run it feeds, in the same run of this script:

  1. memory: `loom train` of GPT tiny on a small (2 MB) and a large (600 MB) Megatron indexed
     dataset, the same run otherwise; each process's peak RSS (getrusage of the child). Target:
     the large dataset adds < 64 MiB.
  2. time: `loom train` of GPT-2 small (gpt2-124m) on the large dataset; each step's data_time_s
     (reading its samples) over its step_time_s from metrics.jsonl. Target: < 1 %.

Usage: loader_memory.py --loom build/bin/loom [--work DIR] [--large-mb 600] [--smoke]
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time

import numpy


def write_dataset(prefix, megabytes, vocab, seed):
    """A Megatron indexed dataset of uint16 ids, documents of 50-2000 tokens, from its definition."""
    rng = numpy.random.default_rng(seed)
    tokens = megabytes * (1 << 20) // 2
    lengths = []
    while sum(lengths) < tokens:
        lengths.extend(rng.integers(50, 2000, 10000).tolist())
    lengths = numpy.array(lengths, numpy.int64)
    lengths = lengths[:numpy.searchsorted(numpy.cumsum(lengths), tokens) + 1]
    total = int(lengths.sum())
    with open(prefix + ".bin", "wb") as f:
        left = total
        while left:
            n = min(left, 1 << 24)
            f.write(rng.integers(0, vocab, n, dtype=numpy.uint16).tobytes())
            left -= n
    pointers = numpy.concatenate([[0], numpy.cumsum(lengths)[:-1] * 2]).astype(numpy.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        f.write(struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(lengths) + 1))
        f.write(lengths.astype(numpy.int32).tobytes() + pointers.tobytes())
        f.write(numpy.arange(len(lengths) + 1, dtype=numpy.int64).tobytes())
    return total


def train(loom, config, overrides, out):
    """Runs `loom train`; returns (peak RSS in bytes, metrics rows)."""
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [loom, "train", config, "run.output_dir=" + out] + overrides
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    output = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("loom train failed:\n" + output)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return usage.ru_maxrss * 1024, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--configs", default=os.path.join(os.path.dirname(__file__), "../../configs"))
    ap.add_argument("--work", default="/tmp/loom-bench-data")
    ap.add_argument("--large-mb", type=int, default=600)
    ap.add_argument("--smoke", action="store_true", help="a 8 MB large dataset, few steps")
    args = ap.parse_args()
    large_mb = 8 if args.smoke else args.large_mb
    steps = 5 if args.smoke else 30
    os.makedirs(args.work, exist_ok=True)
    small, large = os.path.join(args.work, "small"), os.path.join(args.work, f"large{large_mb}")
    t = time.time()
    write_dataset(small, 2, 256, 1)
    if not os.path.exists(large + ".idx"):
        write_dataset(large, large_mb, 256, 2)
    print(f"datasets written in {time.time() - t:.1f}s: 2 MB and {large_mb} MB (uint16 ids)")

    tiny = os.path.join(args.configs, "gpt-tiny.yaml")
    base = [f"run.steps={steps}", "data.type=indexed", "logging.every=1000"]
    rss = {}
    for name, prefix in (("2 MB", small), (f"{large_mb} MB", large)):
        rss[name], _ = train(args.loom, tiny, base + ["data.path=" + prefix],
                             os.path.join(args.work, "run-tiny"))
    added = (rss[f"{large_mb} MB"] - rss["2 MB"]) / (1 << 20)
    print(f"memory: GPT tiny, {steps} steps: peak RSS {rss['2 MB'] / (1 << 20):.1f} MiB on 2 MB, "
          f"{rss[f'{large_mb} MB'] / (1 << 20):.1f} MiB on {large_mb} MB: +{added:.1f} MiB "
          f"(target < 64 MiB) {'ok' if added < 64 else 'MISSED'}")

    # GPT-2 small reads ids below 256 of the same dataset: the loader's work does not depend on
    # the ids' values.
    gpt2 = os.path.join(args.configs, "gpt2-124m.yaml")
    _, rows = train(args.loom, gpt2,
                    ["run.steps=" + ("3" if args.smoke else "8"), "data.type=indexed",
                     "data.path=" + large, "batch.global=4", "batch.micro=2",
                     "model.args.seq=128", "logging.every=1000"],
                    os.path.join(args.work, "run-gpt2"))
    later = rows[1:]  # the first step also faults in the model's pages
    shares = [r["data_time_s"] / r["step_time_s"] for r in later]
    share = statistics.median(shares)
    print(f"time: GPT-2 small, batch 4 x seq 128: data {statistics.median(r['data_time_s'] for r in later) * 1e3:.3f} ms "
          f"of a {statistics.median(r['step_time_s'] for r in later) * 1e3:.0f} ms step: "
          f"{share * 100:.3f} % (target < 1 %) {'ok' if share < 0.01 else 'MISSED'}")


if __name__ == "__main__":
    main()
