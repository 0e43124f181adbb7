#!/usr/bin/env python3
"""loom's GPT (models/gpt.cc) trained in plain PyTorch eager, timed step by step.

The baseline of bench/vs_torch: the same model, initial weights, data and optimizer as
`loom train` with the config the driver writes, so that only the runtime differs.

  model      models/gpt.cc: token embedding + learned position embedding, pre-LN blocks
             (separate q/k/v linears with bias, causal attention by
             F.scaled_dot_product_attention (loom's CPU kernel computes the same attention in
             row blocks, runtime/causal_attention.h), output projection,
             exact-erf GELU MLP of ffn_hidden), final LN,
             LM head without bias (untied unless --tied), mean token cross-entropy.
  weights    runtime/init.cc: every parameter drawn from its own generator seeded with
             FNV-1a(name) ^ (seed * 0x9E3779B97F4A7C15); normal(0, 0.02), the residual
             projections (attn.proj, mlp.fc2) 0.02 / sqrt(2 * layers), biases 0, LN gains 1.
             The same generator and the same ATen op, so the weights equal loom's bitwise.
  data       runtime/data.cc `synthetic`: sample i is (start + stride * t) % vocab with
             start, stride from std::mt19937_64(seed * 0x9E3779B97F4A7C15 + i) (reproduced below).
             Sample i of step k is global index k * global_batch + i; under DDP rank r takes
             rows [r * global / dp, (r + 1) * global / dp) of the step's batch.
  optimizer  torch.optim.AdamW(fused=True): PyTorch 2's fused kernel, which loom runs too; betas
             (0.9, 0.95), eps 1e-8, weight decay 0.1 on tensors of >= 2 dims only (loom's
             grouping), constant lr, no clipping.

The timer of one step covers: building the batch's token/target tensors from a per-sample
(start, stride) table computed before timing (the Python mt19937_64 is slow; loom draws its
two numbers per sample inside its step), zero_grad(set_to_none=True) (loom drops its
gradients too), forward, backward (with DDP: its bucketed gradient all-reduce, overlapped with
backward), optimizer.step(), and loss.item() (loom reads its loss every step). The first
--warmup steps are not counted. Prints one parseable line:

  eager_gpt: median_step_ms=... steps=... warmup=... world=... batch_per_rank=...
"""

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# ---- runtime/init.cc ---------------------------------------------------------------------

def tensor_seed(run_seed, name):
    h = 1469598103934665603  # FNV-1a
    for c in name.encode():
        h ^= c
        h = (h * 1099511628211) & MASK64
    return h ^ ((run_seed * GOLDEN) & MASK64)


def init_normal_(tensor, run_seed, name, std):
    gen = torch.Generator()
    gen.manual_seed(tensor_seed(run_seed, name))
    with torch.no_grad():
        tensor.copy_(torch.normal(0.0, std, tuple(tensor.shape), generator=gen))


# ---- runtime/data.cc: the first two outputs of std::mt19937_64(seed) -----------------------

_MT_N, _MT_M = 312, 156
_MT_A = 0xB5026F5AA96619E9
_MT_UPPER, _MT_LOWER = MASK64 ^ ((1 << 31) - 1), (1 << 31) - 1


def _mt_temper(y):
    y ^= (y >> 29) & 0x5555555555555555
    y ^= (y << 17) & 0x71D67FFFEDA60000
    y ^= (y << 37) & 0xFFF7EEE000000000
    y ^= y >> 43
    return y & MASK64


def mt19937_64_first_two(seed):
    # Only state words 0..157 feed the first two outputs after the first twist.
    mt = [seed & MASK64]
    for i in range(1, _MT_M + 2):
        x = mt[-1]
        mt.append((6364136223846793005 * (x ^ (x >> 62)) + i) & MASK64)
    out = []
    for i in (0, 1):
        x = (mt[i] & _MT_UPPER) | (mt[i + 1] & _MT_LOWER)
        xa = x >> 1
        if x & 1:
            xa ^= _MT_A
        out.append(_mt_temper(mt[i + _MT_M] ^ xa))
    return out


