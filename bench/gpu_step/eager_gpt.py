#!/usr/bin/env python3
"""PyTorch eager baseline of bench/gpu_step: loom's GPT (models/gpt.cc) written as plain torch.nn.

The same model as loom's graph builder: token embedding plus a learned position embedding,
pre-LN blocks with biases (separate q, k, v and output projections, causal scaled dot-product
attention, an erf-GELU MLP of ffn = 4 x hidden), a final LayerNorm and an LM head without bias,
tied to the token embedding unless --tied 0; init normal(0.02), the projections that write into
the residual stream normal(0.02 / sqrt(2 * layers)), biases zero, LayerNorm scales one;
cross-entropy over the vocabulary. Trained as loom's run.precision=bf16: float32 master
parameters under torch.autocast(bfloat16), AdamW (fused) with weight decay on matrices only.

With --compile MODE the model runs under torch.compile (mode "default" or one of its modes, e.g.
max-autotune-no-cudagraphs); the warm-up steps include the compilation, whose time is printed.

Prints one line the C++ bench parses:
  eager tokens_per_s=<x> step_s=<median step, s> peak_mem_bytes=<max_memory_allocated> params=<n>
"""
import argparse
import math
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro", type=int, default=8, help="sequences per step")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--tied", type=int, choices=(0, 1), default=1,
                   help="1: the LM head is the token embedding (loom's presets); 0: its own matrix")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--compile", default="", metavar="MODE",
                   help="torch.compile the model: default, or a mode such as "
                        "max-autotune-no-cudagraphs (empty: eager)")
    return p.parse_args()


def build(args, torch):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h, f = args.hidden, 4 * args.hidden
            self.ln1 = nn.LayerNorm(h, eps=1e-5)
            self.q = nn.Linear(h, h)
            self.k = nn.Linear(h, h)
            self.v = nn.Linear(h, h)
            self.proj = nn.Linear(h, h)
            self.ln2 = nn.LayerNorm(h, eps=1e-5)
            self.fc1 = nn.Linear(h, f)
            self.fc2 = nn.Linear(f, h)

        def forward(self, x):
            b, s, h = x.shape
            d = h // args.heads

            def heads(t):
                return t.view(b, s, args.heads, d).transpose(1, 2)

            y = self.ln1(x)
            a = F.scaled_dot_product_attention(heads(self.q(y)), heads(self.k(y)),
                                               heads(self.v(y)), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
            y = F.gelu(self.fc1(self.ln2(x)), approximate="none")
            return x + self.fc2(y)

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(args.vocab, args.hidden)
            self.wpe = nn.Parameter(torch.empty(args.seq, args.hidden))
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.lnf = nn.LayerNorm(args.hidden, eps=1e-5)
            self.head = None if args.tied else nn.Linear(args.hidden, args.vocab, bias=False)
            std, resid_std = 0.02, 0.02 / math.sqrt(2.0 * args.layers)
            for name, p in self.named_parameters():
                if p.dim() < 2:
                    continue  # biases stay zero, LayerNorm scales one (their defaults)
                resid = name.endswith("proj.weight") or name.endswith("fc2.weight")
                nn.init.normal_(p, 0.0, resid_std if resid else std)
            for m in self.modules():
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

        def forward(self, tokens, targets):
            x = self.wte(tokens) + self.wpe
            for block in self.blocks:
                x = block(x)
            x = self.lnf(x)
            logits = F.linear(x, self.wte.weight if self.head is None else self.head.weight)
            # Under autocast cross_entropy runs in float32 (log-sum-exp over the vocabulary).
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    return Gpt()


def main():
    args = parse_args()
    try:
        import torch
    except ImportError as e:
        print("eager: cannot import torch: %s" % e, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("eager: torch %s sees no CUDA device" % torch.__version__, file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    model = build(args, torch).to(dev)
    run = model
    if args.compile:
        run = torch.compile(model, mode=None if args.compile == "default" else args.compile)
    # Weight decay on matrices (embeddings included), not on biases and norm scales: as loom.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    def step():
        batch = torch.randint(0, args.vocab, (args.micro, args.seq + 1), device=dev)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt.step()

    times = []
    t_start = time.perf_counter()
    for i in range(args.warmup + args.steps):
        if i == args.warmup and args.compile:
            print("eager: torch.compile %s: the warm-up steps (compilation included) took %.1f s" %
                  (args.compile, time.perf_counter() - t_start), flush=True)
        if i == args.warmup:
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    params = sum(p.numel() for p in model.parameters())
    print("eager: torch %s on %s%s" % (torch.__version__, torch.cuda.get_device_name(),
                                        ", torch.compile " + args.compile if args.compile else ""))
    print("eager tokens_per_s=%.1f step_s=%.6f peak_mem_bytes=%d params=%d" %
          (args.micro * args.seq / step_s, step_s, torch.cuda.max_memory_allocated(), params))
    return 0


if __name__ == "__main__":
    sys.exit(main())
