#!/usr/bin/env python3
"""Text to tokens: the program behind `loom data prepare`.

    data_prepare.py --tokenizer HF_DIR --out PREFIX [--text-key KEY] [--whole-files]
                    [--eos-id N] [--workers N] [--batch-docs N] [--no-progress] INPUT...

Each document becomes `AutoTokenizer.from_pretrained(HF_DIR)(text)["input_ids"]` followed by the
eos id, written as Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py):
PREFIX.bin holds every document's ids back to back, PREFIX.idx one sequence per document.

Tokens are uint16 for a vocabulary under 65500 tokens, else int32 (Megatron's rule).

Inputs (UTF-8): `*.jsonl` / `*.json` are JSON Lines (one object per line, the text under
--text-key, an empty string included); anything else is plain text, one document per line (its
end of line, \n or \r\n, taken off), or with --whole-files one document per file, its text as it
is. Blank (whitespace-only) lines are skipped; a `.gz` suffix is read through gzip; a byte-order
mark at a file's start is dropped.

The ids come from the tokenizer's Rust backend (the `tokenizers.Tokenizer` that transformers'
`__call__` itself runs, with the truncation, padding and special-token settings that call uses;
`encode_batch_fast`, which leaves out the character offsets), in --workers processes of one
thread each; output order is input order for any worker count.

Exit codes: 0 written; 1 a failure while running (a full disk, a worker that died); 2 bad input
(flags, files, tokenizer), one line on stderr naming the file (and line); 130/143 interrupted.
Temporaries are removed on every failure, so PREFIX.bin and PREFIX.idx exist only complete.
"""
import argparse
import collections
import concurrent.futures
import gzip
import json
import multiprocessing
import os
import signal
import struct
import sys
import time
import zlib

import numpy as np

PROG = "loom data prepare"
EXIT_BAD_INPUT = 2

# Megatron's .idx header and its DType codes (indexed_dataset.DType).
INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6,
               "float32": 7, "uint16": 8}
# Megatron's DType.optimal_dtype: uint16 below this vocabulary size, int32 from it on.
UINT16_VOCAB_LIMIT = 65500

JSON_SUFFIXES = (".jsonl", ".json")
# Files transformers can build a tokenizer from; a folder with none of them is not a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "vocab.txt", "merges.txt", "tiktoken.model")
# A batch ends at --batch-docs lines or at this many bytes of text, whichever comes first, so a
# few huge documents do not make one huge message between processes.
BATCH_BYTES = 8 << 20
PROGRESS_TTY_S = 0.25    # terminal bar refresh
PROGRESS_PLAIN_S = 10.0  # one plain line this often when stderr is not a terminal


class UserError(Exception):
    """A mistake in the flags or the files: reported as one line, exit 2."""


class WriteError(Exception):
    """The output could not be written (a full disk, say): reported as one line, exit 1."""


class Interrupted(Exception):
    """SIGINT or SIGTERM: clean up and exit 128 + signal."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def token_dtype(vocab_size):
    """Megatron's rule: uint16 for a vocabulary under 65500 tokens, else int32 (little-endian)."""
    return np.dtype("<u2") if vocab_size < UINT16_VOCAB_LIMIT else np.dtype("<i4")


def dtype_code(dtype):
    """Megatron's DType code of a numpy dtype (uint16 8, int32 4, ...)."""
    return DTYPE_CODES[np.dtype(dtype).name]


# ---------------------------------------------------------------------------------------------
# Flags and the checks that need no tokenizer.

