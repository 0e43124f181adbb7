#!/usr/bin/env python3
"""`loom data prepare` (launch/data_prepare.py) against transformers' fast tokenizer, same run.

A generated JSONL corpus (pseudo-English from a Zipf-distributed vocabulary of made-up words,
some unicode; documents of a few to a few thousand words) and a byte-level BPE tokenizer trained
on a sample of it (nothing is downloaded). Each round runs both, alternating which goes first:

- transformers: this process, `AutoTokenizer(...)(batch)["input_ids"]` on batches of 1000
  documents read and parsed from the JSONL (the Rust backend's threads on every core); timed from
  opening the file to the last batch, the tokenizer already loaded;
- loom: data_prepare.py as a subprocess with its default workers, writing PREFIX.bin/.idx;
  timed end to end (process start to exit, loading transformers and the tokenizer included),
  and after its tokenizer is loaded (the load time it prints, taken off).

Both must count the same tokens (loom's include one eos per document, added to transformers'
count). Prints each round's rates, CPU seconds (all threads and processes) and the median ratio
loom / transformers in tokens per second (target: >= 1.0 end to end). The CPU-second ratio is
the figure to read on a machine that other work keeps busy.

Usage: bench/data/prepare_speed.py [--mb 40] [--rounds 2] [--vocab 16384] [--work DIR] [--smoke]
Exit 0 (figures printed); 1 the token counts differ or a run failed; 77 transformers missing.
"""
import argparse
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "launch", "data_prepare.py")
BASELINE_BATCH = 1000
SUMMARY = re.compile(r": (\d+) documents, (\d+) tokens, ([0-9.]+) s \(([0-9.]+) s loading")

SYLLABLES = ("ka ri to na mo se lu vi re an ed in or th st er on al es ti ba de go he ji ku "
             "la me ni po qu ra si tu ve wo ya ze ch sh ou ai ea io ng ck ll ss").split()
UNICODE = ("café", "naïve", "Zürich", "日本語", "Ελληνικά", "русский", "🙂", "—", "…", "½")


def make_words(rng, count):
    words = set()
    while len(words) < count:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3, 3, 4)))))
    return sorted(words)


def write_corpus(path, megabytes, seed=0):
    """JSON Lines of about `megabytes` MB of text; returns (documents, text bytes)."""
    rng = random.Random(seed)
    words = make_words(rng, 20000) + list(UNICODE)
    weights = [1.0 / (rank + 10) for rank in range(len(words))]   # Zipf-like
    cumulative = []
    total = 0.0
    for w in weights:
        total += w
        cumulative.append(total)
    target = megabytes * 1_000_000
    documents = text_bytes = 0
    with open(path, "w", encoding="utf-8") as f:
        while text_bytes < target:
            length = min(int(rng.lognormvariate(5.5, 1.0)) + 3, 8000)
            chosen = rng.choices(words, cum_weights=cumulative, k=length)
            sentences, start = [], 0
            while start < length:
                end = min(length, start + rng.randint(6, 22))
                sentence = " ".join(chosen[start:end])
                sentences.append(sentence[:1].upper() + sentence[1:] + rng.choice(".....?!;"))
                start = end
            text = " ".join(sentences)
            f.write(json.dumps({"text": text, "id": documents}, ensure_ascii=False) + "\n")
            documents += 1
            text_bytes += len(text.encode("utf-8"))
    return documents, text_bytes


def train_tokenizer(corpus, folder, vocab_size, sample_bytes=3_000_000):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    def sample():
        seen = 0
        with open(corpus, encoding="utf-8") as f:
            for line in f:
                text = json.loads(line)["text"]
                seen += len(text)
                yield text
                if seen >= sample_bytes:
                    return

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(sample(), trainer)
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                            bos_token="<|endoftext|>").save_pretrained(folder)


