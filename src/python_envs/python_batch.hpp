#pragma once
// What the two ways of stepping Python envs (bridge.cpp in this process, workers.cpp in
// worker processes) share as EnvBatches: Python envs have no state anvil can save, say so
// when a checkpoint asks, and do not report success.

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/envs/env_batch.hpp>

namespace anvil::envs::python {

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
  PythonBatch(EnvSpec spec, std::int64_t n, std::vector<std::string> tasks)
      : EnvBatch(std::move(spec), n, tasks, !tasks.empty()) {}
};

}  // namespace anvil::envs::python