def usable_cpus():
    """os.cpu_count(), less the CPUs that taskset or a cgroup cpuset keeps this process off."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def parse_args(argv):
    def positive(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number")
        if value < 1:
            raise argparse.ArgumentTypeError(f"{value} is not at least 1")
        return value

    def token_id(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a token id")
        if value < 0:
            raise argparse.ArgumentTypeError(f"{value} is negative")
        return value

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tokenize text into a Megatron indexed dataset (PREFIX.bin, PREFIX.idx).")
    parser.add_argument("--tokenizer", required=True, metavar="HF_DIR",
                        help="a Hugging Face tokenizer folder (tokenizer.json, "
                        "tokenizer_config.json)")
    parser.add_argument("--out", required=True, metavar="PREFIX",
                        help="output path without suffix: writes PREFIX.bin and PREFIX.idx")
    parser.add_argument("--text-key", default="text", metavar="KEY",
                        help="the JSON Lines key holding a document's text (default: text)")
    parser.add_argument("--whole-files", action="store_true",
                        help="a plain-text input is one document, not one per line")
    parser.add_argument("--eos-id", type=token_id, metavar="N",
                        help="the id appended after each document (default: the tokenizer's eos)")
    parser.add_argument("--workers", type=positive, default=usable_cpus(), metavar="N",
                        help="encoding processes, one thread each (default: the CPUs this "
                        "process may run on)")
    parser.add_argument("--batch-docs", type=positive, default=256, metavar="N",
                        help="documents per batch handed to a worker (default: 256)")
    parser.add_argument("--no-progress", action="store_true", help="print no progress on stderr")
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="JSON Lines or text files")
    return parser.parse_args(argv)


def output_paths(prefix):
    """PREFIX.bin and PREFIX.idx, after checking that PREFIX's folder exists and is writable."""
    for suffix in (".bin", ".idx"):
        if prefix.endswith(suffix):
            raise UserError(f"--out {prefix}: PREFIX is without suffix (.bin and .idx are added): "
                            f"--out {prefix[:-len(suffix)]}")
    folder, name = os.path.split(prefix)
    if not name or name in (".", ".."):
        raise UserError(f"--out {prefix}: names a folder; give a file prefix such as "
                        f"{os.path.join(prefix, 'corpus')}")
    folder = folder or "."
    if not os.path.exists(folder):
        raise UserError(f"--out {prefix}: the folder {folder} does not exist")
    if not os.path.isdir(folder):
        raise UserError(f"--out {prefix}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"--out {prefix}: the folder {folder} is not writable")
    return prefix + ".bin", prefix + ".idx"


def check_inputs(paths):
    for path in paths:
        if not os.path.exists(path):
            raise UserError(f"{path}: no such input file")
        if os.path.isdir(path):
            raise UserError(f"{path}: is a folder; name the files in it")
        if not os.access(path, os.R_OK):
            raise UserError(f"{path}: not readable")


def check_tokenizer_folder(folder):
    if not os.path.exists(folder):
        raise UserError(f"--tokenizer {folder}: no such folder")
    if not os.path.isdir(folder):
        raise UserError(f"--tokenizer {folder}: not a folder (a Hugging Face tokenizer folder "
                        "holds tokenizer.json and tokenizer_config.json)")
    if not any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES):
        raise UserError(f"--tokenizer {folder}: no tokenizer in it (no tokenizer.json, "
                        "tokenizer_config.json or vocabulary file)")


# ---------------------------------------------------------------------------------------------
# The tokenizer: loaded once here with AutoTokenizer; the workers rebuild its backend from JSON.

class TokenizerSpec:
    """What a worker needs to encode exactly as the loaded AutoTokenizer does."""

    def __init__(self, backend_json, split_special_tokens, eos_id, vocab_size, max_id):
        self.backend_json = backend_json
        self.split_special_tokens = split_special_tokens
        self.eos_id = eos_id
        self.max_id = max_id
        # len(tokenizer) as Megatron's rule reads it, or more where ids leave holes.
        self.dtype = token_dtype(max(vocab_size, max_id + 1))


def make_encoder(spec):
    """The backend `tokenizers.Tokenizer` as transformers' `tok(text)` runs it: the same model and
    pipeline, no truncation or padding (what a call without truncation=/padding= sets), special
    tokens in the text matched or split as the tokenizer's split_special_tokens says."""
    import tokenizers
    encoder = tokenizers.Tokenizer.from_str(spec.backend_json)
    encoder.no_truncation()
    encoder.no_padding()
    encoder.encode_special_tokens = spec.split_special_tokens
    return encoder


def encode(encoder, texts):
    """The encodings of texts, special tokens added: encode_batch's ids (what transformers' call
    runs) without the character offsets it also computes, about a tenth less time."""
    return encoder.encode_batch_fast(texts, add_special_tokens=True)


# Probe texts for the check that the backend, rebuilt as the workers rebuild it, gives the ids
# of the tokenizer's own __call__: spaces, unicode, control characters, an empty document.
PROBE_TEXTS = ("", "Hello world", "  two leading spaces", "naïve café, 日本語, 🙂",
               "line\nbreak\ttab\r\n", "x" * 300)


