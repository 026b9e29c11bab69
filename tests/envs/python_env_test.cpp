// Envs written in Python (envs/python_env.hpp), in this process (src/python_envs/bridge.cpp)
// and in worker processes (src/python_envs/workers.cpp), through the door a Trainer takes
// them by: the test envs are in tests/python/envs (put on PYTHONPATH here). Light: the envs
// are stepped as an EnvBatch, without torch.
#include <anvil/envs/python_env.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <anvil/core/random.hpp>
#include <anvil/envs/any_env.hpp>
#include <anvil/envs/env_batch.hpp>
#include <anvil/envs/pendulum.hpp>

namespace {

// The test envs on PYTHONPATH, before the bridge starts the interpreter.
[[maybe_unused]] const bool kPythonPath = [] { return ::setenv("PYTHONPATH", ANVIL_TEST_PYTHON_ENVS, 1) == 0; }();

using anvil::envs::AnyEnv;
using anvil::envs::EnvBatch;
using anvil::envs::VecEnvConfig;

// `n` envs `id`, in this process (`workers` 0) or in worker processes.
std::unique_ptr<EnvBatch> make(const std::string& id, int n = 1, const anvil::KeyValues& kwargs = {}, int workers = 0,
                               double timeout = 60, anvil::envs::HangAction on_hang = anvil::envs::HangAction::stop) {
  VecEnvConfig cfg;
  cfg.num_envs = n;
  cfg.workers = workers;
  cfg.worker_timeout = timeout;
  cfg.on_hang = on_hang;
  const AnyEnv env = anvil::envs::python_env(id, kwargs, workers);
  REQUIRE(env.batch_maker());
  return env.batch_maker()(cfg, 7, 0, 0);
}

// The worker processes this process started that are still alive (their command line names
// this process as their parent).
int live_workers() {
  const std::string mark = std::string("--parent") + '\0' + std::to_string(::getpid()) + '\0';
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    const std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (cmd.find("env_worker.py") != std::string::npos && cmd.find(mark) != std::string::npos) {
      std::ifstream st(e.path() / "stat");
      std::string pid, comm, state;
      st >> pid >> comm >> state;
      if (state != "Z") ++n;
    }
  }
  return n;
}

// Rows for a batched step of `b`.
struct Rows {
  explicit Rows(const EnvBatch& b)
      : n(b.size()), d(b.spec().obs_dim()),
        obs(static_cast<std::size_t>(n * d)), next(obs.size()), reward(static_cast<std::size_t>(n)),
        term(reward.size()), trunc(reward.size()), task(reward.size()), ended(reward.size()) {}
  anvil::envs::StepRows out(bool tasks = false) {
    return {obs.data(), next.data(), reward.data(), term.data(), trunc.data(), tasks ? task.data() : nullptr, ended.data()};
  }
  std::int64_t n, d;
  std::vector<float> obs, next, reward, term, trunc;
  std::vector<std::int64_t> task;
  std::vector<anvil::envs::EpisodeEnd> ended;
};

// The message of the EnvError or ConfigError `f` throws.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing was thrown)";
}

}  // namespace

TEST_CASE("Python envs: a numpy Pendulum from Gymnasium's dynamics stays within 1e-5 of anvil's for 200 steps") {
  anvil::Rng rng(3);
  for (int start = 0; start < 3; ++start) {
    const double theta = rng.uniform(-3.0, 3.0), theta_dot = rng.uniform(-1.0, 1.0);
    auto py = make("python:pendulum:make", 1, {{"theta0", std::to_string(theta)}, {"theta_dot0", std::to_string(theta_dot)}});
    CHECK(py->spec().obs_dim() == 3);
    CHECK(py->spec().action_dim() == 1);
    anvil::envs::Pendulum cpp;
    // The same start: the Python env reads it from its kwargs as text, so start the C++ one from that text.
    cpp.set_state({std::stod(std::to_string(theta)), std::stod(std::to_string(theta_dot))});
    Rows r(*py);
    py->reset(r.obs.data(), 0);
    float action = 0;
    double worst = 0;
    for (int t = 0; t < 200; ++t) {
      action = static_cast<float>(rng.uniform(-2.5, 2.5));  // beyond the bounds too: both clip
      py->step(0, 1, &action, r.out(), t);
      const auto s = cpp.step(std::span<const float>(&action, 1));
      for (int k = 0; k < 3; ++k) worst = std::max(worst, std::abs(double(r.next[k]) - double(s.observation[k])));
      worst = std::max(worst, std::abs(double(r.reward[0]) - s.reward));
      CHECK(bool(r.trunc[0]) == s.truncated);
    }
    CHECK(worst < 1e-5);
    CHECK(r.ended[0].length == 200);  // truncated after 200 steps, as published
  }
}

