// Frame stacks stored once in the replay store (buffers/detail/frame_chains.hpp): a row keeps
// its stacks' newest frames, links to its env's previous row, and a sample rebuilds the
// stacks; every sampled observation is the bytes put in, whatever the episodes, the ring's
// wrapping, the stacks' shape or a checkpoint in between.

#include <anvil/buffers/detail/transition_store.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>
#include <torch/types.h>

#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/render/classic_views.hpp>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <unistd.h>
#include <vector>

using namespace anvil;

namespace {

// A spec whose observation is a stack of `frames` frames of 1x3x3 bytes (9 bytes each: the
// part is padded) beside one float.
EnvSpec stacked_spec(std::int64_t frames) {
  EnvSpec spec{"stacks", {}, envs::Box{{-1.f}, {1.f}}, {}};
  spec.layout.image("pixels", frames, 3, 3, frames).vector("state", 1);
  return spec;
}

// N envs handing out frame stacks as envs::Pixels does (a new frame each step, the oldest
// leaving; at a reset every slot holds the first frame), episodes of 1 to `longest` steps; or, with
// `chained` false, stacks of random frames that follow nothing. Each step's action is a
// number unique to the transition, to find what was put in.
struct Stacker {
  std::int64_t n, frames, row, state_at;
  bool chained = true;
  int longest = 7;
  std::mt19937 rng{7};
  std::vector<std::vector<std::uint8_t>> obs;  // per env: its current full row
  std::vector<int> left;                       // per env: steps left in its episode
  float counter = 0;
  std::map<float, std::pair<std::vector<std::uint8_t>, std::vector<std::uint8_t>>> put;  // action -> (obs, next_obs)

  Stacker(const EnvSpec& spec, std::int64_t envs, bool chain = true, int longest_episode = 7)
      : n(envs),
        frames(spec.layout.parts[0].frames),
        row(spec.layout.row_bytes()),
        state_at(spec.layout.parts[1].offset),
        chained(chain),
        longest(longest_episode) {
    for (std::int64_t i = 0; i < n; ++i) obs.push_back(reset());
    left.assign(static_cast<std::size_t>(n), 0);
    for (auto& l : left) l = episode();
  }
  int episode() { return 1 + static_cast<int>(rng() % static_cast<unsigned>(longest)); }
  void frame(std::uint8_t* f) {
    for (int b = 0; b < 9; ++b) f[b] = static_cast<std::uint8_t>(rng());
  }
  void state(std::vector<std::uint8_t>& r) {
    const float s = static_cast<float>(rng() % 1000) / 7.f;
    std::memcpy(r.data() + state_at, &s, 4);
  }
  std::vector<std::uint8_t> reset() {
    std::vector<std::uint8_t> r(static_cast<std::size_t>(row), 0);
    frame(r.data());
    for (std::int64_t k = 1; k < frames; ++k) std::memcpy(r.data() + 9 * k, r.data(), 9);
    if (9 * frames < state_at) r[static_cast<std::size_t>(9 * frames)] = static_cast<std::uint8_t>(rng());  // padding is kept too
    state(r);
    return r;
  }
  std::vector<std::uint8_t> next_of(const std::vector<std::uint8_t>& o) {
    auto r = o;
    if (chained) {
      std::memmove(r.data(), r.data() + 9, static_cast<std::size_t>(9 * (frames - 1)));
      frame(r.data() + 9 * (frames - 1));
    } else {
      for (std::int64_t k = 0; k < frames; ++k) frame(r.data() + 9 * k);
    }
    state(r);
    return r;
  }
  StepBatch step() {
    auto o = at::empty({n, row}, at::kByte), no = at::empty({n, row}, at::kByte);
    auto act = at::empty({n, 1}), trunc = at::zeros({n});
    for (std::int64_t i = 0; i < n; ++i) {
      const auto e = static_cast<std::size_t>(i);
      const auto next = next_of(obs[e]);
      std::memcpy(o.data_ptr<std::uint8_t>() + i * row, obs[e].data(), static_cast<std::size_t>(row));
      std::memcpy(no.data_ptr<std::uint8_t>() + i * row, next.data(), static_cast<std::size_t>(row));
      act[i][0] = ++counter;
      put[counter] = {obs[e], next};
      if (--left[e] == 0) {
        trunc[i] = 1.f;
        obs[e] = reset();
        left[e] = episode();
      } else {
        obs[e] = next;
      }
    }
    return StepBatch{o, act, at::zeros({n}), no, at::zeros({n}), trunc, {}};
  }
};

std::vector<std::uint8_t> bytes_of(const at::Tensor& r) {
  const auto c = r.contiguous();
  return {c.data_ptr<std::uint8_t>(), c.data_ptr<std::uint8_t>() + c.numel()};
}

// Every stored transition of `store`, gathered on the host and by tensor indexing (a GPU's
// way), which must agree.
ReplayBatch gather_all(anvil::detail::TransitionStore& store) {
  std::vector<std::int64_t> slots;
  for (std::int64_t k = 0; k < store.stored(); ++k)
    if (store.valid(k)) slots.push_back(k);
  REQUIRE(static_cast<std::int64_t>(slots.size()) == store.size());
  REQUIRE(!slots.empty());
  auto a = store.gather(slots);
  const auto b = store.gather_indexed(slots);
  CHECK(at::equal(a.obs, b.obs));
  CHECK(at::equal(a.next_obs, b.next_obs));
  return a;
}

// Every stored transition of `store` is what `s` put in.
void check_all(anvil::detail::TransitionStore& store, const Stacker& s) {
  const auto a = gather_all(store);
  for (std::int64_t i = 0; i < a.obs.size(0); ++i) {
    const auto& want = s.put.at(a.action[i][0].item<float>());
    REQUIRE(bytes_of(a.obs[i]) == want.first);
    REQUIRE(bytes_of(a.next_obs[i]) == want.second);
  }
}

}  // namespace

