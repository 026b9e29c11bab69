// Envs written in Python under anvil (envs/python_env.hpp): env steps per second of the
// numpy Pendulum (tests/python/envs/pendulum.py) through anvil's VecEnv in this process,
// beside the same env in a bare Python loop (benchmarks/reference/python_env_loop.py), and
// the bridge's cost per batched step beside bare C++ stepping of anvil's own Pendulum; then
// in worker processes (env.workers=W, bench.worker_envs envs each) beside W processes
// driven over multiprocessing pipes as SubprocVecEnv drives them
// (benchmarks/reference/python_env_pipes.py), with the workers' scaling from 1 to W.
// One JSON line per figure; needs PYTHONPATH to hold tests/python/envs.
#include "bench_common.hpp"

#include <anvil/core/config.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/python_env.hpp>
#include <anvil/envs/vec_env.hpp>

struct BenchConfig {
  anvil::Param<double, "seconds", "seconds per timed repeat", anvil::positive> seconds{1.0};
  anvil::Param<std::vector<int>, "num_envs", "env counts to measure", anvil::at_least(1)> num_envs{1, 16};
  anvil::Param<std::string, "env", "the Python env"> env{"python:pendulum:make"};
  anvil::Param<std::string, "python", "the interpreter of the bare-loop reference (empty: skip it)"> python{
      ANVIL_BENCH_PYTHON};
  anvil::Param<std::vector<int>, "workers", "worker process counts to measure (env.workers)", anvil::at_least(1)>
      workers{1, 2};
  anvil::Param<int, "worker_envs", "envs of each worker", anvil::at_least(1)> worker_envs{8};
};
struct Config {
  anvil::Section<"bench", BenchConfig> bench;
};

int main(int argc, char** argv) {
  const auto cfg = anvil::start_config<Config>(argc, argv);
  const auto& b = *cfg.bench;
  torch::set_num_threads(1);
  const auto env = anvil::envs::python_env(*b.env, {});
  for (int n : *b.num_envs) {
    anvil::envs::VecEnvConfig vc;
    vc.num_envs = n;
    auto venv = anvil::envs::make_vec_env(env, vc, 0);
    venv->reset();
    const auto actions = torch::full({n, 1}, 0.5f);  // fixed actions, as the reference's
    const double calls = bench::median_rate([&] { venv->step(actions); }, b.seconds);
    bench::emit("python_env_steps", calls * n, "env steps/s", {{"env", *b.env}, {"num_envs", n}, {"workers", 0}});
    // The bridge's cost per batched step: anvil's time per batch less the env's own Python
    // time (the bare loop's), beside a batch of anvil's C++ Pendulum.
    anvil::envs::VecEnv<anvil::envs::Pendulum> cpp(anvil::envs::Pendulum{}, vc, 0);
    cpp.reset();
    const double cpp_calls = bench::median_rate([&] { cpp.step(actions); }, b.seconds);
    bench::emit("cpp_env_batch_us", 1e6 / cpp_calls, "us", {{"env", "Pendulum-v1"}, {"num_envs", n}});
    if (!b.python->empty()) {
      const std::string target = b.env->substr(std::string("python:").size());
      const std::string cmd = *b.python + " " + ANVIL_BENCH_PYTHON_LOOP + " " + target + " " + std::to_string(n) + " " +
                              std::to_string(*b.seconds);
      const double bare = bench::run_reference(cmd);
      bench::emit("python_env_bare_loop_steps", bare, "env steps/s", {{"env", *b.env}, {"num_envs", n}});
      bench::emit("python_env_vs_bare_loop", calls * n / bare, "x", {{"env", *b.env}, {"num_envs", n}, {"workers", 0}});
      bench::emit("python_bridge_batch_us", 1e6 / calls - 1e6 * n / bare, "us", {{"env", *b.env}, {"num_envs", n}});
      // The same bare loop in the interpreter as the bridge embeds it (libpython, the shared
      // library): what in-process stepping could reach at best.
      const double embedded = bench::run_reference(std::string(ANVIL_BENCH_PYTHON_EMBEDDED) + cmd.substr(b.python->size()));
      bench::emit("python_env_bare_loop_steps", embedded, "env steps/s",
                  {{"env", *b.env}, {"num_envs", n}, {"interpreter", ANVIL_BENCH_EMBEDDED_AS}});
      bench::emit("python_env_vs_bare_loop", calls * n / embedded, "x",
                  {{"env", *b.env}, {"num_envs", n}, {"workers", 0}, {"interpreter", ANVIL_BENCH_EMBEDDED_AS}});
    }
  }
  // Worker processes: W workers of bench.worker_envs envs each, and one worker with all of
  // them (the same work), beside the pipe reference with the same slices.
  const auto workers = anvil::envs::python_env(*b.env, {}, 1);
  auto rate = [&](int w, int n) {
    anvil::envs::VecEnvConfig vc;
    vc.num_envs = n;
    vc.workers = w;
    auto venv = anvil::envs::make_vec_env(workers, vc, 0);
    venv->reset();
    const auto actions = torch::full({n, 1}, 0.5f);
    return bench::median_rate([&] { venv->step(actions); }, b.seconds) * n;
  };
  const std::string target = b.env->substr(std::string("python:").size());
  for (int w : *b.workers) {
    const int n = w * *b.worker_envs;
    const double steps = rate(w, n);
    bench::emit("python_workers_steps", steps, "env steps/s", {{"env", *b.env}, {"num_envs", n}, {"workers", w}});
    if (w > 1) {
      const double one = rate(1, n);
      bench::emit("python_workers_steps", one, "env steps/s", {{"env", *b.env}, {"num_envs", n}, {"workers", 1}});
      bench::emit("python_workers_scaling", steps / one, "x", {{"env", *b.env}, {"num_envs", n}, {"workers", w}});
    }
    if (!b.python->empty()) {
      const std::string cmd = *b.python + " " + ANVIL_BENCH_PYTHON_PIPES + " " + target + " " + std::to_string(n) + " " +
                              std::to_string(w) + " " + std::to_string(*b.seconds);
      const double pipes = bench::run_reference(cmd);
      bench::emit("python_env_pipes_steps", pipes, "env steps/s", {{"env", *b.env}, {"num_envs", n}, {"workers", w}});
      bench::emit("python_workers_vs_pipes", steps / pipes, "x", {{"env", *b.env}, {"num_envs", n}, {"workers", w}});
      // and as SubprocVecEnv lays envs out by default: one process per env
      const std::string one = *b.python + " " + ANVIL_BENCH_PYTHON_PIPES + " " + target + " " + std::to_string(n) + " " +
                              std::to_string(n) + " " + std::to_string(*b.seconds);
      const double per_env = bench::run_reference(one);
      bench::emit("python_env_pipes_steps", per_env, "env steps/s", {{"env", *b.env}, {"num_envs", n}, {"workers", n}});
      bench::emit("python_workers_vs_pipes", steps / per_env, "x",
                  {{"env", *b.env}, {"num_envs", n}, {"workers", w}, {"pipes", "one process per env"}});
      // the workers' cost per batch: anvil's time per batch less one worker's Python time
      const std::string loop = *b.python + " " + ANVIL_BENCH_PYTHON_LOOP + " " + target + " " +
                               std::to_string(*b.worker_envs) + " " + std::to_string(*b.seconds);
      const double bare = bench::run_reference(loop);
      bench::emit("python_workers_batch_us", 1e6 * n / steps - 1e6 * *b.worker_envs / bare, "us",
                  {{"env", *b.env}, {"num_envs", n}, {"workers", w}});
    }
  }
}
