// A Python env bridge as a stale build leaves one: its entry point is there, but it was built
// from other anvil headers than the program loading it (its fingerprint differs). The program
// must refuse it, naming it, before calling anything in it.
#include <cstdint>

#include <anvil/envs/python_env.hpp>

extern "C" __attribute__((visibility("default"))) void anvil_python_make_env(const void*, const void*, void*) {
  __builtin_trap();  // never called: the fingerprint is checked first
}

extern "C" __attribute__((visibility("default"))) std::uint64_t anvil_python_abi() {
  return anvil::envs::python::abi_fingerprint() + 1;
}