# Set (to 1) when transformers must be imported with torch: the retry after a load that failed
# without it, or by hand to rule torch's absence out.
WITH_TORCH_ENV = "LOOM_DATA_PREPARE_WITH_TORCH"


def load_tokenizer(folder, eos_override):
    """AutoTokenizer from a local folder; returns the TokenizerSpec the workers encode with."""
    tok = auto_tokenizer(folder)
    spec = tokenizer_spec(tok, folder, eos_override)
    check_backend_matches(tok, spec, folder)
    return spec


def auto_tokenizer(folder):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # transformers imports torch (about 3 s of a 4.5 s start) for model code that tokenizing never
    # runs; hidden (find_spec sees None), AutoTokenizer loads without it.
    torch_hidden = os.environ.get(WITH_TORCH_ENV) != "1" and "torch" not in sys.modules
    if torch_hidden:
        sys.modules["torch"] = None
    try:
        import transformers
    except ImportError as e:
        raise UserError(f"transformers is not installed in {sys.executable} ({e}); "
                        "run scripts/install-deps")
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # transformers raises many kinds for a bad folder
        if torch_hidden:
            # Some tokenizer classes may need torch: start again with it, so that a real error
            # is reported as transformers with torch reports it.
            os.environ[WITH_TORCH_ENV] = "1"
            os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:])
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"--tokenizer {folder}: transformers cannot load it: {reason}")


def tokenizer_spec(tok, folder, eos_override):
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise UserError(f"--tokenizer {folder}: {type(tok).__name__} has no fast (Rust) backend; "
                        "data prepare needs a tokenizer.json")
    vocab_size = len(tok)
    eos_id = tok.eos_token_id if eos_override is None else eos_override
    if eos_id is None:
        raise UserError(f"--tokenizer {folder}: the tokenizer has no eos token; pass --eos-id N "
                        "(the id appended after each document)")
    if not 0 <= eos_id < vocab_size:
        raise UserError(f"--eos-id {eos_id}: outside the vocabulary of {folder} "
                        f"({vocab_size} tokens)")
    max_id = max(backend.get_vocab(with_added_tokens=True).values(), default=0)
    return TokenizerSpec(backend.to_str(), bool(getattr(tok, "split_special_tokens", False)),
                         eos_id, vocab_size, max(max_id, eos_id))


def check_backend_matches(tok, spec, folder):
    """The backend, rebuilt as the workers rebuild it, against the tokenizer's own __call__."""
    encodings = encode(make_encoder(spec), list(PROBE_TEXTS))
    for text, encoding in zip(PROBE_TEXTS, encodings):
        expected = tok(text)["input_ids"]
        got = encoding.ids
        if got != expected:
            raise UserError(f"--tokenizer {folder}: {type(tok).__name__} encodes {text!r} as "
                            f"{expected[:8]} but its backend as {got[:8]}: a tokenizer class that "
                            "encodes in Python is not supported")


# ---------------------------------------------------------------------------------------------
# Reading: the main process cuts the inputs into batches of raw lines (or whole files); the
# workers decode and parse them, so JSON parsing runs in parallel too.

class Batch:
    """Raw documents of one input: lines from first_line on (kind "jsonl" or "text"), or whole
    files (kind "files", paths[i] the file of raws[i])."""

    def __init__(self, kind, paths, first_line, raws):
        self.kind = kind
        self.paths = paths
        self.first_line = first_line
        self.raws = raws


def open_input(path):
    """(text-bytes stream, raw file): the raw file's position measures progress through it."""
    raw = open(path, "rb")
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    return raw, raw


def input_kind(path):
    base = path[:-3] if path.endswith(".gz") else path
    return "jsonl" if base.endswith(JSON_SUFFIXES) else "text"


