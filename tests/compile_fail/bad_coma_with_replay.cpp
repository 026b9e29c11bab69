// expect: Trainer: the Algorithm learns from whole episodes of its current policy (the episodic loop, e.g. COMA) but the Buffer replays old transitions; use EpisodeBuffer
#include "common.hpp"
#include <anvil/algorithms/coma.hpp>
#include <anvil/envs/multi_agent/simple_spread.hpp>

int main() {
  anvil::Trainer<anvil::COMA, anvil::UniformBuffer> t(anvil::envs::Joint<anvil::envs::SimpleSpread>{}, anvil::Args{});
  t.fit();
}
