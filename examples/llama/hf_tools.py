#!/usr/bin/env python3
"""Helpers of examples/llama/finetune_hf.sh, run with the torch environment's python.

  hf_tools.py make-model DIR         a random tiny Llama saved as transformers does (stands in for
                                     a downloaded checkpoint such as meta-llama/Llama-3.2-1B),
                                     with a small BPE tokenizer trained here (tokenizer.json)
  hf_tools.py make-text DIR          train.jsonl and heldout.jsonl: English-like documents
  hf_tools.py eval-indexed DIR PREFIX SEQ SAMPLES
                                     loads DIR with from_pretrained and prints its mean token loss
                                     over the first SAMPLES windows of seq+1 tokens of the indexed
                                     dataset PREFIX (documents in order), as loom's validation
                                     reads eval.data
  hf_tools.py make-tokens FILE VOCAB uint16 token ids for data.type: tokens (a real run writes
                                     its tokenizer's ids the same way)
  hf_tools.py eval DIR FILE SEQ      loads DIR with from_pretrained and prints its loss on the
                                     first window of FILE, as loom computes it
"""
import array
import sys

import torch
import transformers


def make_model(folder):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=160, vocab_size=256, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    print("wrote a tiny Llama to", folder)
    make_tokenizer(folder)


WORDS = ("the a one every some model rank plan layer token batch step loss weight data text "
         "train learns reads writes splits sends keeps runs grows falls small large quick slow "
         "green blue red of to in on with and but then while because").split()


def sentences(rng, count):
    out = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        out.append(" ".join(words).capitalize() + ".")
    return out


def make_tokenizer(folder):
    """A BPE tokenizer small enough for the tiny model's 256-entry vocabulary."""
    import random
    import tokenizers
    from tokenizers import models, pre_tokenizers, trainers
    rng = random.Random(0)
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<|endoftext|>"])
    tok.train_from_iterator(sentences(rng, 2000), trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                                eos_token="<|endoftext|>")
    fast.save_pretrained(folder)
    print("wrote a %d-token BPE tokenizer to %s" % (len(fast), folder))


def make_text(folder):
    import json
    import os
    import random
    rng = random.Random(1)
    os.makedirs(folder, exist_ok=True)
    for name, docs in (("train.jsonl", 400), ("heldout.jsonl", 40)):
        with open(os.path.join(folder, name), "w") as f:
            for _ in range(docs):
                f.write(json.dumps({"text": " ".join(sentences(rng, rng.randint(2, 6)))}) + "\n")
    print("wrote train.jsonl (400 documents) and heldout.jsonl (40) to", folder)


def read_indexed(prefix):
    """Every document's ids of a Megatron indexed dataset, in order (its format's definition)."""
    import struct
    import numpy
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00", prefix
    code, = struct.unpack("<B", idx[17:18])
    seqs, = struct.unpack("<Q", idx[18:26])
    dtype = {1: numpy.uint8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64, 8: numpy.uint16}[code]
    lengths = numpy.frombuffer(idx, numpy.int32, seqs, 34)
    pointers = numpy.frombuffer(idx, numpy.int64, seqs, 34 + 4 * seqs)
    data = numpy.fromfile(prefix + ".bin", dtype)
    width = numpy.dtype(dtype).itemsize
    return numpy.concatenate([data[p // width:p // width + n] for p, n in zip(pointers, lengths)])


def eval_indexed(folder, prefix, seq, samples):
    model = transformers.LlamaForCausalLM.from_pretrained(folder)
    stream = torch.tensor(read_indexed(prefix).astype("int64"))
    windows = (len(stream) - 1) // seq
    total = 0.0
    with torch.no_grad():
        for i in range(samples):
            j = i % windows
            w = stream[j * seq:j * seq + seq + 1]
            logits = model(input_ids=w[None, :seq]).logits[0]
            total += torch.nn.functional.cross_entropy(logits.double(), w[1:]).item()
    print("%.8f" % (total / samples))


def make_tokens(path, vocab):
    vocab = min(vocab, 1 << 16)  # written as uint16 ids (data.token_bytes: 2)
    # Arithmetic sequences (start + stride * t mod vocab): a pattern the model can learn, so the
    # loss falls within a few steps.
    g = torch.Generator().manual_seed(1)
    ids = []
    while len(ids) < 65536:
        start, stride = torch.randint(0, vocab, (2,), generator=g).tolist()
        ids += [(start + stride * t) % vocab for t in range(64)]
    with open(path, "wb") as f:
        array.array("H", ids).tofile(f)
    print("wrote %d tokens to %s" % (len(ids), path))


def evaluate(folder, path, seq):
    model = transformers.LlamaForCausalLM.from_pretrained(folder)
    ids = array.array("H")
    with open(path, "rb") as f:
        ids.frombytes(f.read())
    window = torch.tensor(ids[:seq + 1].tolist(), dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=window[None, :seq]).logits[0]
    loss = torch.nn.functional.cross_entropy(logits, window[1:])
    print("transformers loads %s: loss %.4f on the first window" % (folder, loss.item()))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make-model":
        make_model(sys.argv[2])
    elif cmd == "make-tokens":
        make_tokens(sys.argv[2], int(sys.argv[3]))
    elif cmd == "make-text":
        make_text(sys.argv[2])
    elif cmd == "eval-indexed":
        eval_indexed(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "eval":
        evaluate(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
