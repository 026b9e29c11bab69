#pragma once
/// @file
/// `anvil::start`: the one line a main calls first, and the only place where anvil controls
/// the process. Constructors and parsers never print, exit, fork or restart anything; this
/// call does what a training program must do before it builds a Trainer:
///  - installs the handler that turns an uncaught anvil error into `error: <message>` and
///    its exit status (2 for bad input, 3 for a failure between ranks, 1 otherwise);
///  - makes sure OpenBLAS uses its fast kernels (`prefer_fast_blas`: on an AVX-512 CPU whose
///    kernels OpenBLAS did not recognise, the program restarts itself once with
///    OPENBLAS_CORETYPE set);
///  - reads the command line and `--config` files into the Trainer's config: `--help` prints
///    every field and exits 0, `--print-config` prints the resolved config and exits 0, a bad
///    key or value prints one line naming it and exits 2;
///  - starts the ranks: a program with `DDP<N>` started plainly becomes the launcher of its
///    node's N ranks (parallel/launch.hpp) and exits with their outcome; a rank (or a run
///    with one process) returns.
///
///     int main(int argc, char** argv) {
///       using Trainer = anvil::Trainer<anvil::SAC, anvil::UniformBuffer>;
///       Trainer trainer(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv));
///       trainer.fit();
///     }
///
/// Its counterpart at the other end, `exit_fast`, ends a single-process main whose run is
/// over without the teardown of the libraries it loaded.

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/core/blas.hpp>
#include <anvil/core/config.hpp>
#include <anvil/core/error.hpp>
#include <anvil/parallel/world.hpp>
#include <anvil/train/sweep.hpp>

namespace anvil {

namespace detail {
[[noreturn]] inline void exit_with(const Error& e) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s\n", e.label(), e.what());
  std::fflush(stderr);
  std::exit(e.exit_code());
}
}  // namespace detail

/// The process's part of `start` (see file comment) for a main that builds its configs
/// itself (e.g. several Trainer types from one command line): error handler, BLAS kernels,
/// the parsed command line. A malformed command line exits 2.
inline Args start(int argc, char** argv) {
  install_error_handler();
  prefer_fast_blas(argc, argv);
  try {
    return parse_config(argc, argv);
  } catch (const ConfigError& e) {
    detail::exit_with(e);
  }
}

/// A config of type `Config` from `args` over `defaults`: answers `--help` and
/// `--print-config` (exit 0) and reports bad input (exit 2). For programs whose config is
/// not a Trainer's (benchmarks, tools); a Trainer's main calls `start<Trainer>`.
template <class Config>
Config start_config(const Args& args, Config defaults = {}) {
  if (args.help) {
    std::fputs(help_text<Config>(args.program, defaults).c_str(), stdout);
    std::fflush(stdout);
    std::exit(0);
  }
  Config cfg;
  try {
    cfg = configure<Config>(args, std::move(defaults));
  } catch (const ConfigError& e) {
    detail::exit_with(e);
  }
  if (args.print_config) {
    std::printf("# %s config, hash %s\n%s", args.program.c_str(), config_hash_hex(cfg).c_str(), to_yaml(cfg).c_str());
    std::fflush(stdout);
    std::exit(0);
  }
  return cfg;
}

/// `start(argc, argv)` then `start_config(args, defaults)`.
template <class Config>
Config start_config(int argc, char** argv, Config defaults = {}) {
  return start_config<Config>(start(argc, argv), std::move(defaults));
}

/// For a program with a config section of its own beside a Trainer's (a program with modes:
/// `--experiment.mode=...`): the arguments of section `section` (`--<section>.*`,
/// `<section>.*`) parsed into `Own` (a config holding that section; its defaults under
/// `--help`), and `start(argc, argv)` of the others, for the Trainer's `start<Trainer>`.
/// `--help` goes to both.
template <class Own>
std::pair<Args, Own> start_with_section(int argc, char** argv, std::string_view section) {
  std::vector<char*> mine{argv[0]}, theirs{argv[0]};
  const std::string dashed = "--" + std::string(section) + ".", plain = std::string(section) + ".";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    (a.starts_with(dashed) || a.starts_with(plain) ? mine : theirs).push_back(argv[i]);
    if (a == "--help") mine.push_back(argv[i]);
  }
  auto args = start(static_cast<int>(theirs.size()), theirs.data());
  Own own{};
  if (!args.help) own = start_config<Own>(static_cast<int>(mine.size()), mine.data());
  return {std::move(args), std::move(own)};
}

namespace detail {
template <class Trainer>
typename Trainer::Config start_trainer(const Args& args, typename Trainer::Config defaults) {
  if (args.multirun && !args.help && !args.print_config) {
    // A sweep (train/sweep.hpp): every run's config is checked before the first starts.
    try {
      const auto plan = plan_sweep(args.program, args.raw);
      for (const auto& overrides : plan.runs()) {
        std::vector<std::string> argv{args.program};
        for (const auto& a : plan.arguments(overrides, "sweep-check")) argv.push_back(a);
        try {
          (void)configure<typename Trainer::Config>(parse_args(argv), defaults);
        } catch (const ConfigError& e) {
          std::string which;
          for (const auto& o : overrides) which += (which.empty() ? "" : " ") + o;
          throw ConfigError("--multirun: the run with " + which + ": " + e.what());
        }
      }
      std::exit(run_sweep(plan));
    } catch (const Error& e) {
      detail::exit_with(e);
    }
  }
  auto cfg = start_config<typename Trainer::Config>(args, std::move(defaults));
  try {
    Trainer::Parallelism::start_ranks(*cfg.parallel);  // a launcher does not return
  } catch (const Error& e) {
    detail::exit_with(e);
  }
  return cfg;
}
}  // namespace detail

/// The config of a `Trainer` from `args` over `defaults` (see file comment): answers
/// `--help` and `--print-config` (exit 0), reports bad input (exit 2), and starts the ranks
/// the Trainer's parallelism needs.
template <class Trainer>
typename Trainer::Config start(const Args& args, typename Trainer::Config defaults = {}) {
  if constexpr (requires { requires Trainer::prebuilt; }) {
    return Trainer::start_config(args, std::move(defaults));  // compiled::Trainer: this, compiled once
  } else {
    return detail::start_trainer<Trainer>(args, std::move(defaults));
  }
}

/// `start(argc, argv)` then `start<Trainer>(args, defaults)`: the usual first line of a main.
template <class Trainer>
typename Trainer::Config start(int argc, char** argv, typename Trainer::Config defaults = {}) {
  return start<Trainer>(start(argc, argv), std::move(defaults));
}

/// Ends the process with `code` now, once a main's work is done: flushes stdout, stderr and
/// every C stream, then exits without the static destructors of the loaded libraries and
/// without destroying the main's objects. Debian's LibTorch loads 288 libraries whose
/// destructors take about 50 ms at exit freeing memory the exit returns anyway (the
/// dispatcher's tables, DICOM dictionaries of an image library). Call it after `fit()`,
/// which completes the run's files (checkpoints, summary.json, metrics, events, training.log)
/// and releases its directory, and only where no object of yours still has something to
/// write. A rank a launcher started (RANK set: parallel/world.hpp) exits normally: the ranks'
/// process group tears down together.
[[noreturn]] inline void exit_fast(int code = 0) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if (dist::detail::getenv_nonempty("RANK")) std::exit(code);
  std::_Exit(code);
}

}  // namespace anvil
