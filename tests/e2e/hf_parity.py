#!/usr/bin/env python3
"""loom against Hugging Face transformers, an implementation nobody here wrote.

transformers makes a random tiny model (GPT-2 with its tanh GELU; Llama with grouped-query
attention, a non-default rope_theta and rms_norm_eps, untied, and optionally Llama 3.1's rotary
frequency scaling, saved in shards) and saves it with save_pretrained. loom trains on that folder
(checkpoint.init_from, model.from_hf) under each plan: one step of SGD with lr 1 (no momentum,
weight decay or clipping), so the step's gradient is (initial - after) weights, read back through
`loom checkpoint export-hf` in transformers' own names. The first step's loss and every
parameter's gradient are compared with transformers' forward and backward on the same tokens (in
float64, so the difference is loom's float32 rounding alone). Then the checkpoint after two steps
is exported, transformers loads it with from_pretrained, and its loss on the third step's tokens
must be the loss loom reported for that step.

Besides: bad folders and configs exit 2 naming the file, tensor or key; GPT-2 saved from
GPT2Model (names without "transformer.") loads; a bfloat16 Llama folder gives transformers' loss
on the same bfloat16 weights.

Exit 0: every comparison within its tolerance; 1: a difference (each is printed); 77: skipped
(transformers or safetensors is not installed), the reason printed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

SKIP = 77

SEQ = 16        # the run's sequence length (the folder's positions are 32: loom uses fewer)
GLOBAL = 4      # samples per step
# Odd, as GPT-2's 50257: tensor parallelism cannot split it, so the tp plans pad it to 64 (the
# padded logits left out of the loss) and must still give transformers' loss and gradients.
VOCAB = 63
STEPS = 3

# Plans: name, parallel.* and batch.micro (dp x micro x micro-batches = GLOBAL).
PLANS = {
    "single": ({}, 2),
    "tp2": ({"tp": 2}, 2),
    "pp2": ({"pp": 2}, 2),
    "tp2pp2": ({"tp": 2, "pp": 2}, 2),
    "zero3": ({"dp": 2, "zero": 3}, 1),
}

# float32 against a float64 reference. The loss is a mean of 64 log-softmaxes of O(1) logits
# through two small layers: float32 rounding keeps it within ~1e-7 relative (measured at most
# 1.2e-7, also with ATen's default and AVX2 kernels); 2e-6 leaves 15x for other machines'
# reduction orders. A wrong scale, a swapped or
# transposed weight, or a shifted target moves it by 1e-2 or more.
LOSS_RTOL = 2e-6
# A gradient is (w0 - w1) with lr 1, judged per tensor as its largest element difference against
# a floor plus a share of its largest reference element (single elements may be near zero):
# - the floor: w1 is stored in float32, so the subtraction carries up to one rounding of |w|,
#   2^-24 max|w| (two allowed: the update's and the store's);
# - float32's backward: ~1e-6 of the gradient's scale for sums of at most 64 terms here; 2e-5
#   allows reduction orders that differ per plan.
# Measured: at most 0.24 of the bound (GPT-2 and Llama tiny, every plan). A missing term (a bias,
# a tied head's share, a gradient not summed over tensor-parallel ranks) or a transposed slice is
# off by O(1) of the largest element, 10^4 times the bound.
GRAD_FLOOR_ULPS = 2 * 2.0 ** -24
GRAD_RTOL = 2e-5
# The exported model's loss against loom's: the same float32 weights on both sides, loom's loss
# in float32 and transformers' in float64 (measured at most 1.2e-7): the loss's bound.
EXPORT_RTOL = LOSS_RTOL


def run(cmd, env, log):
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        with open(log) as f:
            tail = f.read()[-4000:]
        raise RuntimeError("command failed (exit %d): %s\n%s" % (proc.returncode, " ".join(cmd),
                                                                  tail))


def make_gpt2(torch, transformers, folder):
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32, n_inner=None,
        # GPT-2's tanh GELU: model.from_hf maps it to model.args.activation: gelu_tanh.
        activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def make_llama(torch, transformers, folder, scaling=False):
    rope = {"rope_type": "default", "rope_theta": 5000.0}
    if scaling:
        # original_max_position_embeddings 16 with head_dim 8 puts one frequency in the smoothed
        # band and three in the scaled one: every branch of Llama 3.1's rule. Dropping the
        # scaling moves this model's loss by 33 times LOSS_RTOL and the k_proj gradients by 5e4
        # times their bound.
        rope = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16}
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, vocab_size=VOCAB, max_position_embeddings=32,
        rms_norm_eps=3e-5, rope_parameters=rope, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, hidden_act="silu", bos_token_id=0,
        eos_token_id=0, pad_token_id=None)
    return transformers.LlamaForCausalLM(config)


def samples(tokens, first, count):
    """loom's tokens data: sample i is the window tokens[i seq : i seq + seq + 1]; its inputs
    are the first seq tokens and its targets the last seq (runtime/data.cc)."""
    windows = (len(tokens) - 1) // SEQ
    inputs, targets = [], []
    for i in range(first, first + count):
        o = (i % windows) * SEQ
        inputs.append(tokens[o:o + SEQ])
        targets.append(tokens[o + 1:o + SEQ + 1])
    return inputs, targets


def hf_loss(torch, model, inputs, targets):
    """loom's loss: the mean over every (sample, position) of the cross-entropy against the next
    token. Computed here from transformers' logits rather than with labels=, whose internal
    shift would drop each window's last position."""
    ids = torch.tensor(inputs, dtype=torch.long)
    tgt = torch.tensor(targets, dtype=torch.long)
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).to(torch.float64),
                                             tgt.reshape(-1))