TEST_CASE("Frame stacks: each frame is stored once, and every sampled stack is the bytes put in") {
  for (const std::int64_t frames : {2, 3, 5}) {
    CAPTURE(frames);
    const auto spec = stacked_spec(frames);
    for (const std::int64_t envs : {1, 8}) {
      CAPTURE(envs);
      // capacity 40: the rings wrap several times over; capacity 2000 with episodes of one
      // or two steps (about 1.7 observation rows a transition): the observation ring is what
      // runs out, and transitions leave early where a row their stacks read is overwritten
      for (const auto& [capacity, longest] : {std::pair{40, 7}, std::pair{2000, 2}}) {
        CAPTURE(capacity);
        anvil::detail::TransitionStore store(spec, capacity, at::kCPU, "test");
        Stacker s(spec, envs, true, longest);
        for (int t = 0; t < 3 * capacity / envs; ++t) {
          store.add(s.step());
          if (t % 97 == 36) check_all(store, s);
        }
        check_all(store, s);
        CHECK(store.size() > capacity / 2);
        if (longest == 2 && frames < 5) CHECK(store.dropped() > 0);  // (5 frames: a margin that holds them)
      }
    }
  }
}

TEST_CASE("Frame stacks: stacks that follow nothing are stored as their own chains and still come back whole") {
  const auto spec = stacked_spec(3);
  for (const int capacity : {50, 800}) {  // 800: three rows a transition, more than the ring holds
    anvil::detail::TransitionStore store(spec, capacity, at::kCPU, "test");
    Stacker s(spec, 2, /*chain=*/false);
    for (int t = 0; t < 3 * capacity; ++t) store.add(s.step());
    check_all(store, s);
    if (capacity == 800) CHECK(store.dropped() > 0);
  }
}

