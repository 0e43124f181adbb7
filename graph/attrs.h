// Operator attributes: a small typed map (ints, reals, bools, strings, int lists).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "core/check.h"

namespace loom::graph {

using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> init) : values_(init) {}

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  void set(const std::string& name, AttrValue value) { values_[name] = std::move(value); }

  template <class T>
  const T& get(const std::string& name) const {
    auto it = values_.find(name);
    LOOM_CHECK(it != values_.end()) << "missing attribute '" << name << "'";
    const T* v = std::get_if<T>(&it->second);
    LOOM_CHECK(v) << "attribute '" << name << "' has another type";
    return *v;
  }
  template <class T>
  T get_or(const std::string& name, T fallback) const {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    const T* v = std::get_if<T>(&it->second);
    return v ? *v : fallback;
  }

  const std::map<std::string, AttrValue>& values() const { return values_; }
  std::string to_string() const;  // "{eps=1e-05, heads=4}"
  bool operator==(const Attrs& o) const { return values_ == o.values_; }

 private:
  std::map<std::string, AttrValue> values_;
};

}  // namespace loom::graph
