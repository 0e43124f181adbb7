#!/usr/bin/env python3
"""Elastic recovery and goodput: two loomrun agents of 2 ranks (dp 2 x tp 2 over gloo) on this host.

recovery: one agent (with its workers) is SIGKILLed mid-run; the survivor re-plans dp 1 x tp 2
and resumes the latest checkpoint. Printed: the time from the kill to the survivors' first step,
and where it went, from the arrival times of the survivor's lines: detection (kill -> loomrun
says the round failed; of it, the survivors' first error line), rendezvous (-> the next round starts), process start (-> loom train's
"planned in" line, less what that line reports), plan, trainer ready (ranks connected, model
built, checkpoint loaded) and the first step.

goodput: the same run of --steps steps uninterrupted, then with the second agent killed every
--kill-every seconds and brought back --back-after seconds later (--scale-up admits it at once):
the time to finish against the uninterrupted run's, and the steps computed twice.

Usage: bench/elastic/elastic.py [--build build] [--phase recovery|goodput|all] [--steps 200]
       [--kill-every 60] [--back-after 20] [--quick]
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

MODEL = """run: {seed: 1, steps: %(steps)d}
model: {type: gpt, preset: tiny, args: {layers: %(layers)d, hidden: %(hidden)d, heads: 4, vocab: 4096}}
batch: {global: 8, micro: 2}
optimizer: {type: adamw, lr: 0.0003}
comm: {timeout_s: 60}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    """One loomrun agent in its own process group; its output lines with their arrival times."""

    def __init__(self, build, args, name, work):
        self.lines = []
        self.lock = threading.Lock()
        env = dict(os.environ, LOOM_RDZV_TOKEN="bench-elastic-secret", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([os.path.join(build, "bin", "loomrun")] + args, cwd=work,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.log = open(os.path.join(work, name + ".log"), "w")
        self.readers = [threading.Thread(target=self._read, args=(s,), daemon=True)
                        for s in (self.proc.stdout, self.proc.stderr)]
        for r in self.readers:
            r.start()

    def _read(self, stream):
        for line in stream:
            with self.lock:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.log.write(line)

    def first(self, pattern, after=0.0):
        """(time, match) of the first line matching `pattern` that arrived after `after`."""
        with self.lock:
            for t, line in self.lines:
                m = re.search(pattern, line)
                if t >= after and m:
                    return t, m
        return None

    def wait_for(self, pattern, after=0.0, timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.first(pattern, after)
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        sys.exit("bench_elastic: no line matching %r (agent exit %s)" % (pattern, self.proc.poll()))

    def kill(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def wait(self, timeout):
        code = self.proc.wait(timeout=timeout)
        for r in self.readers:
            r.join(timeout=5)
        self.log.close()
        return code


def agent_args(port, cfg, out, heartbeat, restarts):
    return ["--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-endpoint", "127.0.0.1:%d" % port,
            "--rdzv-timeout", "120", "--rdzv-last-call", "1", "--heartbeat-timeout",
            str(heartbeat), "--max-restarts", str(restarts), "--scale-up",
            os.path.join(ARGS.build, "bin", "loom"), "train", cfg, "parallel.dp=2",
            "parallel.tp=2", "comm.backend=gloo", "run.output_dir=" + out, "checkpoint.every=%d"
            % ARGS.ckpt_every, "checkpoint.async=true", "checkpoint.resume=latest"]


def setup(work, name, steps):
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg = os.path.join(d, "run.yaml")
    with open(cfg, "w") as f:
        f.write(MODEL % {"steps": steps, "layers": ARGS.layers, "hidden": ARGS.hidden})
    return d, cfg


def start_pair(d, args):
    host = Agent(ARGS.build, args, "host", d)
    port = int(args[args.index("--rdzv-endpoint") + 1].split(":")[1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.02)
    return host, Agent(ARGS.build, args, "other", d)


STEP = r"step (\d+)/\d+ loss"


def recovery(work):
    d, cfg = setup(work, "recovery", ARGS.recovery_steps)
    port = free_port()
    host, other = start_pair(d, agent_args(port, cfg, os.path.join(d, "run"), ARGS.heartbeat, 1))
    host.wait_for(r"step %d/" % (ARGS.ckpt_every + 2))
    killed = time.monotonic()
    if ARGS.trace:
        print("  killed at %s" % time.strftime("%H:%M:%S", time.localtime()) +
              ".%03d" % (int(time.time() * 1000) % 1000))
    other.kill()
    noticed = host.first(r"\] loom train: rank \d+: error", killed)
    detected, _ = host.wait_for(r"round 0 failed", killed)
    noticed = noticed[0] if noticed else detected
    round1, _ = host.wait_for(r"round 1: ", killed)
    ready, m = host.wait_for(r"planned in ([0-9.]+) s, trainer ready in ([0-9.]+) s", round1)
    first, step = host.wait_for(STEP, ready)
    if host.wait(600) != 0:
        sys.exit("bench_elastic: the survivor failed; see %s/host.log" % d)
    if ARGS.trace:
        with host.lock:
            for t, line in host.lines:
                if t >= killed and t <= first:
                    print("  +%6.3f s  %s" % (t - killed, line[:150]))
    plan_s, ready_s = float(m.group(1)), float(m.group(2))
    total = first - killed
    print("recovery (gpt h%d x %d layers, 2 x 2 ranks -> 1 x 2): %.2f s from the kill to step %s "
          "on the survivors (target 15 s: %.2f of it)" % (ARGS.hidden, ARGS.layers, total,
                                                          step.group(1), total / 15.0))
    print("  detection %.2f s (the survivors' collectives fail %.2f s, their workers end and "
          "the agent ends the round %.2f s) | rendezvous %.2f s | process start %.2f s | plan "
          "%.2f s | trainer ready %.2f s (connect, build, checkpoint load) | first step %.2f s" %
          (detected - killed, noticed - killed, detected - noticed, round1 - detected,
           ready - round1 - plan_s - ready_s, plan_s, ready_s, first - ready))


def steps_run(agent):
    with agent.lock:
        return sum(1 for _, line in agent.lines if re.search(STEP, line))


def goodput(work):
    d, cfg = setup(work, "uninterrupted", ARGS.steps)
    host, other = start_pair(d, agent_args(free_port(), cfg, os.path.join(d, "run"),
                                           ARGS.heartbeat, 0))
    start = time.monotonic()
    if host.wait(3600) != 0 or other.wait(60) != 0:
        sys.exit("bench_elastic: the uninterrupted run failed; see %s" % d)
    plain = time.monotonic() - start

    d, cfg = setup(work, "interrupted", ARGS.steps)
    port = free_port()
    args = agent_args(port, cfg, os.path.join(d, "run"), ARGS.heartbeat, 1000)
    host, other = start_pair(d, args)
    start = time.monotonic()
    kills, next_kill, next_back = 0, ARGS.kill_every, None
    while host.proc.poll() is None:
        time.sleep(0.05)
        now = time.monotonic() - start
        if other is not None and now >= next_kill:
            if other.proc.poll() is None:
                other.kill()
                kills += 1
            other.wait(30)
            other, next_back, next_kill = None, now + ARGS.back_after, next_kill + ARGS.kill_every
        elif other is None and now >= next_back:
            other = Agent(ARGS.build, args, "other%d" % kills, d)
    elapsed = time.monotonic() - start
    if host.wait(60) != 0:
        sys.exit("bench_elastic: the interrupted run failed; see %s/host.log" % d)
    if other is not None:
        other.wait(120)
    computed = steps_run(host)
    rows = [json.loads(l) for l in open(os.path.join(d, "run", "metrics.jsonl"))]
    worlds = [r["world_size"] for r in rows]
    print("goodput (gpt h%d x %d layers, %d steps, an agent killed every %g s and back %g s later): "
          "%d kills, %.1f s against %.1f s uninterrupted (goodput %.2f), %d steps computed twice, "
          "%d of %d steps on 2 ranks" % (ARGS.hidden, ARGS.layers, ARGS.steps, ARGS.kill_every,
                                         ARGS.back_after, kills, elapsed, plain, plain / elapsed,
                                         computed - ARGS.steps, worlds.count(2), len(rows)))


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--phase", choices=["recovery", "goodput", "all"], default="all")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--recovery-steps", type=int, default=40)
    p.add_argument("--kill-every", type=float, default=60)
    p.add_argument("--back-after", type=float, default=20)
    p.add_argument("--heartbeat", type=int, default=5)
    p.add_argument("--ckpt-every", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--quick", action="store_true", help="smoke run: tiny model, few steps")
    p.add_argument("--trace", action="store_true",
                   help="recovery: print the survivor's lines from the kill on, with their times")
    p.add_argument("--keep", action="store_true", help="keep the runs' folders (logs) and say where")
    ARGS = p.parse_args()
    ARGS.build = os.path.abspath(ARGS.build)
    if ARGS.quick:
        ARGS.layers, ARGS.hidden, ARGS.recovery_steps = 2, 64, 12
        ARGS.steps, ARGS.kill_every, ARGS.back_after, ARGS.ckpt_every = 40, 8, 3, 2
    work = tempfile.mkdtemp(prefix="loom_bench_elastic_")
    if ARGS.phase in ("recovery", "all"):
        recovery(work)
    if ARGS.phase in ("goodput", "all"):
        goodput(work)
    if ARGS.keep:
        print("runs and agent logs kept in " + work)
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
