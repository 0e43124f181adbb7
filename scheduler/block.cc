#include "scheduler/block.h"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace loom::sched {

char to_char(BlockKind kind) {
  switch (kind) {
    case BlockKind::kF:
      return 'F';
    case BlockKind::kB:
      return 'B';
    case BlockKind::kI:
      return 'I';
    case BlockKind::kW:
      return 'W';
  }
  return '?';
}

std::optional<BlockKind> parse_block_kind(char c) {
  switch (std::toupper(static_cast<unsigned char>(c))) {
    case 'F':
      return BlockKind::kF;
    case 'B':
      return BlockKind::kB;
    case 'I':
      return BlockKind::kI;
    case 'W':
      return BlockKind::kW;
    default:
      return std::nullopt;
  }
}

Result<BlockId> BlockId::parse(std::string_view text) {
  auto bad = [&] {
    return error("'" + std::string(text) +
                 "' is not a block: expected STAGE KIND MICROBATCH such as 0F0, 1B3, 2I1, 2W1");
  };
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i + 1 >= text.size()) return bad();
  auto kind = parse_block_kind(text[i]);
  if (!kind) return bad();
  std::string_view mb = text.substr(i + 1);
  if (!std::all_of(mb.begin(), mb.end(),
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return bad();
  if (i > 9 || mb.size() > 9) return bad();
  return BlockId::of(std::stoll(std::string(text.substr(0, i))), *kind,
                     std::stoll(std::string(mb)));
}

std::string BlockId::to_string() const {
  return stage.to_string() + to_char(kind) + mb.to_string();
}

std::string BlockId::describe() const {
  return to_string() + " (stage " + stage.to_string() + ", micro-batch " + mb.to_string() + ", " +
         to_char(kind) + ")";
}

bool operator<(const BlockId& a, const BlockId& b) {
  if (a.mb != b.mb) return a.mb < b.mb;
  if (a.stage != b.stage) return a.stage < b.stage;
  return a.kind < b.kind;
}

bool Block::runs_on(DeviceId d) const {
  return std::find(devices.begin(), devices.end(), d) != devices.end();
}

std::string Block::to_string() const {
  std::ostringstream os;
  os << id().to_string() << "@[";
  for (size_t i = 0; i < devices.size(); ++i) os << (i ? "," : "") << devices[i];
  os << "] t=" << duration << " mem=" << memory;
  return os.str();
}

}  // namespace loom::sched
