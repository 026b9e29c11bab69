#pragma once
/// @file
/// `InitConfig`: the `init` section of a Trainer's config, where a run's networks start
/// (`init.weights`: a warm start from a policy file). Light header.

#include <string>

#include <anvil/core/param.hpp>

namespace anvil {

struct InitConfig {
  Param<std::string, "weights",
        "a safetensors file whose tensors start the policy's network (a run's policy.safetensors, or a PyTorch "
        "state_dict saved as safetensors): every parameter by name and shape; not applied when a run resumes">
      weights{""};
};

}  // namespace anvil
