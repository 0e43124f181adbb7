#!/usr/bin/env python3
"""ZB-H1 against 1F1B, pp2 on two processes (loomrun + loom train over gloo), same run.

Rounds alternate the two schedules (and a one-process run of the same model and batch); each
round prints the step-time ratio zb-h1 / 1f1b, and the end prints the medians and the measured
bubble of each schedule next to the simulator's.

Measured bubble: 1 - (a rank's compute per step) / (step time). A rank's compute is derived from
the one-process run of the whole model (same micro-batches, one thread, as each pipeline rank
runs): half of its step time, the two stages being about equal. So the bubble counts what a rank
does not compute: idle time and its communication.

Usage: bench/zero_bubble/zero_bubble.py [--rounds 4] [--steps 12] [--build build]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODEL = """run: {seed: 1, steps: %(steps)d, output_dir: %(out)s}
model: {type: gpt, preset: tiny, args: {layers: 4, hidden: 256, heads: 4, seq: 128, vocab: 4096}}
batch: {global: %(micro_batches)d, micro: 1}
optimizer: {type: adamw, lr: 0.0003}
logging: {every: 1000}
comm: {timeout_s: 120}
"""
SKIP = 2  # first steps left out of the median (allocator and gloo warm-up)


def run(build, out, steps, micro_batches, overrides, nproc):
    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(out, "bench.yaml")
    with open(cfg, "w") as f:
        f.write(MODEL % {"steps": steps, "out": out, "micro_batches": micro_batches})
    loom = os.path.join(build, "bin", "loom")
    cmd = [loom, "train", cfg] + overrides
    if nproc > 1:
        cmd = [os.path.join(build, "bin", "loomrun"), "--standalone", "--nproc-per-node",
               str(nproc)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        times = [json.loads(line)["step_time_s"] for line in f if line.strip()]
    return statistics.median(times[SKIP:])


def simulated_bubble(build, kind, pp, m):
    out = subprocess.run([os.path.join(build, "bin", "loom"), "schedule", "--kind", kind,
                          "--stages", str(pp), "--micro-batches", str(m), "--fwd", "1",
                          "--bwd", "1" if kind == "zb-h1" else "2", "--wgrad", "1", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["bubble_ratio"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="zero_bubble.")
    times = {"1f1b": [], "zb-h1": [], "one": []}
    for r in range(a.rounds):
        # Alternate which schedule goes first, so drift on the shared machine hits both alike.
        order = ["1f1b", "zb-h1"] if r % 2 == 0 else ["zb-h1", "1f1b"]
        for s in order:
            times[s].append(run(a.build, os.path.join(tmp, "%s.%d" % (s, r)), a.steps,
                                a.micro_batches, ["parallel.pp=2", "parallel.schedule=" + s], 2))
        times["one"].append(run(a.build, os.path.join(tmp, "one.%d" % r), a.steps,
                                a.micro_batches, [], 1))
        print("round %d: 1f1b %.1f ms  zb-h1 %.1f ms  ratio zb-h1/1f1b %.3f  one process %.1f ms"
              % (r, times["1f1b"][-1] * 1e3, times["zb-h1"][-1] * 1e3,
                 times["zb-h1"][-1] / times["1f1b"][-1], times["one"][-1] * 1e3), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [z / o for z, o in zip(times["zb-h1"], times["1f1b"])]
    print("median step: 1f1b %.1f ms, zb-h1 %.1f ms, one process %.1f ms; median ratio %.3f"
          % (med["1f1b"] * 1e3, med["zb-h1"] * 1e3, med["one"] * 1e3, statistics.median(ratios)))
    compute = med["one"] / 2
    for s in ("1f1b", "zb-h1"):
        print("%s: measured bubble %.3f (1 - %.1f ms compute / %.1f ms step); simulator %.3f"
              % (s, 1 - compute / med[s], compute * 1e3, med[s] * 1e3,
                 simulated_bubble(a.build, s, 2, a.micro_batches)))


if __name__ == "__main__":
    sys.exit(main())
