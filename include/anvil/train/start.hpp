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
///    key or value prints one line naming it and exits 2; a resume (`run.resume`) takes the
///    run's own settings from its run directory's config.yaml, under those the user gives;
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

#include <algorithm>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/core/blas.hpp>
#include <anvil/core/config.hpp>
#include <anvil/core/detail/flush_registry.hpp>
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

namespace detail {
/// `--print-config`'s answer: the resolved config as YAML (with its hash), then exit 0.
template <class Config>
[[noreturn]] void print_config_and_exit(const Args& args, const Config& cfg) {
  std::printf("# %s config, hash %s\n%s", args.program.c_str(), config_hash_hex(cfg).c_str(), to_yaml(cfg).c_str());
  std::fflush(stdout);
  std::exit(0);
}
}  // namespace detail

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
  if (args.print_config) detail::print_config_and_exit(args, cfg);
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

/// For a mode of such a program that does not go through `start<Trainer>` (a recording or a
/// merge of files, which start no Trainer; an evaluation that builds its Trainer's config
/// itself): under `--print-config`, prints `cfg`, the config the mode runs on (the program's
/// own section, or the config it built), and exits 0, so that the mode runs nothing, as
/// `--print-config` promises; otherwise returns. (`start<Trainer>` prints on its own.)
template <class Config>
void exit_if_print_config(const Args& args, const Config& cfg) {
  if (args.print_config) detail::print_config_and_exit(args, cfg);
}

namespace detail {
struct SmokeField {
  Param<bool, "smoke", "a run of seconds"> smoke{false};
};
struct SmokeProbe {
  Section<"run", SmokeField> run;
};
}  // namespace detail

/// Whether `args` ask for a run of seconds (`--smoke`, or `run.smoke` in a config file), as a
/// Trainer's config reads them: for a program that chooses what to run by it (an example's
/// stages in order).
template <class Probe = detail::SmokeProbe>  // a template: compiled only where it is used
[[nodiscard]] bool asks_smoke(const Args& args) {
  std::vector<Setting> smoke;
  for (const auto& s : args.settings)
    if (s.key == "smoke" || s.key == "run.smoke") smoke.push_back(s);
  Probe p;
  try {
    apply_settings(p, smoke);
  } catch (const ConfigError&) {
    return false;  // the Trainer's own reading reports it
  }
  return p.run->smoke;
}

namespace detail {
/// `args` with the settings of the run a resume continues (its run directory's config.yaml)
/// placed under the user's own: a resume takes the run's networks, envs and schedule from
/// the run unless a config file or the command line says otherwise, so the only conflict
/// left to refuse is one the user gave. What belongs to this process rather than the run
/// (`run.resume`, `run.run_dir`, `parallel.*`) is not taken. Unchanged when the settings
/// ask for no resume or the run directory has no config.yaml.
template <class Config>
Args with_resumed_run(Args args, const Config& defaults);
}  // namespace detail

/// The run directory a resume asked for by `args` continues (`run.resume=auto`: `run.run_dir`;
/// a checkpoint: its directory), or empty when they ask for none. The settings are read over
/// `defaults` but not validated: the run's own settings may be what makes them valid.
template <class Config>
[[nodiscard]] std::filesystem::path resumed_run_dir(const Args& args, const Config& defaults = {}) {
  Config probe = defaults;
  try {
    detail::apply_each(probe, args.settings);
  } catch (const ConfigError&) {
    return {};  // the real reading reports it
  }
  const std::string& resume = probe.run->resume;
  if (resume.empty()) return {};
  return resume == "auto" ? std::filesystem::path(*probe.run->run_dir) : std::filesystem::path(resume).parent_path();
}

namespace detail {
template <class Config>
Args with_resumed_run(Args args, const Config& defaults) {
  const auto dir = resumed_run_dir(args, defaults);
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_regular_file(dir / "config.yaml", ec)) return args;
  auto run = load_yaml_file((dir / "config.yaml").string());
  std::erase_if(run, [](const Setting& s) {
    return s.key == "run.resume" || s.key == "run.run_dir" || s.key.starts_with("parallel.");
  });
  // After the program's own defaults, before the user's files and command line.
  const auto at = std::find_if(args.settings.begin(), args.settings.end(), [](const Setting& s) { return !s.program_default; });
  args.settings.insert(at, run.begin(), run.end());
  if (!dist::world_from_env())  // said once, by the process the user started
    std::fprintf(stderr, "resume: the run's settings from %s, under those given here\n", (dir / "config.yaml").c_str());
  return args;
}

template <class Trainer>
typename Trainer::Config start_trainer(const Args& given, typename Trainer::Config defaults) {
  const Args args = given.help ? given : with_resumed_run(given, defaults);
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
    Trainer::Parallelism::start_ranks(*cfg.parallel, *cfg.run->device);  // a launcher does not return
  } catch (const Error& e) {
    detail::exit_with(e);
  }
  return cfg;
}
}  // namespace detail

/// A Trainer compiled once (`compiled::Trainer`, train/compiled_trainer.hpp), whose
/// `start_config` holds `start`'s work, compiled with it.
template <class T>
concept PrebuiltTrainer = requires(const Args& args, typename T::Config defaults) {
  requires T::prebuilt;
  { T::start_config(args, defaults) } -> std::same_as<typename T::Config>;
};

/// The config of a `Trainer` from `args` over `defaults` (see file comment): answers
/// `--help` and `--print-config` (exit 0), reports bad input (exit 2), and starts the ranks
/// the Trainer's parallelism needs.
template <class Trainer>
typename Trainer::Config start(const Args& args, typename Trainer::Config defaults = {}) {
  if constexpr (PrebuiltTrainer<Trainer>) {
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

/// Ends the process with `code` now, once a main's work is done: flushes every file anvil
/// has open (its runs' training.log, metrics.csv and TensorBoard events: one registry,
/// core/detail/flush_registry.hpp), stdout, stderr and every C stream, then exits without
/// the static destructors of the loaded libraries and without destroying the main's objects.
/// Opt-in, for programs whose start and exit are timed (benchmarks/): a 0.1 s gain. Debian's LibTorch loads 288 libraries whose
/// destructors take about 50 ms at exit freeing memory the exit returns anyway (the
/// dispatcher's tables, DICOM dictionaries of an image library). Call it after `fit()`,
/// which completes the run's files (checkpoints, summary.json, metrics, events, training.log)
/// and releases its directory, and only where no object of yours still has something to
/// write. A rank a launcher started (RANK set: parallel/world.hpp) exits normally: the ranks'
/// process group tears down together.
[[noreturn]] inline void exit_fast(int code = 0) {
  detail::FlushRegistry::instance().flush_all();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if (dist::detail::getenv_nonempty("RANK")) std::exit(code);
  std::_Exit(code);
}

}  // namespace anvil
