#include "runtime/data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

namespace loom::runtime {
namespace {

class SyntheticSource : public TokenSource {
 public:
  SyntheticSource(uint64_t seed, int64_t vocab) : seed_(seed), vocab_(vocab) {}
  Status sample(int64_t index, int64_t seq, int64_t* out) const override {
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index));
    int64_t start = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab_));
    int64_t stride = 1 + static_cast<int64_t>(rng() % 7);
    for (int64_t t = 0; t <= seq; ++t) out[t] = (start + stride * t) % vocab_;
    return Status::success();
  }

 private:
  uint64_t seed_;
  int64_t vocab_;
};

class TokenFileSource : public TokenSource {
 public:
  TokenFileSource(std::string path, std::vector<uint32_t> tokens, int64_t vocab)
      : path_(std::move(path)), tokens_(std::move(tokens)), vocab_(vocab) {}
  Status sample(int64_t index, int64_t seq, int64_t* out) const override {
    const int64_t windows = (static_cast<int64_t>(tokens_.size()) - 1) / seq;
    const int64_t offset = (index % windows) * seq;
    for (int64_t t = 0; t <= seq; ++t) {
      int64_t id = tokens_[offset + t];
      if (id >= vocab_)
        return Error::at(path_, path_ + ": token " + std::to_string(id) + " at position " +
                                    std::to_string(offset + t) + " is outside the vocabulary (" +
                                    std::to_string(vocab_) + ")");
      out[t] = id;
    }
    return Status::success();
  }

 private:
  std::string path_;
  std::vector<uint32_t> tokens_;
  int64_t vocab_;
};

}  // namespace

Result<std::unique_ptr<TokenSource>> make_token_source(const Config& config, int64_t vocab,
                                                       int64_t seq) {
  if (config.data.type == "synthetic")
    return std::unique_ptr<TokenSource>(
        std::make_unique<SyntheticSource>(static_cast<uint64_t>(config.run.seed), vocab));
  const std::string& path = config.data.path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return config.error("data.path", "'" + path +
                                         "' is a directory; data.path is one token file (the ids "
                                         "of the whole corpus, data.token_bytes each)");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return config.error("data.path", "cannot read token file '" + path + "'");
  const std::streamsize bytes = in.tellg();
  const int64_t width = config.data.token_bytes;  // 2 or 4 (core/config.cc)
  const std::string kind = width == 2 ? "uint16" : "uint32";
  if (bytes % width != 0)
    return config.error("data.path", "token file '" + path + "' has " + std::to_string(bytes) +
                                         " bytes, not a whole number of " + kind +
                                         " ids (data.token_bytes " + std::to_string(width) + ")");
  const int64_t count = bytes / width;
  if (count < seq + 1)
    return config.error("data.path", "token file '" + path + "' holds " + std::to_string(count) +
                                         " tokens; one sample needs " + std::to_string(seq + 1));
  std::vector<uint32_t> tokens(static_cast<size_t>(count));
  in.seekg(0);
  if (width == 4) {
    in.read(reinterpret_cast<char*>(tokens.data()), bytes);
  } else {
    std::vector<uint16_t> narrow(static_cast<size_t>(count));
    in.read(reinterpret_cast<char*>(narrow.data()), bytes);
    std::copy(narrow.begin(), narrow.end(), tokens.begin());
  }
  if (!in) return config.error("data.path", "failed to read token file '" + path + "'");
  // Every id is checked now, before step 1 (and before any checkpoint is written), not when the
  // step that reads it comes.
  const auto outside = std::find_if(tokens.begin(), tokens.end(), [vocab](uint32_t id) {
    return static_cast<int64_t>(id) >= vocab;
  });
  if (outside != tokens.end())
    return config.error("data.path",
                        "token file '" + path + "': token " + std::to_string(*outside) +
                            " at position " + std::to_string(outside - tokens.begin()) +
                            " is outside the model's vocabulary (" + std::to_string(vocab) + ")");
  return std::unique_ptr<TokenSource>(
      std::make_unique<TokenFileSource>(path, std::move(tokens), vocab));
}

}  // namespace loom::runtime