class Reader:
    """Yields Batches over every input in order; read_bytes counts the input consumed so far."""

    def __init__(self, paths, whole_files, batch_docs):
        self.paths = paths
        self.whole_files = whole_files
        self.batch_docs = batch_docs
        self.total_bytes = sum(os.path.getsize(p) for p in paths)
        self.read_bytes = 0

    def batches(self):
        files = []
        files_bytes = 0
        for path in self.paths:
            try:
                if self.whole_files and input_kind(path) == "text":
                    text = self._read_whole(path)
                    files.append((path, text))
                    files_bytes += len(text)
                    if len(files) >= self.batch_docs or files_bytes >= BATCH_BYTES:
                        yield self._files_batch(files)
                        files, files_bytes = [], 0
                    continue
                yield from self._line_batches(path)
            except (OSError, EOFError, zlib.error) as e:
                raise UserError(f"{path}: cannot read it: {e}")
        if files:
            yield self._files_batch(files)

    def _read_whole(self, path):
        stream, raw = open_input(path)
        with stream, raw:
            data = stream.read()
            self.read_bytes += raw.tell()
        return data

    @staticmethod
    def _files_batch(files):
        return Batch("files", [p for p, _ in files], 0, [t for _, t in files])

    def _line_batches(self, path):
        kind = input_kind(path)
        stream, raw = open_input(path)
        with stream, raw:
            done = self.read_bytes
            lines, nbytes, first = [], 0, 1
            for line in stream:
                lines.append(line)
                nbytes += len(line)
                if len(lines) >= self.batch_docs or nbytes >= BATCH_BYTES:
                    self.read_bytes = done + raw.tell()
                    yield Batch(kind, [path], first, lines)
                    first += len(lines)
                    lines, nbytes = [], 0
            self.read_bytes = done + raw.tell()
            if lines:
                yield Batch(kind, [path], first, lines)


JSON_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "a number",
                   float: "a number", bool: "a boolean", type(None): "null"}


def decode_utf8(raw, where):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: not valid UTF-8 (at byte {e.start})")


def batch_documents(batch, text_key):
    """The batch's documents as (texts, origins), origins naming each one as FILE[:LINE]."""
    texts, origins = [], []
    if batch.kind == "files":
        for path, raw in zip(batch.paths, batch.raws):
            texts.append(decode_utf8(raw, path).removeprefix("\ufeff"))
            origins.append(path)
        return texts, origins
    path = batch.paths[0]
    for number, raw in enumerate(batch.raws, start=batch.first_line):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        line = decode_utf8(raw, where)
        if number == 1:
            line = line.removeprefix("\ufeff")
        if batch.kind == "text":
            texts.append(line.rstrip("\n").removesuffix("\r"))
        else:
            texts.append(parse_json_line(line, text_key, where))
        origins.append(where)
    return texts, origins


def parse_json_line(line, text_key, where):
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not valid JSON ({e.msg}, column {e.colno}); JSON Lines inputs "
                        "hold one object per line")
    except (ValueError, RecursionError) as e:
        raise UserError(f"{where}: not valid JSON ({e})")
    if not isinstance(record, dict):
        raise UserError(f"{where}: {JSON_TYPE_NAMES.get(type(record), 'a value')} where an object "
                        f"with the key \"{text_key}\" was expected")
    if text_key not in record:
        raise UserError(f"{where}: no key \"{text_key}\" in the object (--text-key names another)")
    text = record[text_key]
    if not isinstance(text, str):
        raise UserError(f"{where}: \"{text_key}\" is {JSON_TYPE_NAMES.get(type(text), 'a value')}, "
                        "not a string")
    return text


# ---------------------------------------------------------------------------------------------
# Workers: one encoder each, built once; a batch in, (lengths, token bytes) out.

_worker_state = {}


def init_worker(spec, text_key):
    # Ctrl-C reaches the whole process group: the main process alone handles it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _worker_state["encoder"] = make_encoder(spec)
    _worker_state["spec"] = spec
    _worker_state["text_key"] = text_key


def tokenize_batch(batch):
    """("ok", int32 lengths bytes, token bytes) or ("error", message) for a user mistake."""
    spec = _worker_state["spec"]
    encoder = _worker_state["encoder"]
    try:
        texts, origins = batch_documents(batch, _worker_state["text_key"])
    except UserError as e:
        return ("error", str(e))
    try:
        encodings = encode(encoder, texts)
    except Exception:
        return ("error", first_unencodable(encoder, texts, origins))
    flat, lengths = [], []
    eos = spec.eos_id
    for encoding in encodings:
        ids = encoding.ids
        flat += ids
        flat.append(eos)
        lengths.append(len(ids) + 1)
    # The dtype holds every id of the vocabulary by construction (token_dtype); checked anyway
    # (numpy also refuses a Python int outside the dtype).
    tokens = np.array(flat, dtype=spec.dtype)
    if tokens.size and int(tokens.max()) > spec.max_id:
        raise RuntimeError(f"id {int(tokens.max())} above the vocabulary's largest ({spec.max_id})")
    return ("ok", np.array(lengths, dtype="<i4").tobytes(), tokens.tobytes())


