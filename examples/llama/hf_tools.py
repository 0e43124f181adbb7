#!/usr/bin/env python3
"""Helpers of examples/llama/finetune_hf.sh, run with the torch environment's python.

  hf_tools.py make-model DIR         a random tiny Llama saved as transformers does (stands in for
                                     a downloaded checkpoint such as meta-llama/Llama-3.2-1B)
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
    elif cmd == "eval":
        evaluate(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
