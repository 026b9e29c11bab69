#pragma once
// What the two ways of stepping Python envs (bridge.cpp in this process, workers.cpp in
// worker processes) share: the env's spec as anvil_envs.py's `spec` writes it, read here;
// and, as EnvBatches, each env's reset seeds from its own stream, no state anvil can save
// (said when a checkpoint asks) and no success reports.

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>
#include <anvil/envs/env_batch.hpp>

namespace anvil::envs::python {

/// An env's spec as anvil_envs.py's `spec` writes it: lines of "key values". An env whose
/// observations hold images (a Box of bytes [H, W, C], or a Dict of parts) has `obs_part`
/// lines, its `EnvSpec::layout`.
struct Spec {
  EnvSpec env;
  std::vector<std::string> tasks;
  std::vector<std::int64_t> action_shape;  ///< a Box's shape (empty for a Discrete space)
  std::string python;                      ///< the interpreter's version
};

[[nodiscard]] inline Spec parse_spec(const std::string& text, const std::string& id) {
  auto floats = [](std::istringstream& in) {
    std::vector<float> v;
    std::string t;
    while (in >> t) v.push_back(static_cast<float>(std::strtod(t.c_str(), nullptr)));
    return v;
  };
  Spec s;
  s.env.name = id;
  std::istringstream lines(text);
  std::string line;
  std::vector<float> obs_low, obs_high, act_low, act_high;
  std::int64_t discrete = 0;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "python") std::getline(in >> std::ws, s.python);
    else if (key == "obs_low") obs_low = floats(in);
    else if (key == "obs_high") obs_high = floats(in);
    else if (key == "action_low") act_low = floats(in);
    else if (key == "action_high") act_high = floats(in);
    else if (key == "action_n") in >> discrete;
    else if (key == "action_shape")
      for (std::int64_t d = 0; in >> d;) s.action_shape.push_back(d);
    else if (key == "agents")
      in >> s.env.agents.agents >> s.env.agents.obs_dim >> s.env.agents.num_actions >> s.env.agents.state_dim;
    else if (key == "obs_part") {  // a part of rows of parts: name, dtype, shape
      std::string name, dtype;
      std::vector<std::int64_t> shape;
      in >> name >> dtype;
      for (std::int64_t d = 0; in >> d;) shape.push_back(d);
      if (dtype == "uint8" && shape.size() == 3) s.env.layout.image(name, shape[0], shape[1], shape[2]);
      else if (dtype == "float32" && shape.size() == 1) s.env.layout.vector(name, shape[0]);
      else throw Error(id + ": the spec's observation part '" + name + "' is neither uint8 [C, H, W] nor float32 [n]");
    } else if (key == "task") {
      std::string t;
      std::getline(in >> std::ws, t);
      s.tasks.push_back(t);
    }
  }
  if (s.env.byte_rows()) {  // the float parts' bounds, as envs of parts give them (core/spaces.hpp)
    const auto n = static_cast<std::size_t>(s.env.layout.float_numel());
    obs_low.assign(n, -std::numeric_limits<float>::infinity());
    obs_high.assign(n, std::numeric_limits<float>::infinity());
  }
  s.env.observation = Box{obs_low, obs_high};
  if (discrete > 0) s.env.action = Discrete{discrete};
  else s.env.action = Box{act_low, act_high};
  s.env.tasks = s.tasks;
  return s;
}

class PythonBatch : public EnvBatch {
 public:
  [[nodiscard]] bool saves_state() const noexcept final { return false; }
  [[nodiscard]] bool reports_success() const noexcept final { return false; }

  void save_envs(BinaryWriter&) const final {
    throw Error(spec_.name + ": Python envs cannot be saved (a resumed run starts their episodes afresh)");
  }
  [[nodiscard]] std::function<void()> read_envs(BinaryReader& r) final {
    r.fail("env state flag", "says the envs were saved, but " + spec_.name + " (a Python env) cannot be restored");
    return {};
  }

 protected:
  PythonBatch(EnvSpec spec, std::int64_t n, std::vector<std::string> tasks, std::uint64_t seed)
      : EnvBatch(std::move(spec), n, tasks, !tasks.empty()) {
    for (std::int64_t i = 0; i < n_; ++i) seeds_.emplace_back(derive_seed(seed, Stream::env, static_cast<std::uint64_t>(i)));
  }

  // The seed of env i's next reset, from its own stream: 32 bits, which every seeding API
  // takes (numpy's legacy `np.random.seed` refuses more).
  std::uint32_t next_seed(std::int64_t i) { return static_cast<std::uint32_t>(seeds_[static_cast<std::size_t>(i)]()); }

 private:
  std::vector<Rng> seeds_;
};

}  // namespace anvil::envs::python
