// LOOM_CHECK: invariants that only a bug in loom can break. A failed check throws
// loom::InternalError carrying the condition, the call site and the streamed context.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": check failed: " << condition << ": ";
  }
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure() noexcept(false) { throw InternalError(stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace detail
}  // namespace loom

#define LOOM_CHECK(cond) \
  if (cond) {            \
  } else                 \
    ::loom::detail::CheckFailure(__FILE__, __LINE__, #cond).stream()