TEST_CASE("Frame stacks: a row holds one frame, not the stack") {
  const auto spec = stacked_spec(4);
  auto flat = spec;
  flat.layout = ObsLayout{};
  flat.layout.image("pixels", 4, 3, 3).vector("state", 1);  // the same bytes, frames not marked
  anvil::detail::TransitionStore stacked(spec, 1000, at::kCPU, "test"), whole(flat, 1000, at::kCPU, "test");
  // per transition: 3 floats and 2 links (20 bytes); per observation row: 9 bytes of the
  // newest frame, 3 of padding, 4 of state (16), its owner and two frame links (12), against
  // the whole row (40) and its owner (4)
  const auto rows = whole.obs_capacity();
  CHECK(stacked.obs_capacity() == rows + 3 * 256);
  CHECK(whole.bytes() == 1000 * 20 + rows * (40 + 4));
  CHECK(stacked.bytes() == 1000 * 20 + stacked.obs_capacity() * (16 + 12));
  // PixelPendulum-v1's rows: 12,288 bytes a frame instead of 36,864
  const auto pixels = envs::spec_of(envs::PixelPendulum{});
  REQUIRE(pixels.layout.parts[0].frames == 3);
  anvil::detail::TransitionStore p(pixels, 100, at::kCPU, "test");
  auto one = pixels;
  one.layout = ObsLayout{};
  one.layout.image("pixels", 9, 64, 64);
  anvil::detail::TransitionStore q(one, 100, at::kCPU, "test");
  CHECK(q.bytes() == 100 * 20 + q.obs_capacity() * (36864 + 4));
  CHECK(p.bytes() == 100 * 20 + p.obs_capacity() * (12288 + 12));
}

TEST_CASE("Frame stacks: n-step transitions rebuild their obs and next_obs") {
  const auto spec = stacked_spec(3);
  // 2 envs; and 150 envs five steps apart in a ring of 918 rows, where a transition's first
  // observation is still stored when it completes but the frames before it are not (it leaves)
  for (const auto& [capacity, envs] : {std::pair{60, 2}, std::pair{150, 150}}) {
    CAPTURE(envs);
    anvil::detail::TransitionStore store(spec, capacity, at::kCPU, "test", /*n_step=*/5);
    Stacker s(spec, envs, true, 40);
    for (int t = 0; t < 30 + 3000 / envs; ++t) store.add(s.step());
    const auto a = gather_all(store);
    for (std::int64_t i = 0; i < a.obs.size(0); ++i) {
      const float act = a.action[i][0].item<float>();
      REQUIRE(bytes_of(a.obs[i]) == s.put.at(act).first);
      // next_obs is the same env's next_obs 1 to 5 steps on (its actions come every `envs`)
      bool found = false;
      for (int j = 0; j < 5 && !found; ++j)
        if (const auto it = s.put.find(act + static_cast<float>(envs * j)); it != s.put.end())
          found = bytes_of(a.next_obs[i]) == it->second.second;
      CHECK(found);
    }
    if (envs == 150) CHECK(store.dropped() > 0);
  }
}

TEST_CASE("Frame stacks: the links survive a save and load, and a store of whole rows refuses the file") {
  const auto spec = stacked_spec(3);
  UniformBuffer::Config c;
  c.capacity = 64;
  UniformBuffer a(spec, c, RunContext{.seed = 3});
  Stacker s(spec, 3);
  for (int t = 0; t < 90; ++t) a.add(s.step());
  const auto file = std::filesystem::temp_directory_path() / ("anvil_frames_" + std::to_string(::getpid()) + ".bin");
  a.save(file);
  UniformBuffer b(spec, c, RunContext{.seed = 3});
  b.load(file);
  for (int t = 0; t < 30; ++t) {  // both go on alike, chains continued across the load
    const auto step = s.step();
    a.add(step);
    b.add(step);
  }
  for (int k = 0; k < 4; ++k) {
    const auto x = a.sample(32), y = b.sample(32);
    CHECK(at::equal(x.index, y.index));
    CHECK(at::equal(x.obs, y.obs));
    CHECK(at::equal(x.next_obs, y.next_obs));
    for (std::int64_t i = 0; i < 32; ++i) CHECK(bytes_of(y.obs[i]) == s.put.at(y.action[i][0].item<float>()).first);
  }
  auto flat = spec;
  flat.layout = ObsLayout{};
  flat.layout.image("pixels", 3, 3, 3).vector("state", 1);
  UniformBuffer whole(flat, c, RunContext{});
  CHECK_THROWS_WITH_AS(whole.load(file), doctest::Contains("in the file but"), Error);
  std::filesystem::remove(file);
}

TEST_CASE("Frame stacks: a part whose channels are not a stack of its frames is refused, naming it") {
  CHECK_THROWS_WITH_AS(ObsLayout{}.image("cam", 4, 8, 8, 3), doctest::Contains("observation part cam: 4 channels are not a stack of 3 frames"),
                       ConfigError);
}
