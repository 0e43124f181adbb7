// Result<T> and Status: how planning and user-input failures travel. The message names what
// was wrong (the op, tensor, config key or rank); exceptions are kept for process and LibTorch
// boundaries.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "core/check.h"

namespace loom {

// A failure caused by input (config, plan, placement, command line) or by a request the
// planner cannot satisfy. `key` is the config key or file it concerns, when there is one.
struct Error {
  std::string message;
  std::string key;

  static Error at(std::string key, std::string message) {
    return Error{std::move(message), std::move(key)};
  }
  // "key: message" when a key is known.
  std::string to_string() const { return key.empty() ? message : key + ": " + message; }
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  const T& value() const& {
    LOOM_CHECK(ok()) << "value() of a failed Result: " << error().to_string();
    return std::get<0>(v_);
  }
  T& value() & {
    LOOM_CHECK(ok()) << "value() of a failed Result: " << error().to_string();
    return std::get<0>(v_);
  }
  T&& value() && {
    LOOM_CHECK(ok()) << "value() of a failed Result: " << error().to_string();
    return std::get<0>(std::move(v_));
  }
  const Error& error() const { return std::get<1>(v_); }

  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  std::variant<T, Error> v_;
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT: implicit by design
  static Status success() { return Status(); }

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace loom

#define LOOM_CONCAT_INNER(a, b) a##b
#define LOOM_CONCAT(a, b) LOOM_CONCAT_INNER(a, b)

// Returns the error of a failed Status or Result from the enclosing function.
#define LOOM_TRY(expr)                                           \
  do {                                                           \
    auto&& loom_try_result_ = (expr);                            \
    if (!loom_try_result_.ok()) return loom_try_result_.error(); \
  } while (0)

// `LOOM_ASSIGN_OR_RETURN(auto x, make_x());`
#define LOOM_ASSIGN_OR_RETURN(lhs, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL(LOOM_CONCAT(loom_result_, __LINE__), lhs, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.error();               \
  lhs = std::move(tmp).value()
