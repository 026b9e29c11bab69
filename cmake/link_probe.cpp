// A program linked as anvil's training mains are (LibTorch, yaml-cpp), whose main does
// nothing: scripts/link_order.py reads the libraries it loads and the symbols they bind.
// It names a symbol of c10, yaml-cpp and libm so that the linker keeps them as direct
// dependencies, as it does for a training main.
#include <c10/core/Device.h>
#include <yaml-cpp/yaml.h>

#include <cmath>

int main(int argc, char**) {
  if (argc > 1000) {  // never: only the references matter
    (void)YAML::Load("1");
    (void)c10::Device("cpu");
    return static_cast<int>(std::exp(static_cast<double>(argc)));
  }
  return 0;
}
