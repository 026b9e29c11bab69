// Reading the world a launcher describes in the environment (light header: no torch).
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include <anvil/parallel/world.hpp>

using namespace anvil;

namespace {
// Sets the launcher variables for one test and clears them after.
struct Env {
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* k : kAll) ::unsetenv(k);
    for (auto [k, v] : vars) ::setenv(k, v, 1);
  }
  ~Env() {
    for (const char* k : kAll) ::unsetenv(k);
  }
  static constexpr const char* kAll[] = {"RANK",        "WORLD_SIZE", "LOCAL_RANK",        "LOCAL_WORLD_SIZE",
                                         "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",       "NODE_RANK",
                                         "NNODES",      "ANVIL_AGENT_STORE", "TORCHELASTIC_USE_AGENT_STORE",
                                         "TORCHELASTIC_RESTART_COUNT"};
};
std::string error_of(auto f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("World: a plain start has no world in the environment") {
  Env env{};
  CHECK_FALSE(dist::world_from_env().has_value());
}

TEST_CASE("World: torchrun's variables, with its agent store and attempt prefix") {
  Env env{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29400"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "2"}};
  const auto w = dist::world_from_env();
  REQUIRE(w.has_value());
  CHECK(w->rank == 3);
  CHECK(w->world_size == 4);
  CHECK(w->local_rank == 1);
  CHECK(w->local_world_size == 2);
  CHECK(w->node_rank == 1);
  CHECK(w->rendezvous() == "10.0.0.5:29400");
  CHECK(w->agent_store);
  CHECK(w->store_prefix == "/worker/attempt_2");
}

TEST_CASE("World: a SLURM-style world without an agent store has rank 0 serve it") {
  Env env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "node1"}, {"MASTER_PORT", "1234"}};
  const auto w = dist::world_from_env();
  REQUIRE(w.has_value());
  CHECK_FALSE(w->agent_store);
  CHECK(w->local_world_size == 2);
}

TEST_CASE("World: a missing or malformed variable is named") {
  {
    Env env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }).find("MASTER_PORT is not") != std::string::npos);
  }
  {
    Env env{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }) == "environment variable RANK=2 is out of range [0, 1]");
  }
  {
    Env env{{"RANK", "0"}, {"WORLD_SIZE", "two"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }) == "environment variable WORLD_SIZE='two' is not an integer");
  }
  {
    Env env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }) ==
          "environment variable MASTER_PORT=70000 is out of range [1, 65535]");
  }
}