def loom_config(work, name, folder, tokens_path, model_type, parallel, micro):
    out = os.path.join(work, name)
    lines = [
        "run: {name: hf_%s, output_dir: %s, seed: 7, steps: %d}" % (name, out, STEPS),
        "model:",
        "  type: %s" % model_type,
        "  from_hf: %s" % folder,
        "  args: {seq: %d}" % SEQ,
        "parallel: {%s}" % ", ".join("%s: %s" % kv for kv in parallel.items()),
        "batch: {global: %d, micro: %d}" % (GLOBAL, micro),
        "optimizer: {type: sgd, lr: 1.0, momentum: 0.0, weight_decay: 0.0, clip_grad_norm: 0.0}",
        "data: {type: tokens, path: %s}" % tokens_path,
        "checkpoint: {init_from: %s, every: 1, keep: %d, dir: %s}" % (folder, STEPS + 1,
                                                                    os.path.join(out, "ckpt")),
    ]
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path, out


def losses(run_dir):
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            out[row["step"]] = row["loss"]
    return out


def grad_ratio(g_loom, g_ref, w0):
    """The largest difference over its bound (<= 1 passes), see GRAD_RTOL."""
    bound = GRAD_FLOOR_ULPS * w0.abs().max().item() + GRAD_RTOL * g_ref.abs().max().item()
    return (g_loom - g_ref).abs().max().item() / max(bound, 1e-30)


