#include "scheduler/schedule_spec.h"

#include "core/strings.h"

namespace loom::sched {

namespace {
constexpr const char* kSearch = "search";
constexpr const char* kSearchZb = "search-zb";
constexpr const char* kCsv = "csv";
}  // namespace

std::vector<std::string> ScheduleSpec::names() {
  std::vector<std::string> out = schedule_kind_names();
  out.insert(out.end(), {kSearch, kSearchZb, kCsv});
  return out;
}

Result<ScheduleSpec> ScheduleSpec::parse(const std::string& name, const std::string& csv) {
  if (name == kSearch || name == kSearchZb) return searched(name == kSearchZb);
  if (name == kCsv) return imported(csv);
  for (const std::string& known : schedule_kind_names())
    if (known == name) return predefined(parse_schedule_kind(name).value());
  const std::vector<std::string> known = names();
  const std::string hint = closest_match(name, known);
  return Error::at("schedule", "unknown schedule '" + name + "'" +
                                   (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
                                   "; known: " + join(known, ", "));
}

std::string ScheduleSpec::name() const {
  if (const Predefined* p = as_predefined()) return to_string(p->kind);
  if (const Searched* s = as_searched()) return s->split_backward ? kSearchZb : kSearch;
  return kCsv;
}

}  // namespace loom::sched
