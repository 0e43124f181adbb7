#include "scheduler/csv.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "core/strings.h"
#include "scheduler/simulator.h"

namespace loom::sched {

std::string to_string(CsvActions actions) {
  switch (actions) {
    case CsvActions::kFullBackward:
      return "full-backward";
    case CsvActions::kInputWeight:
      return "input-weight";
    case CsvActions::kBackwardWeight:
      return "backward-weight";
  }
  return "full-backward";
}

std::string describe(CsvActions actions) {
  switch (actions) {
    case CsvActions::kFullBackward:
      return "F + B (full backwards, the same under torch's older and current names)";
    case CsvActions::kInputWeight:
      return "I + W (torch's current names: I the input gradient, W the weight gradient)";
    case CsvActions::kBackwardWeight:
      return "B + W (torch's names before it renamed the input gradient I: B followed by W of "
             "the same stage and micro-batch is I + W)";
  }
  return "";
}

std::string CsvCell::to_string() const {
  return "row " + std::to_string(row) + ", column " + std::to_string(column);
}

Result<std::string> to_csv(const Schedule& s) {
  SimOptions steps;
  steps.unit_durations = true;
  LOOM_ASSIGN_OR_RETURN(Timeline t, simulate(s, steps));
  const int columns = static_cast<int>(std::lround(t.makespan));
  std::ostringstream os;
  for (int d = 0; d < s.num_devices(); ++d) {
    std::vector<std::string> cells(columns);
    for (int i : s.order()[d])
      cells[static_cast<int>(std::lround(t.start[i]))] = s.workload().block(i).id().to_string();
    os << join(cells, ",") << "\n";
  }
  return os.str();
}

namespace {

// One action as written: its block and its cell (a composite cell holds several).
struct Listed {
  BlockId id;
  CsvCell cell;
  int rank = 0;
};

using StageMb = std::pair<int64_t, int64_t>;  // (stage, micro-batch)

Error at(const CsvCell& cell, const std::string& message) {
  return error(cell.to_string() + ": " + message);
}

std::string row_of(int rank) { return "row " + std::to_string(rank + 1); }

std::string rows_of(const std::vector<int>& ranks) {
  std::vector<std::string> rows;
  for (int r : ranks) rows.push_back(std::to_string(r + 1));
  return (ranks.size() == 1 ? "row " : "rows ") + join(rows, ", ");
}

// The actions of one cell in the order they run: none (idle), one, or a composite
// "(a;b;...)OVERLAP_F_B" (torch's name for a forward and a backward overlapped in one step).
Result<std::vector<BlockId>> parse_cell(std::string_view text) {
  std::string_view cell = trim(text);
  if (cell.empty()) return std::vector<BlockId>{};
  if (cell.front() != '(') {
    LOOM_ASSIGN_OR_RETURN(BlockId id, BlockId::parse(cell));
    return std::vector<BlockId>{id};
  }
  const size_t close = cell.find(')');
  const std::string quoted = "'" + std::string(cell) + "'";
  if (close == std::string_view::npos)
    return error(quoted +
                 " opens '(' without closing it; a composite cell is written "
                 "(0F7;7B3)OVERLAP_F_B");
  if (trim(cell.substr(close + 1)) != "OVERLAP_F_B")
    return error(quoted + " is a composite cell of an unknown kind; expected (0F7;7B3)OVERLAP_F_B");
  std::vector<BlockId> out;
  for (const std::string& part : split(cell.substr(1, close - 1), ';')) {
    if (trim(part).empty())
      return error(quoted +
                   " has an empty action; a composite cell is written "
                   "(0F7;7B3)OVERLAP_F_B");
    LOOM_ASSIGN_OR_RETURN(BlockId id, BlockId::parse(trim(part)));
    out.push_back(id);
  }
  return out;
}

// Every action of the file, row by row; a row is a rank. Blank lines may only end the file.
Result<std::vector<std::vector<Listed>>> parse_rows(const std::string& text) {
  std::vector<std::vector<Listed>> rows;
  std::istringstream in(text);
  std::string line;
  int blank = 0;  // the first blank line seen, 0 if none
  for (int row = 1; std::getline(in, line); ++row) {
    if (trim(line).empty()) {
      if (!blank) blank = row;
      continue;
    }
    if (blank)
      return error("row " + std::to_string(blank) +
                   " is blank: every row is a rank (a rank that idles has a row of empty cells)");
    rows.emplace_back();
    const std::vector<std::string> cells = split(line, ',');
    for (size_t c = 0; c < cells.size(); ++c) {
      const CsvCell cell{row, static_cast<int>(c) + 1};
      auto ids = parse_cell(cells[c]);
      if (!ids.ok()) return at(cell, ids.error().message);
      for (const BlockId& id : *ids) rows.back().push_back({id, cell, row - 1});
    }
  }
  if (rows.empty()) return error("the schedule has no rows");
  return rows;
}

// Which naming the rows use; under torch's older one, each B that a W of its stage and
// micro-batch follows becomes the I it stands for. A file that writes I uses the current names,
// where B + W of one micro-batch at one stage is a mistake split_backwards reports.
CsvActions read_actions(std::vector<std::vector<Listed>>& rows) {
  std::set<StageMb> weighed;  // (stage, micro-batch) pairs with a W
  for (const auto& row : rows)
    for (const Listed& l : row) {
      if (l.id.kind == BlockKind::kI) return CsvActions::kInputWeight;
      if (l.id.kind == BlockKind::kW) weighed.insert({l.id.stage.value(), l.id.mb.value()});
    }
  if (weighed.empty()) return CsvActions::kFullBackward;
  bool renamed = false;
  for (auto& row : rows)
    for (Listed& l : row)
      if (l.id.kind == BlockKind::kB && weighed.count({l.id.stage.value(), l.id.mb.value()})) {
        l.id.kind = BlockKind::kI;
        renamed = true;
      }
  return renamed ? CsvActions::kBackwardWeight : CsvActions::kInputWeight;
}

// What the rows say about each block: the ranks that list it, and where.
struct Listing {
  std::vector<int> ranks;  // ascending
  CsvCell cell;            // the first listing
};

// A block is listed once per rank that runs it; ranks that run a block together list it in
// one column (what to_csv writes), so any other repetition is a mistake.
Result<std::map<BlockId, Listing>> list_blocks(const std::vector<std::vector<Listed>>& rows) {
  std::map<BlockId, Listing> out;
  for (const auto& row : rows)
    for (const Listed& l : row) {
      auto [it, fresh] = out.try_emplace(l.id, Listing{{l.rank}, l.cell});
      if (fresh) continue;
      const CsvCell& first = it->second.cell;
      if (it->second.ranks.back() == l.rank || first.column != l.cell.column)
        return at(l.cell, "block " + l.id.describe() + " is listed twice (first at " +
                              first.to_string() +
                              "); ranks that run a block together list it in one column");
      it->second.ranks.push_back(l.rank);
    }
  return out;
}

// The ranks of each (stage, micro-batch): those that run most of the stage's blocks, unless
// none of the micro-batch's blocks runs there (a stage that moves per micro-batch, as in
// Chimera): then those of its first listed block. A block elsewhere is an error at its cell.
Result<std::map<StageMb, std::vector<int>>> stage_ranks(
    const std::vector<std::vector<Listed>>& rows, const std::map<BlockId, Listing>& listing) {
  std::map<int64_t, std::map<std::vector<int>, int>> votes;  // stage -> rank set -> blocks
  for (const auto& [id, l] : listing) ++votes[id.stage.value()][l.ranks];
  std::map<int64_t, std::vector<int>> usual;
  for (const auto& [stage, counts] : votes) {
    int best = 0;
    for (const auto& [ranks, n] : counts)
      if (n > best) best = n, usual[stage] = ranks;  // ties: the lowest ranks
  }
  std::map<StageMb, std::vector<int>> out;
  for (const auto& [id, l] : listing) {
    const StageMb key{id.stage.value(), id.mb.value()};
    auto& ranks = out[key];
    if (ranks.empty() || l.ranks == usual[key.first]) ranks = l.ranks;
  }
  for (const auto& row : rows)
    for (const Listed& b : row) {
      const std::vector<int>& expected = out[{b.id.stage.value(), b.id.mb.value()}];
      const std::vector<int>& got = listing.at(b.id).ranks;
      if (got != expected)
        return at(listing.at(b.id).cell, "block " + b.id.describe() + " runs on " + rows_of(got) +
                                             ", but stage " + b.id.stage.to_string() + " runs on " +
                                             rows_of(expected) +
                                             (expected == usual[b.id.stage.value()]
                                                  ? ""
                                                  : " for micro-batch " + b.id.mb.to_string()));
    }
  return out;
}

// Per (stage, micro-batch) whether its backward is split into I + W; refuses one that is both.
Result<std::map<StageMb, bool>> split_backwards(const std::vector<std::vector<Listed>>& rows,
                                                const std::map<BlockId, Listing>& listing) {
  std::map<StageMb, bool> split;
  for (const auto& row : rows)
    for (const Listed& b : row) {
      if (b.id.kind == BlockKind::kF) continue;
      const bool is_split = b.id.kind != BlockKind::kB;
      auto [it, fresh] = split.try_emplace({b.id.stage.value(), b.id.mb.value()}, is_split);
      if (fresh || it->second == is_split) continue;
      const BlockId whole = BlockId{b.id.stage, b.id.mb, BlockKind::kB};
      const BlockId other = is_split ? whole
                            : listing.count({b.id.stage, b.id.mb, BlockKind::kI})
                                ? BlockId{b.id.stage, b.id.mb, BlockKind::kI}
                                : BlockId{b.id.stage, b.id.mb, BlockKind::kW};
      return at(b.cell, "block " + b.id.to_string() + " and " + other.to_string() + " (at " +
                            listing.at(other).cell.to_string() +
                            ") both run the backward of stage " + b.id.stage.to_string() +
                            ", micro-batch " + b.id.mb.to_string() +
                            "; a backward is either B or I + W");
    }
  return split;
}

// The first block of the chain that no row lists, with the row that should run it.
Status check_complete(int stages, int mbs, const std::map<BlockId, Listing>& listing,
                      const std::map<StageMb, std::vector<int>>& ranks,
                      const std::map<StageMb, bool>& split) {
  std::map<int64_t, std::vector<int>> any_ranks;  // stage -> the ranks of one of its blocks
  for (const auto& [key, r] : ranks) any_ranks.try_emplace(key.first, r);
  for (int k = 0; k < mbs; ++k)
    for (int s = 0; s < stages; ++s) {
      auto sp = split.find({s, k});
      const bool is_split = sp != split.end() && sp->second;
      std::vector<BlockKind> kinds = {BlockKind::kF};
      if (is_split)
        kinds.insert(kinds.end(), {BlockKind::kI, BlockKind::kW});
      else
        kinds.push_back(BlockKind::kB);
      for (BlockKind kind : kinds) {
        const BlockId id = BlockId::of(s, kind, k);
        if (listing.count(id)) continue;
        auto r = ranks.find({s, k});
        if (r != ranks.end())
          return error("block " + id.describe() + " is missing: " + rows_of(r->second) +
                       ", which runs stage " + std::to_string(s) + " for micro-batch " +
                       std::to_string(k) + ", does not list it");
        auto a = any_ranks.find(s);
        if (a != any_ranks.end())
          return error("block " + id.describe() + " is missing: " + rows_of(a->second) +
                       ", which runs stage " + std::to_string(s) + ", does not list it");
        return error("block " + id.describe() + " is missing: no row runs stage " +
                     std::to_string(s) + " (the schedule names stages 0.." +
                     std::to_string(stages - 1) + ")");
      }
    }
  return Status::success();
}

// Runs the rows as ranks do (a block starts once its dependencies have ended and, when several
// ranks run it, all of them have reached it) and reports where they get stuck: the first block
// that waits for a dependency its own row runs later can never start; otherwise each stuck
// rank's cell and what it waits for is the deadlock.
Status check_runs(const Workload& w, const std::vector<std::vector<int>>& order,
                  const std::vector<CsvCell>& cells, const std::vector<std::vector<Listed>>& rows) {
  const int p = static_cast<int>(order.size());
  std::vector<size_t> pos(static_cast<size_t>(p), 0);
  std::vector<bool> done(static_cast<size_t>(w.size()), false);
  auto at_block = [&](int r) { return pos[r] < order[r].size() ? order[r][pos[r]] : -1; };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      const int i = at_block(r);
      if (i < 0) continue;
      bool ready = true;
      for (int d : w.deps(i)) ready &= done[d];
      for (DeviceId dev : w.block(i).devices) ready &= at_block(dev.value()) == i;
      if (!ready) continue;
      done[i] = true;
      for (DeviceId dev : w.block(i).devices) ++pos[dev.value()];
      progress = true;
    }
  }
  // Where each of a rank's blocks sits in its row, to tell a dependency listed later.
  auto cell_on = [&](int rank, int block) -> std::optional<CsvCell> {
    for (const Listed& l : rows[rank])
      if (l.id == w.block(block).id()) return l.cell;
    return std::nullopt;
  };
  std::vector<std::string> stuck;
  for (int r = 0; r < p; ++r) {
    const int i = at_block(r);
    if (i < 0) continue;
    const CsvCell here = *cell_on(r, i);
    const std::string what = w.block(i).id().to_string();
    for (int d : w.deps(i))
      if (!done[d])
        if (auto later = cell_on(r, d))
          return at(here, "block " + what + " waits for " + w.block(d).id().to_string() +
                              ", which its row runs later (" + later->to_string() +
                              "): it can never start");
    std::string waits;
    for (int d : w.deps(i))
      if (!done[d]) {
        waits = w.block(d).id().to_string() + " (" + cells[d].to_string() + ")";
        break;
      }
    if (waits.empty())
      for (DeviceId dev : w.block(i).devices)
        if (at_block(dev.value()) != i) {
          waits = row_of(static_cast<int>(dev.value())) + " to reach it";
          break;
        }
    stuck.push_back(here.to_string() + " (" + what + ") waits for " + waits);
  }
  if (stuck.empty()) return Status::success();
  return error("the schedule deadlocks: " + join(stuck, "; "));
}

