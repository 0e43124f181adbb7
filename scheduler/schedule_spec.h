// Which pipeline schedule a plan runs, as a value: a predefined kind, the repetend search (with
// or without the backward split into input- and weight-gradient blocks), or a schedule imported
// from a torch.distributed.pipelining CSV. parallel.schedule and `loom schedule --kind` are read
// into one once; every later decision dispatches on it.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "core/result.h"
#include "scheduler/predefined.h"

namespace loom::sched {

class ScheduleSpec {
 public:
  struct Predefined {
    ScheduleKind kind = ScheduleKind::k1F1B;
  };
  struct Searched {
    bool split_backward = false;  // search-zb: B split into I and W blocks
  };
  struct Imported {
    std::string csv;  // the file's path
  };

  static ScheduleSpec predefined(ScheduleKind kind) { return ScheduleSpec(Predefined{kind}); }
  static ScheduleSpec searched(bool split_backward) {
    return ScheduleSpec(Searched{split_backward});
  }
  static ScheduleSpec imported(std::string csv) { return ScheduleSpec(Imported{std::move(csv)}); }
  // `name` as parallel.schedule spells it (a predefined kind, search, search-zb or csv; csv reads
  // `csv`). The error names the unknown name and the closest known one.
  static Result<ScheduleSpec> parse(const std::string& name, const std::string& csv = "");
  // Every name parse() accepts.
  static std::vector<std::string> names();

  const Predefined* as_predefined() const { return std::get_if<Predefined>(&v_); }
  const Searched* as_searched() const { return std::get_if<Searched>(&v_); }
  const Imported* as_imported() const { return std::get_if<Imported>(&v_); }
  bool is(ScheduleKind kind) const { return as_predefined() && as_predefined()->kind == kind; }
  // Whether every backward runs as input- and weight-gradient blocks (zb-h1, search-zb); an
  // imported schedule says so per block, not here.
  bool splits_backward() const {
    return is(ScheduleKind::kZbH1) || (as_searched() && as_searched()->split_backward);
  }

  std::string name() const;  // as parse() reads it: "1f1b", "search-zb", "csv"
  bool operator==(const ScheduleSpec& o) const { return name() == o.name() && csv() == o.csv(); }

 private:
  using Variant = std::variant<Predefined, Searched, Imported>;
  explicit ScheduleSpec(Variant v) : v_(std::move(v)) {}
  std::string csv() const { return as_imported() ? as_imported()->csv : std::string(); }
  Variant v_;
};

}  // namespace loom::sched