TEST_CASE("Python envs: a program that embeds the shared libpython does not hold the interpreter, before or after the bridge loads it") {
  // This test program links no Python: the bridge brings the shared libpython, whose symbols
  // are then in the process; the program itself still defines none, so every later env takes
  // the same bridge (the host bridge is for programs that define Python's symbols themselves).
  CHECK_FALSE(anvil::envs::python::interpreter_in_program());
  auto b = make("python:pendulum:make");
  CHECK(dlsym(RTLD_DEFAULT, "Py_IsInitialized") != nullptr);
  CHECK_FALSE(anvil::envs::python::interpreter_in_program());
  CHECK(anvil::envs::python_env("python:pendulum:make", {}).note().find("the shared libpython") != std::string::npos);
}

TEST_CASE("Python envs: kwargs reach the factory as Python literals, with each env's index") {
  auto b = make("python:pendulum:make", 2, {{"g", "0.0"}, {"theta0", "0.5"}});
  Rows r(*b);
  b->reset(r.obs.data(), 0);
  const float zero[2] = {0, 0};
  b->step(0, 2, zero, r.out(), 0);
  // no gravity and no torque: the pendulum keeps its angle
  CHECK(r.next[0] == doctest::Approx(std::cos(0.5)).epsilon(1e-6));
  CHECK(r.next[1] == doctest::Approx(std::sin(0.5)).epsilon(1e-6));
  CHECK(r.next[3] == doctest::Approx(std::cos(0.5)).epsilon(1e-6));
}

TEST_CASE("Python envs: a Discrete action space and tasks named in info, in this process and in workers") {
  for (const int workers : {0, 2}) {
    CAPTURE(workers);
    auto b = make("python:faulty:Corridor", 4, {{"tasks", "True"}}, workers);
    CHECK(b->spec().discrete());
    CHECK(b->spec().tasks == std::vector<std::string>{"short", "long"});
    CHECK(b->groups() == std::vector<std::string>{"short", "long"});
    CHECK(b->has_tasks());
    Rows r(*b);
    b->reset(r.obs.data(), 0);
    const std::int64_t right[4] = {1, 1, 1, 1};
    for (int t = 0; t < 6; ++t) b->step(0, 4, right, r.out(true), t);
    // env i runs task i % 2: the short corridor (5 cells) ended at step 5, the long one at 6
    CHECK(r.ended[1].length == 6);
    CHECK(r.ended[1].group == 1);
    CHECK(r.ended[3].group == 1);
    CHECK(r.task[0] == 0);
    CHECK(r.task[1] == 1);
    CHECK(r.task[2] == 0);  // env 2 is in the second worker: its index reached its factory
  }
}

