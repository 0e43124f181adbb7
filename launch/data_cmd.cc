// loom data prepare ... | inspect PREFIX [--doc K]: token datasets in Megatron-LM's indexed
// format. `prepare` tokenizes text with a Hugging Face tokenizer through the project's Python
// program (launch/data_prepare.py, run by the torch environment's python); `inspect` reads a
// dataset (checking its index against its data file) and prints one JSON line.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "launch/cli_parse.h"
#include "launch/command.h"

namespace loom::cli {
namespace {

int bad_input(const std::string& message) {
  std::fprintf(stderr, "loom data: error: %s\n", message.c_str());
  return kExitBadInput;
}

int inspect(const std::string& prefix, int64_t doc) {
  auto data = data::IndexedDataset::open(prefix);
  if (!data.ok()) return bad_input(data.error().message);
  const data::IndexedDataset& d = **data;
  int64_t longest = 0;
  for (int64_t k = 0; k < d.documents(); ++k) longest = std::max(longest, d.document_length(k));
  nlohmann::ordered_json line = {
      {"prefix", prefix},     {"documents", d.documents()},          {"sequences", d.sequences()},
      {"tokens", d.tokens()}, {"dtype", data::to_string(d.dtype())}, {"longest_document", longest}};
  if (doc >= 0) {
    if (doc >= d.documents())
      return bad_input("--doc " + std::to_string(doc) + ": " + prefix + " has " +
                       std::to_string(d.documents()) + " documents (0 to " +
                       std::to_string(d.documents() - 1) + ")");
    std::vector<int64_t> ids(static_cast<size_t>(d.document_length(doc)));
    d.read_document(doc, 0, static_cast<int64_t>(ids.size()), ids.data());
    line["doc_index"] = doc;
    line["doc"] = ids;
  }
  std::printf("%s\n", line.dump().c_str());
  return kExitOk;
}

// The python that has the tokenizers: LOOM_PYTHON, else the torch environment's.
std::string python() {
  if (const char* p = std::getenv("LOOM_PYTHON"); p && *p) return p;
  return LOOM_TORCH_PYTHON;
}

int prepare(const Args& args) {
  const std::string py = python();
  const std::string script = std::string(LOOM_SOURCE_DIR) + "/launch/data_prepare.py";
  if (::access(py.c_str(), X_OK) != 0)
    return bad_input(
        "loom data prepare runs the Hugging Face tokenizer in python, and there is "
        "none at '" +
        py +
        "' (scripts/install-deps installs it; LOOM_PYTHON names "
        "another python with transformers)");
  if (::access(script.c_str(), R_OK) != 0)
    return bad_input("cannot read '" + script + "', loom data prepare's program");
  std::vector<std::string> argv_text = {py, script};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  ::execv(py.c_str(), argv.data());
  std::fprintf(stderr, "loom data prepare: cannot run %s: %s\n", py.c_str(), std::strerror(errno));
  return kExitFailure;
}

}  // namespace

int data_main(const Args& args) {
  // prepare's flags are its program's own: everything after the verb goes to it unparsed.
  if (!args.empty() && args[0] == "prepare") return prepare(Args(args.begin() + 1, args.end()));
  CLI::App app{"Token datasets in Megatron-LM's indexed format (PREFIX.bin + PREFIX.idx).",
               "loom data"};
  app.require_subcommand(1);
  app.add_subcommand("prepare",
                     "tokenize text: prepare --tokenizer HF_DIR --out PREFIX INPUT... (--help)");
  std::string prefix;
  int64_t doc = -1;
  CLI::App* inspect_cmd = app.add_subcommand(
      "inspect", "check a dataset and print {documents, tokens, dtype, ...}: inspect PREFIX");
  inspect_cmd->add_option("prefix", prefix, "the dataset: PREFIX.bin and PREFIX.idx")->required();
  inspect_cmd->add_option("--doc", doc, "also print the token ids of document K")
      ->check(CLI::NonNegativeNumber);
  if (auto code = parse_args(app, args, "data")) return *code;
  return inspect(prefix, doc);
}

}  // namespace loom::cli
