#!/usr/bin/env python3
"""A linear layer's three matrix products on MKL (what at::linear and eager's nn.Linear run on
the CPU) against LibTorch's oneDNN matrix multiply (mkldnn::_linear_pointwise, what loom's
runtime/linear.h runs for float32 products of 2^24 multiply-adds or more), one thread, at the
shapes of bench/vs_torch's cases. Prints the time of each and oneDNN / MKL.

    $(scripts/torch-env python) bench/vs_torch/linear_products.py [--repeats 5]
"""
import argparse
import time

import torch

# (rows, in, out, per step): case 1 (2 layers, h64, 512 tokens), case 2 (4 layers, h256, 1024
# tokens, vocabulary 4096), case 3 (gpt2-124m, 512 tokens, vocabulary 50304).
SHAPES = [
    ("case 1 q/k/v/proj", 512, 64, 64, 8), ("case 1 fc1", 512, 64, 256, 2),
    ("case 1 fc2", 512, 256, 64, 2), ("case 1 head", 512, 64, 256, 1),
    ("case 2 q/k/v/proj", 1024, 256, 256, 16), ("case 2 fc1", 1024, 256, 1024, 4),
    ("case 2 fc2", 1024, 1024, 256, 4), ("case 2 head", 1024, 256, 4096, 1),
    ("case 3 q/k/v/proj", 512, 768, 768, 48), ("case 3 fc1", 512, 768, 3072, 12),
    ("case 3 fc2", 512, 3072, 768, 12), ("case 3 head", 512, 768, 50304, 1),
]


def best_of(fn, repeats, flops):
    calls = max(3, int(2e9 / flops))  # about 20 ms of products per timing at 100 GFLOP/s
    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    opts = ap.parse_args()
    torch.set_num_threads(1)
    onednn = torch.ops.mkldnn._linear_pointwise
    print("| product | rows x in x out | forward MKL | oneDNN | ratio | input grad MKL | oneDNN | "
          "ratio | weight grad MKL | oneDNN | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    totals = {}
    for name, rows, n_in, n_out, count in SHAPES:
        x, w, b = torch.randn(rows, n_in), torch.randn(n_out, n_in), torch.randn(n_out)
        g = torch.randn(rows, n_out)
        flops = 2 * rows * n_in * n_out
        times = [
            best_of(lambda: torch.addmm(b, x, w.t()), opts.repeats, flops),
            best_of(lambda: onednn(x, w, b, "none", [], ""), opts.repeats, flops),
            best_of(lambda: g.mm(w), opts.repeats, flops),
            best_of(lambda: onednn(g, w.t(), None, "none", [], ""), opts.repeats, flops),
            best_of(lambda: g.t().mm(x), opts.repeats, flops),
            best_of(lambda: onednn(g.t(), x.t(), None, "none", [], ""), opts.repeats, flops),
        ]
        # What one step runs: eager all three on MKL; loom the forward and the input gradient
        # on oneDNN from 2^24 multiply-adds (runtime/linear.cc), the weight gradient on MKL.
        on_onednn = rows * n_in * n_out >= 1 << 24
        loom = (times[1] + times[3] if on_onednn else times[0] + times[2]) + times[4]
        acc = totals.setdefault(name.split()[1], [0.0, 0.0])
        acc[0] += (times[0] + times[2] + times[4]) * count
        acc[1] += loom * count
        cells = []
        for k in (0, 2, 4):
            cells += ["%.3f ms" % (times[k] * 1e3), "%.3f ms" % (times[k + 1] * 1e3),
                      "%.2f" % (times[k + 1] / times[k])]
        print("| %s | %d x %d x %d | %s |" % (name, rows, n_in, n_out, " | ".join(cells)),
              flush=True)
    for case, (mkl, loom) in totals.items():
        print("case %s, one step's linear products: all on MKL %.1f ms, as loom runs them %.1f ms, "
              "loom / MKL %.3f" % (case, mkl * 1e3, loom * 1e3, loom / mkl))


if __name__ == "__main__":
    main()