def first_unencodable(encoder, texts, origins):
    for text, where in zip(texts, origins):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return (f"{where}: an unpaired surrogate ({text[e.start]!r}, a \\ud800-\\udfff "
                    "escape) is not text")
        try:
            encode(encoder, [text])
        except Exception as e:
            return f"{where}: the tokenizer cannot encode this text ({e})"
    return f"{origins[0]}: the tokenizer failed on this batch"


# ---------------------------------------------------------------------------------------------
# Writing: .bin streamed as batches arrive, .idx at the end; both under temporary names in the
# output folder until complete.

class DatasetWriter:
    def __init__(self, bin_path, idx_path, dtype):
        self.bin_path, self.idx_path = bin_path, idx_path
        self.dtype = np.dtype(dtype)
        suffix = f".tmp-{os.getpid()}"
        self.bin_tmp, self.idx_tmp = bin_path + suffix, idx_path + suffix
        self.lengths = []
        self.documents = 0
        self.tokens = 0
        try:
            self.bin_file = open(self.bin_tmp, "wb")
        except OSError as e:
            raise UserError(f"--out: cannot write {self.bin_tmp}: {e.strerror}")

    def append(self, lengths_bytes, token_bytes):
        try:
            self.bin_file.write(token_bytes)
        except OSError as e:
            raise WriteError(f"cannot write {self.bin_tmp}: {e.strerror}")
        self.lengths.append(lengths_bytes)
        self.documents += len(lengths_bytes) // 4
        self.tokens += len(token_bytes) // self.dtype.itemsize

    def commit(self):
        """fsync both files, then rename: .bin first, .idx last (a dataset is there once its .idx
        is); an older PREFIX.idx goes first so no moment pairs it with the new .bin."""
        try:
            self._close_synced(self.bin_file)
            with open(self.idx_tmp, "wb") as f:
                self._write_index(f)
                self._close_synced(f)
        except OSError as e:
            raise WriteError(f"cannot write {e.filename or self.bin_tmp}: {e.strerror}")
        # No signal between the renames: an interrupted run leaves the old dataset or the new.
        stop = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        try:
            if os.path.exists(self.idx_path):
                os.unlink(self.idx_path)
            os.replace(self.bin_tmp, self.bin_path)
            os.replace(self.idx_tmp, self.idx_path)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)
        folder = os.open(os.path.dirname(os.path.abspath(self.idx_path)), os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def abort(self):
        if not self.bin_file.closed:
            self.bin_file.close()
        for path in (self.bin_tmp, self.idx_tmp):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    @staticmethod
    def _close_synced(f):
        f.flush()
        os.fsync(f.fileno())
        f.close()

    def _write_index(self, f):
        lengths = np.frombuffer(b"".join(self.lengths), dtype="<i4")
        pointers = np.zeros(len(lengths), dtype="<i8")
        np.cumsum(lengths[:-1], dtype="<i8", out=pointers[1:])
        pointers *= self.dtype.itemsize
        f.write(INDEX_MAGIC)
        f.write(struct.pack("<Q", INDEX_VERSION))
        f.write(struct.pack("<B", dtype_code(self.dtype)))
        f.write(struct.pack("<Q", len(lengths)))       # sequences: one per document
        f.write(struct.pack("<Q", len(lengths) + 1))   # document indices: documents + 1
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(lengths) + 1, dtype="<i8").tobytes())


# ---------------------------------------------------------------------------------------------
# Progress on stderr: a bar on a terminal, a line every PROGRESS_PLAIN_S otherwise.

def human(n):
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