def synthetic_table(run_seed, first, count, vocab):
    """(start, stride) of samples first .. first + count - 1, as int64 tensors."""
    starts, strides = [], []
    for index in range(first, first + count):
        a, b = mt19937_64_first_two((run_seed * GOLDEN + index) & MASK64)
        starts.append(a % vocab)
        strides.append(1 + b % 7)
    return torch.tensor(starts, dtype=torch.long), torch.tensor(strides, dtype=torch.long)


# ---- models/gpt.cc ------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, hidden, heads, ffn, eps):
        super().__init__()
        self.heads, self.d = heads, hidden // heads
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def attention(self, q, k, v):
        b, s, hd = q.shape
        qh, kh, vh = (x.view(b, s, self.heads, self.d).transpose(1, 2) for x in (q, k, v))
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        return out.transpose(1, 2).reshape(b, s, hd)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.proj(self.attention(self.q(h), self.k(h), self.v(h)))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, vocab, seq, ffn, eps, tied):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Parameter(torch.empty(seq, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn, eps) for _ in range(layers))
        self.lnf = nn.LayerNorm(hidden, eps=eps)
        self.lm_head = None if tied else nn.Linear(hidden, vocab, bias=False)
        self.loom_loss = False

    def loom_names(self):
        """(loom FullTensor name, parameter) of every parameter."""
        out = [("wte", self.wte.weight), ("wpe", self.wpe)]
        for l, blk in enumerate(self.blocks):
            p = "h%d." % l
            for loom, mod in (("ln1", blk.ln1), ("attn.q", blk.q), ("attn.k", blk.k),
                              ("attn.v", blk.v), ("attn.proj", blk.proj), ("ln2", blk.ln2),
                              ("mlp.fc1", blk.fc1), ("mlp.fc2", blk.fc2)):
                out += [(p + loom + ".w", mod.weight), (p + loom + ".b", mod.bias)]
        out += [("lnf.w", self.lnf.weight), ("lnf.b", self.lnf.bias)]
        if self.lm_head is not None:
            out.append(("lm_head.w", self.lm_head.weight))
        return out

    def init_like_loom(self, run_seed, std, layers):
        resid_std = std / math.sqrt(2.0 * layers)
        with torch.no_grad():
            for name, p in self.loom_names():
                if name.endswith(".b"):
                    p.zero_()
                elif name.endswith(("ln1.w", "ln2.w", "lnf.w")):
                    p.fill_(1.0)
                else:
                    resid = name.endswith(("attn.proj.w", "mlp.fc2.w"))
                    init_normal_(p, run_seed, name, resid_std if resid else std)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe
        for blk in self.blocks:
            x = blk(x)
        x = self.lnf(x)
        head = self.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, head)
        if self.loom_loss:
            return loom_loss(logits, targets)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def loom_loss(logits, targets):
    """The loss as models/gpt.cc builds it: log-sum-exp in vocabulary groups (so tp can split
    it), then over the groups, minus the target's logit, summed over the tokens' count."""
    b, s, vocab = logits.shape
    groups = 64  # the largest power of two up to 64 that divides the vocabulary
    while groups > 1 and vocab % groups:
        groups //= 2
    group_lse = torch.logsumexp(logits.view(b, s, groups, vocab // groups), -1)
    lse = torch.logsumexp(group_lse, -1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (lse - picked).sum() / (b * s)


# ---- the timed loop -----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--ffn", type=int, default=0, help="MLP width (default 4 x hidden)")
    ap.add_argument("--ln-eps", type=float, default=1e-5)
    ap.add_argument("--init-std", type=float, default=0.02)
    ap.add_argument("--tied", action="store_true", help="LM head shares the token embedding")
    ap.add_argument("--batch", type=int, default=16, help="global batch (samples per step)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps after the warm-up")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1,
                    help="DDP over gloo; the processes come from a launcher (loomrun, torchrun) "
                         "that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT")
    # Ablations: make eager do the extra work loom's step does, to see what it costs.
    ap.add_argument("--loom-loss", action="store_true",
                    help="the loss as loom computes it (vocabulary-group log-sum-exp minus the "
                         "target logit) instead of F.cross_entropy")
    ap.add_argument("--grad-norm", action="store_true",
                    help="compute the global gradient norm every step and read it with the "
                         "loss, as loom does even with clipping off")
    ap.add_argument("--print-losses", type=int, default=0,
                    help="print the first N step losses (at most --warmup; with DDP the mean "
                         "over ranks, reduced outside the timer)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    ffn = args.ffn or 4 * args.hidden
    rank, world = 0, 1
    if args.dp > 1:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_gloo_available()):
            print("eager_gpt: error: this torch has no torch.distributed with gloo", flush=True)
            return 3
        world = int(os.environ.get("WORLD_SIZE", "0"))
        if world != args.dp:
            print("eager_gpt: error: --dp %d but WORLD_SIZE=%s (start it with a launcher)"
                  % (args.dp, os.environ.get("WORLD_SIZE")), flush=True)
            return 2
        dist.init_process_group("gloo", init_method="env://")
        rank = dist.get_rank()
    if args.batch % world != 0:
        print("eager_gpt: error: batch %d not divisible by dp %d" % (args.batch, world))
        return 2
    rows = args.batch // world

    model = Gpt(args.layers, args.hidden, args.heads, args.vocab, args.seq, ffn, args.ln_eps,
                args.tied)
    model.init_like_loom(args.seed, args.init_std, args.layers)
    model.loom_loss = args.loom_loss
    params = list(model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    train = model
    if world > 1:
        train = nn.parallel.DistributedDataParallel(model)

    total = args.warmup + args.steps
    table = [synthetic_table(args.seed, k * args.batch + rank * rows, rows, args.vocab)
             for k in range(total)]
    positions = torch.arange(args.seq + 1, dtype=torch.long)

    times, losses = [], []
    for k in range(total):
        t0 = time.perf_counter()
        start, stride = table[k]
        sample = (start.unsqueeze(1) + stride.unsqueeze(1) * positions) % args.vocab
        tokens, targets = sample[:, :-1].contiguous(), sample[:, 1:].contiguous()
        opt.zero_grad(set_to_none=True)
        loss = train(tokens, targets)
        loss.backward()
        if args.grad_norm:
            norms = torch.stack(torch._foreach_norm([p.grad for p in params])).double()
            value = torch.stack([loss.detach().double(), norms.square().sum()]).tolist()[0]
        opt.step()
        if not args.grad_norm:
            value = loss.item()
        t1 = time.perf_counter()
        if world > 1 and k < min(args.print_losses, args.warmup):
            # The global batch's loss (loom reports that one), outside the timer, warm-up only.
            mean = torch.tensor([value])
            torch.distributed.all_reduce(mean)
            value = mean.item() / world
        losses.append(value)
        if k >= args.warmup:
            times.append(t1 - t0)

    if rank == 0:
        if args.print_losses:
            shown = losses[:min(args.print_losses, args.warmup)]
            print("eager_gpt: losses " + " ".join("%.6f" % v for v in shown))
        print("eager_gpt: median_step_ms=%.4f steps=%d warmup=%d world=%d batch_per_rank=%d "
              "threads=%d torch=%s params=%d loss=%s grad_norm=%s" %
              (statistics.median(times) * 1e3, len(times), args.warmup, world, rows,
               torch.get_num_threads(), torch.__version__, sum(p.numel() for p in params),
               "loom" if args.loom_loss else "cross_entropy", "yes" if args.grad_norm else "no"),
              flush=True)
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