def expect_bad_input(cmd, env, needles, what, failures):
    """A refused input: exit 2 with one message naming what is wrong."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    text = proc.stdout + proc.stderr
    missing = [n for n in needles if n not in text]
    ok = proc.returncode == 2 and not missing
    detail = "" if ok else " FAIL (wanted 2 naming %s)\n%s" % (missing, text)
    print("error   %s: exit %d%s" % (what, proc.returncode, detail))
    if not ok:
        failures.append("error case: " + what)


def check_errors(args, env, folder, tokens_path, model_type, failures):
    """Bad folders and configs are refused naming the file, tensor or key, exit 2."""
    from safetensors.torch import load_file, save_file
    cfg, _ = loom_config(args.work, "errors", folder, tokens_path, model_type, {}, 2)
    train = [args.loom, "train", cfg]
    missing = os.path.join(args.work, "no_such_folder")
    expect_bad_input(train + ["checkpoint.init_from=" + missing, "model.from_hf=" + folder], env,
                     [missing], "init_from names no folder", failures)
    # A folder whose weights lack a tensor the map needs, and one with a tensor of another shape.
    weights = load_file(os.path.join(folder, "model.safetensors"))
    victim = sorted(k for k in weights if k.endswith("weight") and weights[k].dim() == 2)[0]
    for what, edit in (("missing tensor", lambda w: w.pop(victim)),
                       ("tensor of another shape",
                        lambda w: w.__setitem__(victim, w[victim][:, :-1].contiguous()))):
        broken = os.path.join(args.work, "broken_" + what.replace(" ", "_"))
        shutil.copytree(folder, broken)
        w = dict(weights)
        edit(w)
        save_file(w, os.path.join(broken, "model.safetensors"), metadata={"format": "pt"})
        expect_bad_input(train + ["checkpoint.init_from=" + broken], env,
                         [victim, broken], what, failures)
    bad_json = os.path.join(args.work, "broken_json")
    shutil.copytree(folder, bad_json)
    with open(os.path.join(bad_json, "config.json"), "w") as f:
        f.write("{ not json")
    expect_bad_input(train + ["model.from_hf=" + bad_json], env,
                     [os.path.join(bad_json, "config.json")], "config.json not JSON", failures)
    # An explicit model.args value the folder's config.json contradicts.
    expect_bad_input(train + ["model.args.layers=5"], env,
                     ["model.args.layers", "5", "config.json"], "model.args against config.json",
                     failures)
    # checkpoint.init_from without model.from_hf: a run whose model.args (or preset) disagree
    # with the folder's config.json is refused naming both values, not loaded into another model
    # (more layers would load in part; another norm epsilon would train a different model).
    dims = {"gpt": "layers=2 hidden=32 heads=4 vocab=%d activation=gelu_tanh" % VOCAB,
            "llama": "layers=2 hidden=32 heads=4 kv_heads=2 ffn_hidden=48 vocab=%d norm_eps=3e-5 "
                     "rope_theta=5000 rope_factor=0" % VOCAB}[model_type]
    config_json = os.path.join(folder, "config.json")
    layers = {"gpt": "n_layer 2", "llama": "num_hidden_layers 2"}[model_type]
    no_hf = train + ["model.from_hf="]
    expect_bad_input(no_hf + ["model.args." + d for d in dims.replace("layers=2", "layers=1").split()],
                     env, [config_json, layers, "model.args.layers is 1", "model.from_hf"],
                     "init_from with fewer layers than its config.json", failures)
    # The preset's epsilon (1e-5) against the folder's: the silent difference.
    eps = {"gpt": ("ln_eps", "layer_norm_epsilon 1e-05", "1e-4"),
           "llama": ("norm_eps", "rms_norm_eps 3e-05", "1e-5")}[model_type]
    other = [d for d in dims.split() if not d.startswith(eps[0] + "=")] + [eps[0] + "=" + eps[2]]
    expect_bad_input(no_hf + ["model.args." + d for d in other], env,
                     [config_json, eps[1], "model.args." + eps[0], "model.from_hf"],
                     "init_from with another norm epsilon than its config.json", failures)
    out = os.path.join(args.work, "single_export_1")  # exists: written by the single plan
    expect_bad_input([args.loom, "checkpoint", "export-hf",
                      os.path.join(args.work, "single", "ckpt", "step_%08d" % 1), out], env,
                     [out], "export-hf over an existing folder", failures)


def check_bf16_folder(args, env, model, tokens, tokens_path, model_type, failures):
    """Released Llama checkpoints are bfloat16: loom reads them into float32 exactly, so its
    first loss is transformers' on the same bfloat16 weights (upcast), within the loss's bound."""
    import torch
    folder = os.path.join(args.work, "hf_bf16")
    model.to(torch.bfloat16).save_pretrained(folder)
    model.to(torch.float32)
    ref = model.__class__.from_pretrained(folder, dtype=torch.float64)
    ref.eval()
    inputs, targets = samples(tokens, 0, GLOBAL)
    with torch.no_grad():
        want = hf_loss(torch, ref, inputs, targets).item()
    cfg, run_dir = loom_config(args.work, "bf16", folder, tokens_path, model_type, {}, 2)
    run([args.loom, "train", cfg, "run.steps=1", "checkpoint.every=0"], env,
        os.path.join(args.work, "bf16.log"))
    got = losses(run_dir)[1]
    rel = abs(got - want) / abs(want)
    ok = rel <= LOSS_RTOL
    print("bf16    folder: loom %.8f transformers %.8f rel %.1e (bound %.0e) %s" %
          (got, want, rel, LOSS_RTOL, "ok" if ok else "FAIL"))
    if not ok:
        failures.append("bf16 folder: loss")


def check_own_head(args, env, model, tokens, tokens_path, failures):
    """A folder whose config.json ties the head (GPT-2's default) but which holds its own
    lm_head.weight, unlike the embedding: transformers then unties them and uses the file's head.
    loom refuses it under a tied model naming model.args.tied=false, and with that setting its
    first loss is transformers' on the folder."""
    import torch
    from safetensors.torch import load_file, save_file
    folder = os.path.join(args.work, "hf_own_head")
    model.save_pretrained(folder)
    weights = load_file(os.path.join(folder, "model.safetensors"))
    g = torch.Generator().manual_seed(2)
    wte = weights["transformer.wte.weight"]
    weights["lm_head.weight"] = wte + 0.05 * torch.randn(wte.shape, generator=g)
    save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    ref = model.__class__.from_pretrained(folder, dtype=torch.float64)
    ref.eval()
    if torch.equal(ref.lm_head.weight, ref.transformer.wte.weight):
        print("own head: transformers %s ties the file's head; nothing to compare" %
              __import__("transformers").__version__)
        return
    inputs, targets = samples(tokens, 0, GLOBAL)
    with torch.no_grad():
        want = hf_loss(torch, ref, inputs, targets).item()
    cfg, run_dir = loom_config(args.work, "own_head", folder, tokens_path, "gpt", {}, 2)
    train = [args.loom, "train", cfg, "run.steps=1", "checkpoint.every=0"]
    expect_bad_input(train, env, ["lm_head.weight", folder, "model.args.tied=false"],
                     "tied folder with its own head", failures)
    run(train + ["model.args.tied=false"], env, os.path.join(args.work, "own_head.log"))
    got = losses(run_dir)[1]
    rel = abs(got - want) / abs(want)
    ok = rel <= LOSS_RTOL
    print("own     head (model.args.tied=false): loom %.8f transformers %.8f rel %.1e "
          "(bound %.0e) %s" % (got, want, rel, LOSS_RTOL, "ok" if ok else "FAIL"))
    if not ok:
        failures.append("own head: loss")


def check_export_keeps_import(name, exported, folder, initial, failures):
    """What the run imported and never changed is exported as the folder had it: the token ids
    of its config.json, GPT-2's position table past the run's SEQ positions (and n_positions)."""
    from safetensors.torch import load_file
    with open(os.path.join(folder, "config.json")) as f:
        want = json.load(f)
    with open(os.path.join(exported, "config.json")) as f:
        got = json.load(f)
    bad = ["%s %s (folder %s)" % (k, got.get(k), want[k])
           for k in ("bos_token_id", "eos_token_id", "n_positions", "max_position_embeddings")
           if k in want and got.get(k) != want[k]]
    if "transformer.wpe.weight" in initial:
        wpe = load_file(os.path.join(exported, "model.safetensors"))["transformer.wpe.weight"]
        full = initial["transformer.wpe.weight"]
        # Never held by the run, so exactly the folder's float32 values.
        if wpe.shape != full.shape or not wpe[SEQ:].double().equal(full[SEQ:]):
            bad.append("wpe %s past row %d differs from the folder's %s" %
                       (list(wpe.shape), SEQ, list(full.shape)))
    print("%-7s export keeps the import: %s" % (name, "; ".join(bad) + " FAIL" if bad else "ok"))
    if bad:
        failures.append("%s: export drops what was imported" % name)


def check_base_model_names(args, env, model, ref_loss, tokens_path, failures):
    """openai-community/gpt2 is saved from GPT2Model: its names lack "transformer.". loom reads
    such a folder as transformers does, to the same first loss."""
    folder = os.path.join(args.work, "hf_base")
    model.transformer.save_pretrained(folder)
    cfg, run_dir = loom_config(args.work, "base_names", folder, tokens_path, "gpt", {}, 2)
    run([args.loom, "train", cfg, "run.steps=1", "checkpoint.every=0"], env,
        os.path.join(args.work, "base_names.log"))
    got = losses(run_dir)[1]
    rel = abs(got - ref_loss) / abs(ref_loss)
    ok = rel <= LOSS_RTOL
    print("base    model names: loom %.8f transformers %.8f rel %.1e (bound %.0e) %s" %
          (got, ref_loss, rel, LOSS_RTOL, "ok" if ok else "FAIL"))
    if not ok:
        failures.append("base model names: loss")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["gpt2", "llama", "llama-rope-scaling"], required=True)
    ap.add_argument("--loom", required=True)
    ap.add_argument("--loomrun", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--plans", default=",".join(PLANS))
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from safetensors.torch import load_file
    except ImportError as e:
        print("SKIP: the Hugging Face parity test needs transformers and safetensors in the torch "
              "environment (scripts/install-deps installs them): %s" % e)
        return SKIP

    torch.manual_seed(0)
    torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    folder = os.path.join(args.work, "hf")
    make = {"gpt2": make_gpt2, "llama": make_llama,
            "llama-rope-scaling": lambda *a: make_llama(*a, scaling=True)}[args.model]
    model = make(torch, transformers, folder)
    # Biases start at zero and norms at one in transformers' init: perturb every parameter so a
    # bias or norm read from the wrong place cannot hide.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # The scaled Llama is saved in shards (model.safetensors.index.json), as large checkpoints are.
    sharded = args.model == "llama-rope-scaling"
    model.save_pretrained(folder, **({"max_shard_size": "20KB"} if sharded else {}))
    if sharded:
        assert os.path.exists(os.path.join(folder, "model.safetensors.index.json"))
    model_type = "gpt" if args.model == "gpt2" else "llama"

    g = torch.Generator().manual_seed(1)
    count = GLOBAL * (STEPS + 1) * SEQ + 1
    tokens = torch.randint(0, VOCAB, (count,), generator=g).tolist()
    tokens_path = os.path.join(args.work, "tokens.bin")
    import array
    with open(tokens_path, "wb") as f:
        array.array("H", tokens).tofile(f)

    # The reference: transformers' loss and gradients of the first step, in float64.
    ref = model.__class__.from_pretrained(folder, dtype=torch.float64)
    ref.eval()  # no dropout (all are 0 anyway)
    inputs, targets = samples(tokens, 0, GLOBAL)
    loss = hf_loss(torch, ref, inputs, targets)
    loss.backward()
    ref_loss = loss.item()
    initial, grads = {}, {}  # the saved float32 weights, exactly, in float64
    for name, p in ref.named_parameters():
        initial[name] = p.detach().clone()
        grads[name] = p.grad.detach().clone()
    # A tied head is one parameter in transformers (the embedding); its file has no lm_head.
    print("transformers %s: loss %.8f, %d parameters" % (transformers.__version__, ref_loss,
                                                        len(grads)))

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    failures = []
    for name in args.plans.split(","):
        parallel, micro = PLANS[name]
        cfg, run_dir = loom_config(args.work, name, folder, tokens_path, model_type, parallel,
                                   micro)
        ranks = parallel.get("dp", 1) * parallel.get("tp", 1) * parallel.get("pp", 1)
        cmd = [args.loom, "train", cfg]
        if ranks > 1:
            cmd = [args.loomrun, "--standalone", "--nproc-per-node", str(ranks)] + cmd
        run(cmd, env, os.path.join(args.work, name + ".log"))
        step_loss = losses(run_dir)
        ckpt = os.path.join(run_dir, "ckpt")
        exported = {}
        for step in (1, 2):
            out = os.path.join(args.work, "%s_export_%d" % (name, step))
            run([args.loom, "checkpoint", "export-hf", os.path.join(ckpt, "step_%08d" % step), out],
                env, out + ".log")
            exported[step] = out

        # 1. The first step's loss and every gradient.
        rel = abs(step_loss[1] - ref_loss) / abs(ref_loss)
        ok = rel <= LOSS_RTOL
        print("%-7s step 1 loss loom %.8f transformers %.8f rel %.1e (bound %.0e) %s" %
              (name, step_loss[1], ref_loss, rel, LOSS_RTOL, "ok" if ok else "FAIL"))
        if not ok:
            failures.append("%s: loss" % name)
        after = load_file(os.path.join(exported[1], "model.safetensors"))
        worst = (0.0, "")
        for hf_name, grad in grads.items():
            if hf_name not in after:
                failures.append("%s: %s missing from the export" % (name, hf_name))
                continue
            w1 = after[hf_name].to(torch.float64)
            w0 = initial[hf_name]
            g_loom = w0 - w1
            g_ref = grad
            r = grad_ratio(g_loom, g_ref, w0)
            worst = max(worst, (r, hf_name))
            if r > 1:
                failures.append("%s: gradient of %s off by %.1f times its bound" %
                                (name, hf_name, r))
                print("%-7s gradient %s: %.2f of its bound FAIL" % (name, hf_name, r))
        print("%-7s %d gradients, worst %s at %.2f of its bound" %
              (name, len(grads), worst[1], worst[0]))
        check_export_keeps_import(name, exported[1], folder, initial, failures)

        # 2. The model exported after two steps, loaded by transformers, gives loom's third loss.
        model2 = model.__class__.from_pretrained(exported[2], dtype=torch.float64)
        model2.eval()
        with torch.no_grad():
            inputs, targets = samples(tokens, 2 * GLOBAL, GLOBAL)
            l3 = hf_loss(torch, model2, inputs, targets).item()
        rel = abs(step_loss[3] - l3) / abs(l3)
        ok = rel <= EXPORT_RTOL
        print("%-7s export after step 2: transformers loss %.8f, loom step 3 %.8f rel %.1e "
              "(bound %.0e) %s" % (name, l3, step_loss[3], rel, EXPORT_RTOL,
                                   "ok" if ok else "FAIL"))
        if not ok:
            failures.append("%s: exported model's loss" % name)
    if "single" in args.plans.split(",") and not sharded:
        check_errors(args, env, folder, tokens_path, model_type, failures)
    if args.model == "gpt2":
        check_base_model_names(args, env, model, ref_loss, tokens_path, failures)
        check_own_head(args, env, model, tokens, tokens_path, failures)
    if args.model == "llama":
        check_bf16_folder(args, env, model, tokens, tokens_path, model_type, failures)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("all plans agree with transformers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
