#pragma once
/// @file
/// anvil's exception types. Light header.
///
/// Every error anvil raises derives from `anvil::Error` and names what is at fault (the
/// field, file, rank or env). `install_error_handler()` (called by `parse_config`) turns
/// an uncaught `anvil::Error` into a one-line message and a non-zero exit instead of an
/// abort, so bad input never looks like a crash.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

namespace anvil {

/// Base of every anvil error. `exit_code()` is what the process exits with when the
/// error is not caught.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  [[nodiscard]] virtual int exit_code() const noexcept { return 1; }
  /// The word before the message when the error ends the program ("error: ...").
  [[nodiscard]] virtual const char* label() const noexcept { return "error"; }
};

/// Bad configuration: an unknown key, a wrong type, a value out of range, a malformed
/// file. Exit status 2, as for any command-line usage error.
class ConfigError : public Error {
 public:
  using Error::Error;
  [[nodiscard]] int exit_code() const noexcept override { return 2; }
};

/// A requested device or feature that this build or machine does not have.
class DeviceError : public Error {
 public:
  using Error::Error;
  [[nodiscard]] int exit_code() const noexcept override { return 2; }
};

/// Whether the translation unit that calls this was compiled with optimisation (anvil is
/// header-only: the user's program decides). Runs warn when it was not.
[[nodiscard]] constexpr bool compiled_optimised() noexcept {
#if defined(__OPTIMIZE__)
  return true;
#else
  return false;
#endif
}

/// "nan", "inf" or "-inf": how an error names a non-finite value it found.
[[nodiscard]] inline const char* non_finite_name(double v) noexcept {
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

namespace detail {
[[noreturn]] inline void terminate_with_message() {
  std::fflush(stdout);
  if (auto p = std::current_exception()) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s: %s\n", e.label(), e.what());
      std::fflush(stderr);
      std::_Exit(e.exit_code());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      std::fflush(stderr);
      std::_Exit(1);
    } catch (...) {
    }
  }
  std::fputs("error: terminated by an unknown exception\n", stderr);
  std::abort();
}
}  // namespace detail

/// Make uncaught exceptions end the program with `error: <message>` on stderr and the
/// error's exit code (2 for configuration errors, 1 otherwise), not an abort and a core
/// dump. Idempotent.
inline void install_error_handler() { std::set_terminate(&detail::terminate_with_message); }

}  // namespace anvil