// Each fault of an env, in this process or in a worker: the error names the env, the step and
// what was expected.
static void check_faults(int workers) {
  const float a = 0.5f;
  auto step_until_fault = [&](const std::string& id) {
    return error_of([&] {
      auto b = make(id, 1, {}, workers);
      Rows r(*b);
      b->reset(r.obs.data(), 0);
      for (int t = 0; t < 10; ++t) b->step(0, 1, &a, r.out(), t);
    });
  };
  const auto raised = step_until_fault("python:faulty:Raises");
  CHECK(raised.find("env 0 of 1: step 3") != std::string::npos);
  CHECK(raised.find("ValueError: the walk fell off at x=1.5") != std::string::npos);
  CHECK(raised.find("in helper") != std::string::npos);  // the traceback's last frame
  CHECK(step_until_fault("python:faulty:OldApi").find("4 values, the old Gym API") != std::string::npos);
  CHECK(step_until_fault("python:faulty:NanObservation").find("step 3 (step 3 of its episode): observation[0] is nan") !=
        std::string::npos);
  CHECK(step_until_fault("python:faulty:WrongShape").find("observation has 3 numbers; the observation space has 1") !=
        std::string::npos);
  CHECK(step_until_fault("python:faulty:NanReward").find("reward is inf") != std::string::npos);
  CHECK(step_until_fault("python:faulty:ResetOld").find("expected (obs, info)") != std::string::npos);
  CHECK(step_until_fault("python:faulty:NoSpaces").find("lacks observation_space") != std::string::npos);
  const auto made = error_of([&] { (void)make("python:pendulum:make", 1, {{"no_such_kwarg", "1"}}, workers); });
  CHECK(made.find("making env 0 failed") != std::string::npos);
  CHECK(made.find("no_such_kwarg") != std::string::npos);
}

TEST_CASE("Python envs: each fault stops with the env, the step and what was expected (in this process)") {
  check_faults(0);
}

TEST_CASE("Python envs: each fault stops with the env, the step and what was expected (in a worker process)") {
  check_faults(1);
  CHECK(live_workers() == 0);  // every worker ended with its envs
}

TEST_CASE("Python envs: a module or attribute that cannot be imported is one line naming it") {
  const auto module = error_of([] { (void)anvil::envs::python_env("python:no_such_module:make", {}); });
  CHECK(module.find("env.id=python:no_such_module:make: cannot import module 'no_such_module'") != std::string::npos);
  CHECK(module.find("ModuleNotFoundError") != std::string::npos);
  CHECK(module.find('\n') == std::string::npos);  // one line
  const auto attr = error_of([] { (void)anvil::envs::python_env("python:pendulum:nope", {}); });
  CHECK(attr.find("module 'pendulum' has no attribute 'nope'") != std::string::npos);
  const auto form = error_of([] { (void)anvil::envs::python_env("python:pendulum", {}); });
  CHECK(form.find("expected python:MODULE:ATTR") != std::string::npos);
  // in worker processes, the same errors come from the worker that imports the factory
  const auto in_worker = error_of([] { (void)make("python:no_such_module:make", 2, {}, 2); });
  CHECK(in_worker.find("env.id=python:no_such_module:make: worker 0 of 2: cannot import module 'no_such_module'") !=
        std::string::npos);
  CHECK(in_worker.find("<frozen") == std::string::npos);  // no frames of Python's import machinery
  CHECK(in_worker.find('\n') == std::string::npos);       // one line
}

TEST_CASE("Python envs: the GIL is free between batches, so the program's Python threads run") {
  auto b = make("python:ticker:Ticker");
  Rows r(*b);
  b->reset(r.obs.data(), 0);
  const float a = 0;
  b->step(0, 1, &a, r.out(), 0);
  const float before = r.next[0];
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // anvil's own work, GIL not held
  b->step(0, 1, &a, r.out(), 1);
  CHECK(r.next[0] > before + 20);  // the thread ticked (every ~1 ms) while anvil did not hold the GIL
}

TEST_CASE("Python envs in worker processes: the same rows as in this process, whatever the number of workers") {
  // 16 Pendulums for 450 steps (two autoresets each, from each env's own seed stream)
  auto run = [](int workers) {
    auto b = make("python:pendulum:make", 16, {}, workers);
    Rows r(*b);
    b->reset(r.obs.data(), 0);
    std::vector<float> all = r.obs, actions(16);
    anvil::Rng rng(11);
    for (int t = 0; t < 450; ++t) {
      for (auto& x : actions) x = static_cast<float>(rng.uniform(-2.0, 2.0));
      b->step(0, 16, actions.data(), r.out(), t);
      all.insert(all.end(), r.obs.begin(), r.obs.end());
      all.insert(all.end(), r.next.begin(), r.next.end());
      all.insert(all.end(), r.reward.begin(), r.reward.end());
      all.insert(all.end(), r.trunc.begin(), r.trunc.end());
    }
    return all;
  };
  const auto one = run(1);
  CHECK(run(3) == one);  // slices of 5, 5 and 6 envs
  CHECK(run(16) == one);
  if (!anvil::envs::python::library_path(anvil::envs::python::kBridge).empty()) CHECK(run(0) == one);
  CHECK(live_workers() == 0);
}