def run_transformers(tok, corpus):
    """(seconds, CPU seconds, tokens, documents): read, parse and tokenize in batches of 1000."""
    start, cpu_start = time.perf_counter(), time.process_time()
    tokens = documents = 0
    batch = []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            batch.append(json.loads(line)["text"])
            if len(batch) == BASELINE_BATCH:
                tokens += sum(len(ids) for ids in tok(batch)["input_ids"])
                documents += len(batch)
                batch = []
        if batch:
            tokens += sum(len(ids) for ids in tok(batch)["input_ids"])
            documents += len(batch)
    return time.perf_counter() - start, time.process_time() - cpu_start, tokens, documents


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_loom(tokenizer, corpus, prefix):
    """(end-to-end seconds, seconds after the tokenizer load, CPU seconds of the process and its
    workers, tokens, documents)."""
    command = [sys.executable, SCRIPT, "--tokenizer", tokenizer, "--out", prefix, "--no-progress",
               corpus]
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    start, cpu_start = time.perf_counter(), children_cpu_seconds()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds, cpu = time.perf_counter() - start, children_cpu_seconds() - cpu_start
    if done.returncode != 0:
        sys.exit(f"data_prepare.py failed (exit {done.returncode}): {done.stderr.strip()}")
    match = SUMMARY.search(done.stdout)
    if not match:
        sys.exit(f"no summary line in data_prepare.py's output: {done.stdout!r}")
    documents, tokens, own_seconds, load_seconds = match.groups()
    return seconds, seconds - float(load_seconds), cpu, int(tokens), int(documents)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=40, help="text in the corpus, MB (default 40)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=16384, help="BPE vocabulary (default 16384)")
    parser.add_argument("--work", help="folder for the corpus, tokenizer and output (default: "
                        "a temporary one, removed)")
    parser.add_argument("--smoke", action="store_true", help="1 MB, 1 round, vocabulary 2048")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.rounds, args.vocab = 1, 1, 2048
    try:
        import tokenizers  # noqa: F401
        import transformers
    except ImportError as e:
        print(f"SKIP: {e} (run scripts/install-deps)")
        return SKIP
    transformers.logging.set_verbosity_error()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.pop("TOKENIZERS_PARALLELISM", None)  # the baseline on every core, as by default

    work = args.work or tempfile.mkdtemp(prefix="loom-prepare-speed-")
    os.makedirs(work, exist_ok=True)
    try:
        corpus = os.path.join(work, "corpus.jsonl")
        tokenizer = os.path.join(work, "tokenizer")
        start = time.perf_counter()
        documents, text_bytes = write_corpus(corpus, args.mb)
        train_tokenizer(corpus, tokenizer, args.vocab)
        tok = transformers.AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
        print(f"corpus: {documents} documents, {text_bytes / 1e6:.1f} MB of text "
              f"({os.path.getsize(corpus) / 1e6:.1f} MB JSONL); BPE vocabulary {len(tok)}; "
              f"{os.cpu_count()} CPUs; set up in {time.perf_counter() - start:.1f} s")
        ratios, steady_ratios = [], []
        for round_ in range(args.rounds):
            order = ("transformers", "loom") if round_ % 2 == 0 else ("loom", "transformers")
            for side in order:
                if side == "transformers":
                    hf_s, hf_cpu, hf_tokens, hf_docs = run_transformers(tok, corpus)
                else:
                    loom_s, loom_steady_s, loom_cpu, loom_tokens, loom_docs = run_loom(
                        tokenizer, corpus, os.path.join(work, "prepared"))
            if (loom_docs, loom_tokens) != (hf_docs, hf_tokens + hf_docs):
                print(f"FAIL: loom wrote {loom_docs} documents, {loom_tokens} tokens; transformers "
                      f"made {hf_docs} documents, {hf_tokens} tokens + {hf_docs} eos")
                return 1
            hf_rate = hf_tokens / hf_s
            loom_rate, steady_rate = loom_tokens / loom_s, loom_tokens / loom_steady_s
            ratios.append(loom_rate / hf_rate)
            steady_ratios.append(steady_rate / hf_rate)
            print(f"round {round_ + 1}: {loom_tokens} tokens; transformers {hf_rate / 1e6:.3f} M/s "
                  f"({hf_s:.2f} s, {hf_cpu:.1f} CPU s); loom {loom_rate / 1e6:.3f} M/s "
                  f"({loom_s:.2f} s end to end, {loom_cpu:.1f} CPU s), {steady_rate / 1e6:.3f} M/s "
                  f"({loom_steady_s:.2f} s after the tokenizer load); loom / transformers "
                  f"{ratios[-1]:.3f} end to end, {steady_ratios[-1]:.3f} after the load, "
                  f"{hf_cpu / loom_cpu:.3f} in tokens per CPU second")
        median = statistics.median(ratios)
        print(f"loom / transformers tokens/s: {median:.3f} end to end "
              f"(rounds {', '.join(f'{r:.3f}' for r in ratios)}), "
              f"{statistics.median(steady_ratios):.3f} after the tokenizer load; target >= 1.0 "
              f"end to end: {'met' if median >= 1.0 else 'NOT met'}")
        return 0
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
