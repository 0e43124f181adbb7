#!/usr/bin/env python3
"""ZB-H1 against 1F1B, pp2 on two processes (loomrun + loom train over gloo), same run.

Rounds alternate the two schedules (which one goes first swaps every round); each round prints
the step-time ratio zb-h1 / 1f1b and each schedule's measured bubble, and the end prints the
medians next to the plan's and the simulator's bubble.

Measured bubble: every step after the warm-up is traced (logging.trace_steps), and each
trace_step_N.json carries the step's bubble ratio: the share of the makespan a rank does not
compute (outside its blocks, or inside one waiting in a receive or a collective), averaged over
the ranks. The plan's figure is what the trainer prints next to it (the plan's simulated schedule
at its estimated stage costs, on the cpu cost model); the simulator's is `loom schedule` at
F = 1, B = 2 (1f1b) and F = I = W = 1 (zb-h1).

Usage: bench/zero_bubble/zero_bubble.py [--rounds 4] [--steps 12] [--vocab 4096] [--build build]
       [--quick]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

MODEL = """run: {seed: 1, steps: %(steps)d, output_dir: %(out)s}
model: {type: gpt, preset: tiny, args: {layers: 4, hidden: 256, heads: 4, seq: %(seq)d, vocab: %(vocab)d}}
batch: {global: %(micro_batches)d, micro: 1}
optimizer: {type: adamw, lr: 0.0003}
logging: {every: 1000, trace_steps: %(traced)s}
comm: {timeout_s: 120}
cost: {preset: cpu}
"""
SKIP = 2  # first steps left out of the medians (allocator and gloo warm-up)
PLAN_BUBBLE = re.compile(r"bubble [0-9.]+% \(plan ([0-9.]+)%\)")


def run(build, out, steps, micro_batches, seq, vocab, schedule):
    """Median step time (s), median measured bubble, the plan's bubble."""
    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(out, "bench.yaml")
    traced = list(range(SKIP + 1, steps + 1))
    with open(cfg, "w") as f:
        f.write(MODEL % {"steps": steps, "out": out, "micro_batches": micro_batches, "seq": seq,
                         "vocab": vocab, "traced": json.dumps(traced)})
    cmd = [os.path.join(build, "bin", "loomrun"), "--standalone", "--nproc-per-node", "2",
           os.path.join(build, "bin", "loom"), "train", cfg, "parallel.pp=2",
           "parallel.schedule=" + schedule]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        times = [json.loads(line)["step_time_s"] for line in f if line.strip()]
    bubbles = []
    for step in traced:
        with open(os.path.join(out, "trace_step_%d.json" % step)) as f:
            bubbles.append(json.load(f)["otherData"]["bubble_ratio"])
    planned = PLAN_BUBBLE.search(done.stdout + done.stderr)
    if not planned:
        sys.exit("no trace summary line in the output of " + " ".join(cmd))
    return statistics.median(times[SKIP:]), statistics.median(bubbles), float(planned[1]) / 100


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
    ap.add_argument("--seq", type=int, default=128)
    # The head (hidden x vocab) runs on the last stage: 4096 leaves it the longer stage, 512
    # about evens the two, which is where the simulator's equal-block figures apply.
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--build", default="build")
    ap.add_argument("--quick", action="store_true", help="one short round (the suite's smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.steps, a.seq = 1, SKIP + 2, 32
    tmp = tempfile.mkdtemp(prefix="zero_bubble.")
    schedules = ("1f1b", "zb-h1")
    times = {s: [] for s in schedules}
    bubbles = {s: [] for s in schedules}
    planned = {}
    for r in range(a.rounds):
        # Alternate which schedule goes first, so drift on the shared machine hits both alike.
        for s in schedules if r % 2 == 0 else reversed(schedules):
            t, b, planned[s] = run(a.build, os.path.join(tmp, "%s.%d" % (s, r)), a.steps,
                                   a.micro_batches, a.seq, a.vocab, s)
            times[s].append(t)
            bubbles[s].append(b)
        print("round %d: 1f1b %.1f ms (bubble %.3f)  zb-h1 %.1f ms (bubble %.3f)  "
              "ratio zb-h1/1f1b %.3f" % (r, times["1f1b"][-1] * 1e3, bubbles["1f1b"][-1],
                                         times["zb-h1"][-1] * 1e3, bubbles["zb-h1"][-1],
                                         times["zb-h1"][-1] / times["1f1b"][-1]), flush=True)
    ratios = [z / o for z, o in zip(times["zb-h1"], times["1f1b"])]
    print("median step: 1f1b %.1f ms, zb-h1 %.1f ms; median ratio zb-h1/1f1b %.3f"
          % (statistics.median(times["1f1b"]) * 1e3, statistics.median(times["zb-h1"]) * 1e3,
             statistics.median(ratios)))
    for s in schedules:
        print("%s: measured bubble %.3f (rounds %s); plan %.3f; simulator at equal F, I, W %.3f"
              % (s, statistics.median(bubbles[s]), ", ".join("%.3f" % b for b in bubbles[s]),
                 planned[s], simulated_bubble(a.build, s, 2, a.micro_batches)))


if __name__ == "__main__":
    sys.exit(main())
