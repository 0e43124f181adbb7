#!/usr/bin/env python3
"""launch/data_prepare.py (`loom data prepare`) against transformers' AutoTokenizer.

The test trains its own tokenizers with the `tokenizers` library (nothing is downloaded) and
saves them as Hugging Face folders:
- gpt2-like: byte-level BPE, `<|endoftext|>` as eos;
- llama3-like: byte-level BPE whose post-processor prepends `<|begin_of_text|>`, with truncation
  and padding stored in tokenizer.json (a call without truncation=/padding= must ignore both);
- wide: a word-level vocabulary of 70,000 tokens and no eos (the int32 path, and --eos-id).
It runs data_prepare.py as a subprocess and reads PREFIX.bin/.idx with a reader written here
from the format's definition (Megatron-LM's indexed_dataset.py): every document must hold exactly
`AutoTokenizer.from_pretrained(dir)(text)["input_ids"] + [eos]`. Bad inputs must exit 2 with
one line naming the file (and line), and leave nothing under the output prefix.

    PY tests/launch/data_prepare_test.py --work DIR

Exit 0: all passed; 1: a failure (each printed); 77: skipped (transformers or tokenizers not
installed), the reason printed. Ends with a line "N passed, M failed".
"""
import argparse
import concurrent.futures
import gzip
import importlib.util
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "launch", "data_prepare.py")

# Megatron's .idx: magic, <Q version 1, <B dtype code, <Q sequences, <Q document indices; then
# int32 lengths, int64 byte pointers, int64 document indices. DType codes: uint16 8, int32 4.
MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {8: "<u2", 4: "<i4"}
HEADER_BYTES = 9 + 8 + 1 + 8 + 8

WORDS = ("the of and to in is was for on that with as by at from his her an which this be are "
         "were had have not but one all they their there been has more who will would when "
         "time river stone garden winter morning light paper window quiet north market letter "
         "engine valley sudden bright careful travel number simple follow between answer "
         "language station history evening mountain question thousand ").split()


def english_like(rng, words):
    out = []
    for _ in range(words):
        word = rng.choice(WORDS)
        out.append(word.capitalize() if rng.random() < 0.08 else word)
        if rng.random() < 0.07:
            out[-1] += rng.choice(".,;:!?")
    return " ".join(out)


# ---------------------------------------------------------------------------------------------
# Tokenizers, trained here.

def train_byte_bpe(specials, vocab_size, seed):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    rng = random.Random(seed)
    corpus = [english_like(rng, 60) for _ in range(150)]
    corpus += ["naïve café déjà vu, 日本語のテキスト, Ελληνικά, emoji 🙂🚀, tabs\tand\nlines"] * 5
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(corpus, trainer)
    return tk


def save_gpt2_like(folder):
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    tk = train_byte_bpe(["<|endoftext|>"], 700, seed=1)
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                            bos_token="<|endoftext|>").save_pretrained(folder)


def save_llama3_like(folder):
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    tk = train_byte_bpe([bos, eos], 650, seed=2)
    tk.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tk.token_to_id(bos))])
    tk.enable_truncation(max_length=24)
    tk.enable_padding(length=40, pad_id=tk.token_to_id(eos), pad_token=eos)
    saved = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=bos, eos_token=eos)
    saved.save_pretrained(folder)


WIDE_VOCAB = 70000


def save_wide(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"[UNK]": 0}
    vocab.update({f"w{i}": i for i in range(1, WIDE_VOCAB)})
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]").save_pretrained(folder)


# ---------------------------------------------------------------------------------------------
# The reader: the format's definition, independent of data_prepare.py.