TEST_CASE("Python envs in worker processes: a worker that dies is named, with its envs and how it died") {
  const float a[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  auto die = [&](const std::string& id) {
    return error_of([&] {
      auto b = make(id, 4, {}, 2);
      Rows r(*b);
      b->reset(r.obs.data(), 0);
      for (int t = 0; t < 10; ++t) b->step(0, 4, a, r.out(), t);
    });
  };
  const auto exited = die("python:faulty:Exits");
  CHECK(exited.find("env 0 of 4: step 3 (step 3 of its episode): worker 0 of 2 (pid ") != std::string::npos);
  CHECK(exited.find("envs 0-1) died in step(): exited with status 3") != std::string::npos);
  CHECK(die("python:faulty:Segfault").find("died in step(): killed by signal 11") != std::string::npos);
  const auto killed = die("python:faulty:Killed");
  CHECK(killed.find("died in step(): killed by signal 9") != std::string::npos);
  CHECK(killed.find("OOM killer") != std::string::npos);
  CHECK(live_workers() == 0);  // the other worker of each batch ended too
}

TEST_CASE("Python envs in worker processes: a worker that stops answering is named with its env and step") {
  const float a = 0.5f;
  // The timeout also bounds the worker's start (an interpreter, numpy): 2.5 s, so that a loaded
  // machine reports the hang at step 3, not a slow start.
  const auto hung = error_of([&] {
    auto b = make("python:faulty:Hangs", 1, {}, 1, 2.5);
    Rows r(*b);
    b->reset(r.obs.data(), 0);
    for (int t = 0; t < 10; ++t) b->step(0, 1, &a, r.out(), t);
  });
  CHECK(hung.find("env 0 of 1: step 3 (step 3 of its episode): in worker 0 of 1") != std::string::npos);
  CHECK(hung.find("no answer in 2.5 s (env.worker_timeout=2.5)") != std::string::npos);
  CHECK(hung.find("env.on_hang=stop") != std::string::npos);
  CHECK(live_workers() == 0);  // the stuck worker was killed
  // env.on_hang=wait: a slow step is reported and waited for, and the run goes on
  auto slow = make("python:faulty:Slow", 1, {{"pause", "0.8"}}, 1, 0.3, anvil::envs::HangAction::wait);
  Rows r(*slow);
  slow->reset(r.obs.data(), 0);
  for (int t = 0; t < 6; ++t) slow->step(0, 1, &a, r.out(), t);
  CHECK(r.next[0] == doctest::Approx(3.0));  // six steps of +0.5
}

TEST_CASE("Python envs in worker processes: settings that do not apply are refused, naming the field") {
  VecEnvConfig cfg;
  cfg.num_envs = 4;
  cfg.workers = 2;
  cfg.threads = 2;
  const AnyEnv env = anvil::envs::python_env("python:pendulum:make", {}, 2);
  CHECK(error_of([&] { (void)env.batch_maker()(cfg, 7, 0, 0); }).find("env.threads=2: with env.workers=2") !=
        std::string::npos);
  cfg.threads = 1;
  CHECK(error_of([&] { anvil::envs::EnvArray<anvil::envs::Pendulum> b(anvil::envs::Pendulum{}, cfg, 7); })
            .find("env.workers=2: worker processes step envs written in Python") != std::string::npos);
  CHECK(live_workers() == 0);
}

TEST_CASE("Python envs: the fields only C++ envs apply (tasks, time limits) are refused, naming the field") {
  for (const int workers : {0, 2}) {
    CAPTURE(workers);
    VecEnvConfig cfg;
    cfg.num_envs = 2;
    cfg.workers = workers;
    const AnyEnv env = anvil::envs::python_env("python:pendulum:make", {}, workers);
    cfg.tasks = std::vector<std::string>{"reach"};
    CHECK(error_of([&] { (void)env.batch_maker()(cfg, 7, 0, 0); })
              .find("env.tasks: python:pendulum:make declares its own tasks") != std::string::npos);
    cfg.tasks = std::vector<std::string>{};
    cfg.max_episode_steps = 150;
    CHECK(error_of([&] { (void)env.batch_maker()(cfg, 7, 0, 0); })
              .find("env.max_episode_steps=150: python:pendulum:make keeps its own time limit") != std::string::npos);
    cfg.eval_max_episode_steps = 90;
    CHECK(error_of([&] { (void)env.batch_maker()(cfg, 7, 0, 0); }).find("env.eval_max_episode_steps=90") !=
          std::string::npos);
  }
  CHECK(live_workers() == 0);
}

TEST_CASE("Python envs with images: a Dict of an image [H, W, C] and numbers, and a lone image, as rows of parts, in this process and in workers") {
  for (const int workers : {0, 2}) {
    CAPTURE(workers);
    auto b = make("python:pictures:Dot", 3, {}, workers);
    const auto& spec = b->spec();
    REQUIRE(spec.byte_rows());
    CHECK(spec.layout.describe() == "image uint8 [3,8,6], pos float32 [2]");
    const auto row = spec.obs_dim();
    CHECK(row == 3 * 8 * 6 + 8);
    std::vector<std::uint8_t> obs(static_cast<std::size_t>(3 * row)), next(obs.size());
    std::vector<float> reward(3), term(3), trunc(3);
    std::vector<anvil::envs::EpisodeEnd> ended(3);
    const anvil::envs::StepRows out{obs.data(), next.data(), reward.data(), term.data(), trunc.data(), nullptr, ended.data()};
    b->reset(obs.data(), 0);
    const float moves[6] = {1, 0, 0, 1, 1, 1};
    for (int t = 0; t < 3; ++t) b->step(0, 3, moves, out, t);
    // The image transposed to [C, H, W]: red 10 row + column, green the step, blue the dot;
    // pos beside it as float32.
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      const std::uint8_t* r = next.data() + i * row;
      CHECK(r[0 * 48 + 3 * 6 + 2] == 32);  // red at row 3, column 2
      CHECK(r[1 * 48 + 5 * 6 + 1] == 3);   // green: 3 steps
      float pos[2];
      std::memcpy(pos, r + 144, sizeof pos);
      int dots = 0;
      for (int k = 0; k < 48; ++k) dots += r[2 * 48 + k] == 255;
      CHECK(dots == 1);
      const int dr = static_cast<int>(pos[0]) % 8, dc = static_cast<int>(pos[1]) % 6;
      CHECK(r[2 * 48 + dr * 6 + dc] == 255);
    }
    // A lone image Box is one part, "image".
    auto p = make("python:pictures:plain", 2, {}, workers);
    CHECK(p->spec().layout.describe() == "image uint8 [3,8,6]");
    // A part in the wrong shape is named, with the env and the step.
    const auto fault = error_of([&] {
      auto bad = make("python:pictures:BadDot", 1, {}, workers);
      std::vector<std::uint8_t> o(static_cast<std::size_t>(row)), n2(o.size());
      std::vector<float> rw(1), tm(1), tr(1);
      std::vector<anvil::envs::EpisodeEnd> en(1);
      const anvil::envs::StepRows o1{o.data(), n2.data(), rw.data(), tm.data(), tr.data(), nullptr, en.data()};
      bad->reset(o.data(), 0);
      for (int t = 0; t < 4; ++t) bad->step(0, 1, moves, o1, t);
    });
    CHECK(fault.find("env 0 of 1: step 2") != std::string::npos);
    CHECK(fault.find("observation part 'image' has shape (8, 6, 2); the space's is (8, 6, 3)") != std::string::npos);
  }
}
