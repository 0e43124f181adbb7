#include "runtime/rank_agreement.h"

#include <ATen/ATen.h>

#include <cstring>
#include <map>

#include "runtime/build_info.h"

namespace loom::runtime {
namespace {

int64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  int64_t out = 0;
  std::memcpy(&out, &h, sizeof out);
  return out;
}

// Every rank's `text`, gathered (packed 8 bytes to an int64: every backend moves int64).
Result<std::vector<std::string>> all_gather_text(comm::Comm& world, const RunDevice& device,
                                                 const std::string& text) {
  const int64_t n = world.size();
  at::Tensor size = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  at::Tensor sizes = at::empty({n}, device.options(at::kLong));
  LOOM_TRY(world.all_gather_flat(sizes, size.to(device.device)));
  const at::Tensor host_sizes = sizes.cpu();
  const int64_t longest = host_sizes.max().item<int64_t>();
  const int64_t words = (longest + 7) / 8;
  at::Tensor mine = at::zeros({words}, at::kLong);
  std::memcpy(mine.data_ptr<int64_t>(), text.data(), text.size());
  at::Tensor all = at::empty({n * words}, device.options(at::kLong));
  LOOM_TRY(world.all_gather_flat(all, mine.to(device.device)));
  const at::Tensor host = all.cpu();
  const char* bytes = reinterpret_cast<const char*>(host.data_ptr<int64_t>());
  std::vector<std::string> out;
  for (int64_t r = 0; r < n; ++r)
    out.emplace_back(bytes + r * words * 8, static_cast<size_t>(host_sizes[r].item<int64_t>()));
  return out;
}

RankFacts parse_facts(const std::string& text) {
  RankFacts f;
  const size_t a = text.find('\0'), b = text.find('\0', a + 1);
  f.config_yaml = text.substr(0, a);
  f.plan = a == std::string::npos ? "" : text.substr(a + 1, b - a - 1);
  f.build = b == std::string::npos ? "" : text.substr(b + 1);
  return f;
}

std::string shown(const std::string& value) { return value.empty() ? "(not set)" : value; }

// What rank `r` does differently from rank 0, most fundamental first.
std::string first_difference(const RankFacts& zero, const RankFacts& other, int r) {
  const std::string rank = "rank " + std::to_string(r);
  if (zero.build != other.build)
    return rank + " runs another build of loom than rank 0: " + other.build + " on " + rank + ", " +
           zero.build + " on rank 0; install the same loom on every node";
  if (zero.config_yaml != other.config_yaml) {
    const auto mine = flatten_config_yaml(zero.config_yaml);
    const auto theirs = flatten_config_yaml(other.config_yaml);
    std::map<std::string, std::string> theirs_by_key(theirs.begin(), theirs.end());
    std::map<std::string, std::string> mine_by_key(mine.begin(), mine.end());
    std::string key, a, b;
    for (const auto& [k, v] : mine)
      if (key.empty() && (!theirs_by_key.count(k) || theirs_by_key[k] != v)) {
        key = k;
        a = v;
        b = theirs_by_key.count(k) ? theirs_by_key[k] : "";
      }
    for (const auto& [k, v] : theirs)
      if (key.empty() && !mine_by_key.count(k)) {
        key = k;
        b = v;
      }
    return rank + " was started with another config than rank 0: " + key + " is " + shown(a) +
           " on rank 0 and " + shown(b) + " on " + rank +
           "; start every rank with the same config file and overrides";
  }
  return rank + " made another plan than rank 0 from the same config (plan " + other.plan + " on " +
         rank + ", " + zero.plan +
         " on rank 0): give every rank the same plan.json, cost model and model files";
}

}  // namespace

std::vector<std::pair<std::string, std::string>> flatten_config_yaml(const std::string& yaml) {
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::pair<size_t, std::string>> sections;  // (indent, name) of open mappings
  size_t start = 0;
  while (start < yaml.size()) {
    size_t end = yaml.find('\n', start);
    if (end == std::string::npos) end = yaml.size();
    const std::string line = yaml.substr(start, end - start);
    start = end + 1;
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos) continue;
    const std::string body = line.substr(indent);
    while (!sections.empty() && sections.back().first >= indent) sections.pop_back();
    std::string path;
    for (const auto& s : sections) path += s.second + ".";
    const size_t colon = body.find(": ");
    const bool item = body.rfind("- ", 0) == 0 || body == "[]" || body == "{}";
    if (item || (colon == std::string::npos && body.back() != ':')) {
      // A list item or flow value belongs to the key just above it.
      if (!out.empty()) out.back().second += (out.back().second.empty() ? "" : " ") + body;
      continue;
    }
    if (colon == std::string::npos) {  // "key:" opens a mapping or a block list
      const std::string key = body.substr(0, body.size() - 1);
      out.emplace_back(path + key, "");
      sections.emplace_back(indent, key);
      continue;
    }
    out.emplace_back(path + body.substr(0, colon), body.substr(colon + 2));
  }
  // A key that opened a mapping holds no value of its own.
  std::vector<std::pair<std::string, std::string>> leaves;
  for (size_t i = 0; i < out.size(); ++i) {
    const bool parent = i + 1 < out.size() && out[i + 1].first.rfind(out[i].first + ".", 0) == 0;
    if (!parent) leaves.push_back(out[i]);
  }
  return leaves;
}

RankFacts facts_of(const Config& config, const std::string& plan_digest) {
  const BuildInfo b = build_info();
  return RankFacts{
      to_yaml(config), plan_digest,
      "loom " + b.loom + " (build id " + b.build_id + ", LibTorch " + b.libtorch + ")"};
}

Status check_ranks_agree(comm::Comm& world, const RunDevice& device, const RankFacts& mine) {
  const int n = world.size();
  if (n == 1) return Status::success();
  at::Tensor digest =
      at::tensor(std::vector<int64_t>{fnv1a(mine.config_yaml), fnv1a(mine.plan), fnv1a(mine.build)},
                 at::kLong);
  at::Tensor all = at::empty({n * 3}, device.options(at::kLong));
  LOOM_TRY(world.all_gather_flat(all, digest.to(device.device)));
  const at::Tensor host = all.cpu();
  const int64_t* d = host.data_ptr<int64_t>();
  std::vector<int> differ;
  for (int r = 1; r < n; ++r)
    if (std::memcmp(d, d + 3 * r, 3 * sizeof(int64_t)) != 0) differ.push_back(r);
  if (differ.empty()) return Status::success();
  // Every rank learns what differs, so that each stops with the same message.
  LOOM_ASSIGN_OR_RETURN(
      std::vector<std::string> texts,
      all_gather_text(world, device, mine.config_yaml + '\0' + mine.plan + '\0' + mine.build));
  std::string ranks;
  for (size_t i = 0; i < differ.size() && i < 16; ++i)
    ranks += (i ? ", " : "") + std::to_string(differ[i]);
  if (differ.size() > 16) ranks += " and " + std::to_string(differ.size() - 16) + " more";
  const int first = differ.front();
  return Error{"the ranks do not run the same thing: " +
                   first_difference(parse_facts(texts[0]),
                                    parse_facts(texts[static_cast<size_t>(first)]), first) +
                   " (" + (differ.size() == 1 ? "rank " : "ranks ") + ranks + " of " +
                   std::to_string(n) + (differ.size() == 1 ? " differs" : " differ") +
                   " from rank 0)",
               {}};
}

}  // namespace loom::runtime
