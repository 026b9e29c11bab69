#pragma once
/// @file
/// Seeding: one `seed` field gives every random stream of a run (torch, each env, the
/// buffer, exploration) its own independent seed. Light header: no torch.

#include <cstdint>
#include <limits>

namespace anvil {

/// One step of SplitMix64 (Steele, Lea, Flood 2014): a bijective 64-bit mixer. Used to
/// derive well-separated seeds from one user seed.
[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The random streams of a run. Each gets seeds no other stream gets.
enum class Stream : std::uint64_t { torch = 1, env = 2, eval_env = 3, buffer = 4, exploration = 5 };

/// Seed for stream `s`, instance `index` (env number, rank, ...), derived from `seed`.
[[nodiscard]] constexpr std::uint64_t derive_seed(std::uint64_t seed, Stream s,
                                                  std::uint64_t index = 0) noexcept {
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<std::uint64_t>(s)) + index);
}

/// Small, fast, seedable generator (xoshiro256** by Blackman and Vigna) for envs and
/// buffers. Satisfies std::uniform_random_bit_generator; its state is four words, so it
/// is cheap to save in checkpoints.
class Rng {
 public:
  using result_type = std::uint64_t;
  constexpr explicit Rng(std::uint64_t seed = 0) noexcept { reseed(seed); }

  constexpr void reseed(std::uint64_t seed) noexcept {
    for (auto& w : s_) {
      seed = splitmix64(seed);
      w = seed;
    }
  }
  static constexpr result_type min() noexcept { return 0; }
  static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }

  constexpr result_type operator()() noexcept {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform double in [0, 1) with 53 random bits.
  constexpr double uniform() noexcept { return static_cast<double>((*this)() >> 11) * 0x1.0p-53; }
  /// Uniform double in [lo, hi).
  constexpr double uniform(double lo, double hi) noexcept { return lo + (hi - lo) * uniform(); }
  /// Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias below 2^-64 * n).
  constexpr std::uint64_t below(std::uint64_t n) noexcept {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>((*this)()) * n) >> 64);
  }

  /// The generator's state, for checkpoints.
  struct State {
    std::uint64_t s[4];
  };
  [[nodiscard]] constexpr State state() const noexcept { return {{s_[0], s_[1], s_[2], s_[3]}}; }
  constexpr void set_state(const State& st) noexcept {
    for (int i = 0; i < 4; ++i) s_[i] = st.s[i];
  }
  friend constexpr bool operator==(const Rng& a, const Rng& b) noexcept {
    return a.s_[0] == b.s_[0] && a.s_[1] == b.s_[1] && a.s_[2] == b.s_[2] && a.s_[3] == b.s_[3];
  }

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept {
    return (x << k) | (x >> (64 - k));
  }
  std::uint64_t s_[4]{};
};

}  // namespace anvil
