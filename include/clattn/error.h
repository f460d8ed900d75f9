// The one error type of clattn. Messages name the rule that was broken and the values seen,
// e.g. "attention: q and k must have the same head dim (Dk): q is (1, 8, 64, 64), k is (1, 8, 64, 32)".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace clattn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Values that are not finite, or finite values whose float arithmetic would overflow (the
// overflow rule of the attentions): in training, the mark of a diverged run (Trainer reports
// "diverged at step S" on it). Messages as Error's.
class NumericError : public Error {
 public:
  explicit NumericError(const std::string& what) : Error(what) {}
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Throws Error with the streamed arguments as its message.
template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

// Throws Error(args...) unless cond holds. The message is only built on failure.
template <class... Args>
inline void check(bool cond, const Args&... args) {
  if (!cond) [[unlikely]] fail(args...);
}

}  // namespace clattn