class Progress:
    def __init__(self, enabled, total_bytes, stream=sys.stderr):
        self.enabled = enabled
        self.total_bytes = total_bytes
        self.stream = stream
        self.tty = enabled and stream.isatty()
        self.start = time.monotonic()
        self.last = self.start
        self.drawn = False

    def update(self, writer, done_bytes):
        """After a batch is written; done_bytes: the input read up to that batch's end."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < (PROGRESS_TTY_S if self.tty else PROGRESS_PLAIN_S):
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        fraction = done_bytes / max(self.total_bytes, 1)
        figures = (f"{writer.documents:,} docs, {human(writer.tokens)} tokens, "
                   f"{human(writer.documents / elapsed)} docs/s, "
                   f"{human(writer.tokens / elapsed)} tokens/s")
        if self.tty:
            filled = int(24 * min(fraction, 1.0))
            bar = "#" * filled + "." * (24 - filled)
            self.stream.write(f"\r\033[K[{bar}] {100 * fraction:3.0f}% {figures}")
            self.drawn = True
        else:
            self.stream.write(f"{PROG}: {100 * fraction:.0f}% of the input done, {figures}\n")
        self.stream.flush()

    def clear(self):
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = False


# ---------------------------------------------------------------------------------------------

def tokenize_into(writer, reader, spec, args, progress):
    """Every batch through the workers, written in input order; at most a few batches per
    worker in flight, so memory stays bounded whatever the corpus size."""
    # fork where there is one: a worker starts in milliseconds (spawn re-imports numpy and
    # tokenizers, half a second). This process has no thread yet (the pool forks every worker
    # before starting its own) and has not started the Rust pool (TOKENIZERS_PARALLELISM).
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    window = 2 * args.workers + 2
    with concurrent.futures.ProcessPoolExecutor(
            max_workers=args.workers, mp_context=context, initializer=init_worker,
            initargs=(spec, args.text_key)) as pool:
        pending = collections.deque()  # (future, input bytes read up to its batch's end)

        def write_oldest():
            future, read_bytes = pending.popleft()
            write_result(writer, future.result())
            progress.update(writer, read_bytes)

        try:
            for batch in reader.batches():
                pending.append((pool.submit(tokenize_batch, batch), reader.read_bytes))
                if len(pending) >= window:
                    write_oldest()
            while pending:
                write_oldest()
        except BaseException:
            for future, _ in pending:
                future.cancel()
            raise


def write_result(writer, result):
    if result[0] == "error":
        raise UserError(result[1])
    writer.append(result[1], result[2])


def no_documents_message(paths):
    if len(paths) == 1:
        return f"{paths[0]}: no documents in it (empty, or blank lines only)"
    return f"no documents in any input ({', '.join(paths)}): all empty or blank"


def run(args, started):
    bin_path, idx_path = output_paths(args.out)
    check_inputs(args.inputs)
    check_tokenizer_folder(args.tokenizer)
    spec = load_tokenizer(args.tokenizer, args.eos_id)
    loaded = time.monotonic()
    reader = Reader(args.inputs, args.whole_files, args.batch_docs)
    progress = Progress(not args.no_progress, reader.total_bytes)
    writer = DatasetWriter(bin_path, idx_path, spec.dtype)
    try:
        tokenize_into(writer, reader, spec, args, progress)
        if writer.documents == 0:
            raise UserError(no_documents_message(args.inputs))
        writer.commit()
    except BaseException:
        progress.clear()
        writer.abort()
        raise
    progress.clear()
    seconds = time.monotonic() - started
    print(f"{PROG}: {writer.documents} documents, {writer.tokens} tokens, {seconds:.2f} s "
          f"({loaded - started:.2f} s loading the tokenizer), "
          f"{writer.tokens / max(seconds, 1e-9):.0f} tokens/s -> {bin_path} {idx_path}", flush=True)


def main(argv=None):
    started = time.monotonic()
    # Each worker is one encoding thread: N processes use N cores without the Rust pool on top.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"

    def on_signal(signum, frame):
        raise Interrupted(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args, started)
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Interrupted as e:
        print(f"{PROG}: interrupted ({e}); no dataset written", file=sys.stderr)
        return 128 + e.signum
    except WriteError as e:
        print(f"{PROG}: error: {e}; no dataset written", file=sys.stderr)
        return 1
    except concurrent.futures.process.BrokenProcessPool:
        print(f"{PROG}: error: a worker process died (out of memory?); no dataset written",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is written, closed and joined: skip the interpreter's teardown of transformers'
    # modules (half a second).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