// read_csv past parsing, on the rows as loom names their actions.
Result<CsvSchedule> read_rows(const std::vector<std::vector<Listed>>& rows,
                              const CsvImportOptions& opt) {
  LOOM_ASSIGN_OR_RETURN(auto listing, list_blocks(rows));
  int64_t stages = 0, mbs = 0;
  for (const auto& [id, l] : listing) {
    stages = std::max(stages, id.stage.value() + 1);
    mbs = std::max(mbs, id.mb.value() + 1);
  }
  if (listing.empty()) return error("the schedule lists no blocks");
  LOOM_ASSIGN_OR_RETURN(auto ranks, stage_ranks(rows, listing));
  LOOM_ASSIGN_OR_RETURN(auto split, split_backwards(rows, listing));
  LOOM_TRY(check_complete(static_cast<int>(stages), static_cast<int>(mbs), listing, ranks, split));

  const int p = static_cast<int>(rows.size());
  const double v = stages % p == 0 ? static_cast<double>(stages / p) : 1.0;
  ChainLayout l;
  l.num_devices = p;
  l.num_stages = static_cast<int>(stages);
  l.micro_batches = static_cast<int>(mbs);
  l.devices = [&ranks](StageId s, MicroBatch k) {
    std::vector<DeviceId> out;
    for (int r : ranks.at({s.value(), k.value()})) out.emplace_back(r);
    return out;
  };
  l.split_at = [&split](StageId s, MicroBatch k) {
    auto it = split.find({s.value(), k.value()});
    return it != split.end() && it->second;
  };
  l.duration = [&opt, v](BlockKind k, StageId) {
    switch (k) {
      case BlockKind::kF:
        return opt.fwd / v;
      case BlockKind::kB:
        return opt.bwd / v;
      case BlockKind::kI:
        return (opt.input > 0 ? opt.input : opt.bwd) / v;
      case BlockKind::kW:
        return opt.wgrad / v;
    }
    return 0.0;
  };
  l.memory = [v](BlockKind k, StageId) { return block_memory(k) / v; };
  LOOM_ASSIGN_OR_RETURN(Workload w, Workload::chain(l));

  CsvSchedule out;
  out.num_stages = static_cast<int>(stages);
  out.micro_batches = static_cast<int>(mbs);
  out.cells.resize(static_cast<size_t>(w.size()));
  std::vector<std::vector<int>> order(rows.size());
  for (size_t r = 0; r < rows.size(); ++r)
    for (const Listed& b : rows[r]) order[r].push_back(*w.find(b.id));
  for (int i = 0; i < w.size(); ++i)
    out.cells[static_cast<size_t>(i)] = listing.at(w.block(i).id()).cell;
  LOOM_TRY(check_runs(w, order, out.cells, rows));
  LOOM_ASSIGN_OR_RETURN(out.schedule,
                        Schedule::from_indices(std::move(w), std::move(order), "csv"));
  return out;
}

}  // namespace

Result<CsvSchedule> read_csv(const std::string& text, const CsvImportOptions& opt) {
  LOOM_ASSIGN_OR_RETURN(auto rows, parse_rows(text));
  const CsvActions actions = read_actions(rows);
  auto read = read_rows(rows, opt);
  if (!read.ok() && actions == CsvActions::kBackwardWeight)
    return error(read.error().message +
                 " (the file writes torch's older action names: a B followed by a W of the same "
                 "stage and micro-batch is read as I + W)");
  if (read.ok()) read->actions = actions;
  return read;
}

Result<Schedule> from_csv(const std::string& text, const CsvImportOptions& options) {
  LOOM_ASSIGN_OR_RETURN(CsvSchedule s, read_csv(text, options));
  return std::move(s.schedule);
}

}  // namespace loom::sched