def read_dataset(prefix):
    """(dtype code, [ids of each document]) after checking every field of the .idx."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    import numpy as np
    assert idx[:9] == MAGIC, f"{prefix}.idx: magic {idx[:9]!r}"
    (version,) = struct.unpack_from("<Q", idx, 9)
    assert version == 1, f"version {version}"
    code = idx[17]
    assert code in DTYPES, f"dtype code {code}"
    sequences, doc_indices = struct.unpack_from("<QQ", idx, 18)
    assert doc_indices == sequences + 1, f"{doc_indices} document indices for {sequences} sequences"
    offset = HEADER_BYTES
    lengths = np.frombuffer(idx, "<i4", sequences, offset)
    offset += 4 * sequences
    pointers = np.frombuffer(idx, "<i8", sequences, offset)
    offset += 8 * sequences
    documents = np.frombuffer(idx, "<i8", doc_indices, offset)
    offset += 8 * doc_indices
    assert offset == len(idx), f"{len(idx) - offset} trailing bytes in {prefix}.idx"
    assert documents.tolist() == list(range(sequences + 1)), "document indices are not 0..D"
    itemsize = np.dtype(DTYPES[code]).itemsize
    data = np.fromfile(prefix + ".bin", DTYPES[code])
    assert os.path.getsize(prefix + ".bin") == int(lengths.sum()) * itemsize, ".bin size"
    docs, position = [], 0
    for length, pointer in zip(lengths.tolist(), pointers.tolist()):
        assert pointer == position * itemsize, f"pointer {pointer}, expected {position * itemsize}"
        docs.append(data[position:position + length].tolist())
        position += length
    return code, docs


# ---------------------------------------------------------------------------------------------
# Inputs, and the documents they hold by the contract (independent of data_prepare.py).

def jsonl_documents(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def text_documents(path):
    with open(path, "rb") as f:
        lines = f.read().decode("utf-8").split("\n")
    return [line.removesuffix("\r") for line in lines if line.strip()]


class Inputs:
    """The input files the good runs read, and the documents each holds by the contract."""

    def __init__(self, folder):
        rng = random.Random(7)
        self.jsonl = write_jsonl(folder, rng)
        self.jsonl_gz = os.path.join(folder, "more.jsonl.gz")
        with gzip.open(self.jsonl_gz, "wt", encoding="utf-8") as f:
            for i in range(40):
                f.write(json.dumps({"text": f"gzip document {i}: " + english_like(rng, 20)}) + "\n")
        self.text = write_text(folder, rng)
        self.whole = write_whole_files(folder, rng)
        self.body = os.path.join(folder, "body.jsonl")   # the text under "body", for --text-key
        self.body_texts = jsonl_documents(self.jsonl)[:60]
        with open(self.body, "w", encoding="utf-8") as f:
            for i, t in enumerate(self.body_texts):
                f.write(json.dumps({"text": f"decoy {i}", "body": t}) + "\n")
        self.wide = write_wide_words(folder, rng)
        self.texts = (jsonl_documents(self.jsonl) + jsonl_documents(self.jsonl_gz) +
                      text_documents(self.text))


def write_jsonl(folder, rng):
    records = [{"text": english_like(rng, rng.randint(1, 80)), "id": i} for i in range(300)]
    records[3]["text"] = ""
    records[5]["text"] = "naïve café — 日本語のテキスト, Ελληνικά, emoji 🙂🚀 and \u00a0nbsp"
    records[8]["text"] = english_like(rng, 6000)            # a long document (~40 KB)
    records[13]["text"] = "first line\nsecond line\r\n\ttabbed <|endoftext|> in the text"
    records[21]["text"] = "   leading and trailing spaces   "
    records[34]["meta"] = {"nested": [1, 2, 3]}
    lines = [json.dumps(r, ensure_ascii=(i % 2 == 0)) for i, r in enumerate(records)]
    lines.insert(10, "")
    lines.insert(50, "   ")
    path = os.path.join(folder, "docs.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def write_text(folder, rng):
    plain = [english_like(rng, rng.randint(1, 30)) for _ in range(120)]
    plain[4] = ""
    plain[9] = "  \t "
    plain[11] = "windows line ending\r"
    plain[12] = "ünïcödé line"
    path = os.path.join(folder, "lines.txt")
    with open(path, "wb") as f:
        f.write(("\n".join(plain)).encode("utf-8"))        # no final newline
    return path


def write_whole_files(folder, rng):
    paths = []
    for i, body in enumerate(["one file,\n\nwith a blank line\n", "", "x" * 5000 + "\n",
                              english_like(rng, 300)]):
        paths.append(os.path.join(folder, f"file{i}.md"))
        with open(paths[-1], "w", encoding="utf-8", newline="") as f:
            f.write(body)
    return paths


def write_wide_words(folder, rng):
    """Words of the wide vocabulary, ids above 65535 among them."""
    lines = [" ".join(f"w{rng.randrange(1, WIDE_VOCAB)}" for _ in range(rng.randint(1, 40)))
             for _ in range(50)]
    lines[0] = "w69999 w65535 w65536 w1 unknownword"
    path = os.path.join(folder, "wide.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------------------------

def prepare(args, timeout=120):
    command = [sys.executable, SCRIPT] + args
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failures = []

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok    {name}")
        else:
            self.failures.append(name)
            print(f"FAIL  {name}: {detail}")


def expected_ids(tok, texts, eos):
    return [tok(text)["input_ids"] + [eos] for text in texts]


def first_difference(got, want):
    if len(got) != len(want):
        return f"{len(got)} documents, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"document {i}: {g[:12]}... expected {w[:12]}..."
    return ""


def check_dataset(checks, name, prefix, tok, texts, eos, code, run):
    if run.returncode != 0:
        checks.check(name, False, f"exit {run.returncode}: {run.stderr.strip()[-800:]}")
        return
    try:
        got_code, docs = read_dataset(prefix)
    except (AssertionError, OSError) as e:
        checks.check(name, False, f"{prefix}: {e}")
        return
    want = expected_ids(tok, texts, eos)
    diff = first_difference(docs, want)
    checks.check(name, got_code == code and not diff,
                 f"dtype code {got_code} (expected {code}); {diff}")
    summary = run.stdout.strip()
    checks.check(f"{name}: summary line", summary.count("\n") == 0 and
                 f"{len(texts)} documents" in summary and f"{sum(map(len, want))} tokens" in summary
                 and prefix + ".bin" in summary and prefix + ".idx" in summary, summary)


def leftovers(prefix):
    folder, name = os.path.split(prefix)
    if not os.path.isdir(folder):
        return []
    return sorted(f for f in os.listdir(folder) if f.startswith(name))


def check_refused(checks, name, run, prefix, needles):
    message = run.stderr.strip()
    missing = [n for n in needles if n not in message]
    checks.check(f"bad input: {name}", run.returncode == 2 and not missing and
                 "Traceback" not in message and message.count("\n") == 0 and
                 not leftovers(prefix),
                 f"exit {run.returncode}, missing {missing}, left {leftovers(prefix)}, "
                 f"stderr: {message[-600:]}")


def load_module():
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    spec = importlib.util.spec_from_file_location("data_prepare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_tokenizers(work, checks):
    """{name: (folder, AutoTokenizer)} for the three trained tokenizers."""
    import transformers
    made = {}
    for name, save in (("gpt2", save_gpt2_like), ("llama3", save_llama3_like), ("wide", save_wide)):
        folder = os.path.join(work, name)
        save(folder)
        made[name] = (folder, transformers.AutoTokenizer.from_pretrained(folder,
                                                                          local_files_only=True))
    gpt2, llama3, wide = (made[n][1] for n in ("gpt2", "llama3", "wide"))
    checks.check("AutoTokenizer loads the trained folders",
                 gpt2.eos_token == "<|endoftext|>" and llama3.eos_token == "<|end_of_text|>"
                 and wide.eos_token_id is None and len(wide) == WIDE_VOCAB,
                 f"{gpt2.eos_token} {llama3.eos_token} {wide.eos_token_id} {len(wide)}")
    bos = llama3.convert_tokens_to_ids("<|begin_of_text|>")
    checks.check("llama3-like prepends bos and does not truncate in __call__",
                 llama3("a b")["input_ids"][0] == bos and
                 len(llama3("word " * 100)["input_ids"]) > 40, llama3("a b")["input_ids"])
    return made


def good_runs(toks, inputs):
    """{name: (flags, tokenizer name, documents expected, eos id, dtype code, what it shows)}"""
    every = [inputs.jsonl, inputs.jsonl_gz, inputs.text]
    eos = toks["gpt2"][1].eos_token_id
    return {
        "w2": (["--workers", "2", "--batch-docs", "7"] + every, "gpt2", inputs.texts, eos, 8,
               "JSONL, gzip JSONL and text, 2 workers"),
        "w1": (["--workers", "1", "--batch-docs", "50"] + every, "gpt2", inputs.texts, eos, 8,
               "the same, 1 worker"),
        "whole": (["--workers", "2", "--whole-files", "--batch-docs", "2"] + inputs.whole, "gpt2",
                  [open(p, encoding="utf-8", newline="").read() for p in inputs.whole], eos, 8,
                  "--whole-files"),
        "llama3": (["--workers", "2", "--text-key", "body", inputs.body, inputs.text], "llama3",
                   inputs.body_texts + text_documents(inputs.text),
                   toks["llama3"][1].eos_token_id, 8,
                   "llama3-like (bos, truncation and padding in tokenizer.json), --text-key"),
        "wide": (["--workers", "2", "--eos-id", "0", inputs.wide], "wide",
                 text_documents(inputs.wide), 0, 4, "vocabulary of 70000: int32 ids, --eos-id"),
    }


def bad_runs(work, toks, inputs):
    """{name: (arguments, output prefix, what stderr must name)}; each prefix must stay empty."""
    bad_dir = os.path.join(work, "bad")
    os.makedirs(bad_dir)

    def bad_file(name, body):
        path = os.path.join(bad_dir, name)
        with open(path, "wb") as f:
            f.write(body.encode("utf-8") if isinstance(body, str) else body)
        return path

    def case(prefix, files, needles, tokenizer=toks["gpt2"][0]):
        return (["--tokenizer", tokenizer, "--out", prefix] + files, prefix, needles)

    q = lambda name: os.path.join(bad_dir, "out_" + name)
    missing = os.path.join(bad_dir, "nope.jsonl")
    no_tokenizer = os.path.join(work, "empty_folder")
    os.makedirs(no_tokenizer)
    a_file = bad_file("plain.txt", "a document\n")
    not_json = bad_file("not_json.jsonl", '{"text": "fine"}\n{"text": "fine"}\n{"text": oops}\n')
    not_object = bad_file("not_object.jsonl", '{"text": "fine"}\n["text", "in", "a list"]\n')
    no_key = bad_file("no_key.jsonl", '\n{"text": "fine"}\n{"body": "wrong key"}\n')
    not_string = bad_file("not_string.jsonl", '{"text": "fine"}\n{"text": 42}\n')
    empty = bad_file("empty.txt", "\n   \n\t\n")
    latin1 = bad_file("latin1.txt", b"fine\ncaf\xe9 au lait\n")
    surrogate = bad_file("surrogate.jsonl", '{"text": "fine"}\n{"text": "half \\ud800 a pair"}\n')
    jsonl = [inputs.jsonl]
    bad = {
        "missing input": case(q("a"), jsonl + [missing], [missing]),
        "missing tokenizer folder": case(q("b"), jsonl, [q("no_dir")], tokenizer=q("no_dir")),
        "folder without a tokenizer": case(q("c"), jsonl, [no_tokenizer, "tokenizer.json"],
                                           tokenizer=no_tokenizer),
        "missing output folder": case(q("no/dir/x"), jsonl, [q("no/dir")]),
        "output folder is a file": case(a_file + "/x", jsonl, [a_file]),
        "--out with .bin": case(q("d") + ".bin", jsonl, [q("d") + ".bin", "without suffix"]),
        "--out with .idx": case(q("e") + ".idx", jsonl, [q("e") + ".idx", "without suffix"]),
        "JSONL line not JSON": case(q("f"), jsonl + [not_json], [not_json + ":3", "JSON"]),
        "JSONL line not an object": case(q("g"), [not_object], [not_object + ":2", "object"]),
        "JSONL line without the key": case(q("h"), [no_key], [no_key + ":3", '"text"']),
        "JSONL text not a string": case(q("i"), [not_string],
                                        [not_string + ":2", '"text"', "number"]),
        "no documents": case(q("j"), [empty], [empty]),
        "invalid UTF-8": case(q("k"), [latin1], [latin1 + ":2", "UTF-8"]),
        "JSONL text with an unpaired surrogate": case(q("m"), [surrogate],
                                                      [surrogate + ":2", "surrogate"]),
        "tokenizer without eos": case(q("l"), [inputs.wide], [toks["wide"][0], "--eos-id"],
                                      tokenizer=toks["wide"][0]),
    }
    if os.geteuid() != 0:  # root writes anywhere
        locked = os.path.join(work, "locked")
        os.makedirs(locked)
        os.chmod(locked, 0o500)
        bad["output folder not writable"] = case(locked + "/x", jsonl, [locked])
    return bad


def run_all(good, bad, toks, out):
    """Every run, two at a time: most of a run is importing transformers on one core."""
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for name, (flags, tokenizer, *_) in good.items():
            args = ["--tokenizer", toks[tokenizer][0], "--out", os.path.join(out, name),
                    "--no-progress"]
            jobs[name] = pool.submit(prepare, args + flags)
        for name, (args, _, _) in bad.items():
            jobs[name] = pool.submit(prepare, args)
    return {name: job.result() for name, job in jobs.items()}


def check_good(checks, good, toks, runs, out):
    for name, (_, tokenizer, texts, eos, code, shows) in good.items():
        check_dataset(checks, shows, os.path.join(out, name), toks[tokenizer][1], texts, eos, code,
                      runs[name])
    w1, w2 = os.path.join(out, "w1"), os.path.join(out, "w2")
    if runs["w1"].returncode == 0 and runs["w2"].returncode == 0:
        same = all(open(w1 + s, "rb").read() == open(w2 + s, "rb").read()
                   for s in (".bin", ".idx"))
        checks.check("1 and 2 workers write byte-identical files", same)
    try:
        _, docs = read_dataset(os.path.join(out, "wide"))
        checks.check("ids above 65535 survive", max(max(d) for d in docs) >= 65536)
    except (AssertionError, OSError) as e:
        checks.check("ids above 65535 survive", False, str(e))
    checks.check("no temporaries left by the good runs",
                 not [f for f in os.listdir(out) if ".tmp" in f], os.listdir(out))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True)
    work = os.path.abspath(parser.parse_args().work)
    try:
        import numpy  # noqa: F401
        import tokenizers  # noqa: F401
        import transformers
    except ImportError as e:
        print(f"SKIP: {e} (run scripts/install-deps)")
        return SKIP
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers.logging.set_verbosity_error()
    started = time.monotonic()
    shutil.rmtree(work, ignore_errors=True)
    for folder in ("inputs", "out"):
        os.makedirs(os.path.join(work, folder))
    checks = Checks()

    toks = make_tokenizers(work, checks)
    inputs = Inputs(os.path.join(work, "inputs"))
    out = os.path.join(work, "out")
    good = good_runs(toks, inputs)
    bad = bad_runs(work, toks, inputs)
    runs = run_all(good, bad, toks, out)

    check_good(checks, good, toks, runs, out)
    for name, (_, prefix, needles) in bad.items():
        check_refused(checks, name, runs[name], prefix, needles)
    module = load_module()
    checks.check("dtype rule: uint16 below 65500 tokens, int32 from it on",
                 module.token_dtype(65499).name == "uint16" and
                 module.token_dtype(65500).name == "int32" and
                 module.dtype_code(module.token_dtype(100)) == 8 and
                 module.dtype_code(module.token_dtype(10**6)) == 4)

    print(f"({time.monotonic() - started:.1f} s)")
    print(f"{checks.passed} passed, {len(checks.failures)} failed")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    code = main()
    # Everything is checked and printed: skip the interpreter's teardown of transformers' and
    # tokenizers' modules, as data_prepare.py does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
