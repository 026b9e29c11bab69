#pragma once
/// @file
/// A cooperative multi-UAV mapping mission: agents fly over a field at one of three
/// altitudes, each step measuring the cells under them with a sensor whose footprint grows
/// and whose accuracy falls with altitude, and a shared belief map of where the targets
/// (e.g. weeds) are is updated from the measurements. The mission has a budget of steps;
/// the team is rewarded for the reduction of the map's entropy. Written here after the
/// setting of Westheider, Rückin, Popović, "Multi-UAV Adaptive Path Planning Using Deep
/// Reinforcement Learning" (IROS 2023): 4 agents, a budget of 14 steps, 3 altitudes,
/// COMA. Reference policies (random, lawnmower) are here too. Light header: no torch.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>

#include <anvil/core/random.hpp>
#include <anvil/envs/multi_agent/multi_agent_env.hpp>

namespace anvil::envs {

/// What the mapping mission rewards (see `MappingTask`).
enum class MappingReward : std::uint8_t {
  weighted_entropy,  ///< entropy removed, each cell weighted by its belief (targets count)
  entropy,           ///< entropy removed, every cell alike
};

/// The mapping mission (see file comment):
///
/// - the field is a 32 x 32 grid of cells; a target map is drawn per episode as 3-6 discs
///   of radius 2-5 cells at random centres (about 15% of the cells);
/// - agents stand over an 8 x 8 grid of positions (one per 4 x 4 block of cells) at
///   altitude 0, 1 or 2; actions: 0 stay, 1 north (+y), 2 south, 3 east (+x), 4 west,
///   5 up, 6 down; moves off the grid or beyond the altitudes are unavailable;
/// - each step every agent measures the square of cells centred under it, 4, 8 or 12 cells
///   wide at altitude 0, 1, 2; each measured cell reads its truth flipped with probability
///   0.05, 0.15, 0.25 (independently per cell and measurement);
/// - the belief map holds each cell's probability of being a target (prior 0.5), updated
///   by Bayes' rule in log-odds from every measurement;
/// - reward each step (`MappingReward::weighted_entropy`, the default): the *weighted*
///   entropy removed that step, as a fraction of the prior map's weighted entropy. A cell's
///   binary entropy (bits) is weighted by what the updated map believes of it: 1 where a
///   target is more likely than not, 0 where it is less likely, 1/2 where the belief is
///   even (the class weighting of Westheider et al.'s mapping mission, which cares about
///   the targets and not about confirming empty ground). So an episode's return is the
///   share of the map's target-relevant uncertainty the mission removed, and a team earns
///   more by measuring where targets are than by sweeping empty ground.
///   `MappingReward::entropy` weighs every cell 1 (plain entropy reduction);
/// - the episode ends (terminated: the mission is over) after the budget of 14 steps;
/// - start: agents at random positions at altitude 0, their first measurement taken;
/// - an agent observes its position (x, y in [0, 1]), its altitude (one-hot), the budget
///   left (fraction), every other agent's offset (dx, dy, d-altitude), and the belief map
///   summarised per block (8 x 8): the cells' mean entropy (what is still unknown) and
///   their mean probability of a target (where the reward's weight lies); the state is the
///   two block summaries, every agent's position and altitude, and the budget left.
///
/// Trivially copyable (checkpoints save it, the generator included, as bytes).
class MappingTask {
 public:
  static constexpr std::string_view name = "Mapping";
  static constexpr int kAgents = 4, kCells = 32, kPositions = 8, kBlock = kCells / kPositions, kAltitudes = 3;
  static constexpr int kActions = 7;
  static constexpr std::int64_t kBudget = 14, kSteps = kBudget;  ///< kSteps: steps an episode takes
  static constexpr std::array<int, kAltitudes> kFootprintHalf{2, 4, 6};   ///< cells each side of the centre
  static constexpr std::array<double, kAltitudes> kFlip{0.05, 0.15, 0.25};  ///< per-cell error probability
  enum Action : std::int64_t { stay = 0, north, south, east, west, up, down };

  explicit MappingTask(MappingReward reward = MappingReward::weighted_entropy) noexcept : reward_(reward) {}

  [[nodiscard]] std::int64_t num_agents() const noexcept { return kAgents; }
  [[nodiscard]] std::int64_t agent_observation_size() const noexcept {
    return 2 + kAltitudes + 1 + 3 * (kAgents - 1) + 2 * kPositions * kPositions;
  }
  [[nodiscard]] std::int64_t num_actions() const noexcept { return kActions; }
  [[nodiscard]] std::int64_t state_size() const noexcept {
    return 2 * kPositions * kPositions + kAgents * (2 + kAltitudes) + 1;
  }

  void reset(std::uint64_t seed) {
    rng_.reseed(seed);
    truth_.fill(0);
    const int discs = 3 + static_cast<int>(rng_.below(4));
    for (int d = 0; d < discs; ++d) {
      const double cx = rng_.uniform(0, kCells), cy = rng_.uniform(0, kCells), r = rng_.uniform(2, 5);
      for (int y = 0; y < kCells; ++y)
        for (int x = 0; x < kCells; ++x)
          if (std::hypot(x + 0.5 - cx, y + 0.5 - cy) <= r) truth_[index(x, y)] = 1;
    }
    log_odds_.fill(0.0);
    cell_h_.fill(1.0);
    for (auto& a : agents_) a = Pose{static_cast<int>(rng_.below(kPositions)), static_cast<int>(rng_.below(kPositions)), 0};
    sweep_north_.fill(true);
    steps_ = 0;
    started_ = true;
    for (const auto& a : agents_) measure(a);
    update_entropies();
  }

  TeamStep step(std::span<const std::int64_t> actions) {
    if (!started_) throw EnvError("Mapping: step before reset");
    if (steps_ >= kBudget) throw EnvError("Mapping: step after the budget of 14 steps is spent");
    for (int i = 0; i < kAgents; ++i) {
      const auto a = actions[static_cast<std::size_t>(i)];
      if (a < 0 || a >= kActions || !available(agents_[i], a))
        throw EnvError("Mapping: agent " + std::to_string(i) + " cannot take action " + std::to_string(a) + " now");
    }
    for (int i = 0; i < kAgents; ++i) agents_[i] = moved(agents_[i], actions[static_cast<std::size_t>(i)]);
    for (const auto& a : agents_) measure(a);
    const double removed = update_entropies();
    ++steps_;
    return TeamStep{removed / prior_entropy(reward_), steps_ >= kBudget, false};
  }

  void observe(std::int64_t agent, std::span<float> out) const noexcept {
    const auto& me = agents_[static_cast<std::size_t>(agent)];
    std::size_t k = 0;
    out[k++] = static_cast<float>(me.x) / (kPositions - 1);
    out[k++] = static_cast<float>(me.y) / (kPositions - 1);
    for (int h = 0; h < kAltitudes; ++h) out[k++] = me.alt == h ? 1.0f : 0.0f;
    out[k++] = budget_left();
    for (int j = 0; j < kAgents; ++j) {
      if (j == agent) continue;
      out[k++] = static_cast<float>(agents_[j].x - me.x) / (kPositions - 1);
      out[k++] = static_cast<float>(agents_[j].y - me.y) / (kPositions - 1);
      out[k++] = static_cast<float>(agents_[j].alt - me.alt) / (kAltitudes - 1);
    }
    block_summaries(out.subspan(k, 2 * kPositions * kPositions));
  }
  void available_actions(std::int64_t agent, std::span<float> out) const noexcept {
    for (int a = 0; a < kActions; ++a)
      out[static_cast<std::size_t>(a)] = available(agents_[static_cast<std::size_t>(agent)], a) ? 1.0f : 0.0f;
  }
  void write_state(std::span<float> out) const noexcept {
    block_summaries(out.subspan(0, 2 * kPositions * kPositions));
    std::size_t k = 2 * kPositions * kPositions;
    for (const auto& a : agents_) {
      out[k++] = static_cast<float>(a.x) / (kPositions - 1);
      out[k++] = static_cast<float>(a.y) / (kPositions - 1);
      for (int h = 0; h < kAltitudes; ++h) out[k++] = a.alt == h ? 1.0f : 0.0f;
    }
    out[k++] = budget_left();
  }

  // --- What a mission ends with, and the reference policies -------------------------

  /// The map's entropy left, as a fraction of the prior's (1 at the start of nothing known).
  [[nodiscard]] double entropy_fraction() const noexcept { return entropy_ / prior_entropy(MappingReward::entropy); }
  /// The map's weighted entropy left (see the reward), as a fraction of the prior's.
  [[nodiscard]] double weighted_entropy_fraction() const noexcept {
    double h = 0;
    for (int c = 0; c < kCells * kCells; ++c) h += weight(probability(c)) * cell_h_[static_cast<std::size_t>(c)];
    return h / prior_entropy(MappingReward::weighted_entropy);
  }
  [[nodiscard]] MappingReward reward_kind() const noexcept { return reward_; }
  /// Mean absolute error of the belief map against the targets (0.5 for the prior).
  [[nodiscard]] double map_error() const noexcept {
    double e = 0;
    for (int c = 0; c < kCells * kCells; ++c) e += std::abs(probability(c) - truth_[static_cast<std::size_t>(c)]);
    return e / (kCells * kCells);
  }
  /// Whether agent `i` may take action `a` now.
  [[nodiscard]] bool available(int i, std::int64_t a) const noexcept { return available(agents_[i], a); }
  /// Agent `i`'s position and altitude.
  [[nodiscard]] std::array<int, 3> pose(int i) const noexcept { return {agents_[i].x, agents_[i].y, agents_[i].alt}; }
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  /// The belief that cell (x, y) holds a target, and whether it does.
  [[nodiscard]] double belief(int x, int y) const noexcept { return probability(static_cast<int>(index(x, y))); }
  [[nodiscard]] bool target(int x, int y) const noexcept { return truth_[index(x, y)] != 0; }

  /// A lawnmower sweep: agent i owns the strip of columns [2i, 2i + 2), climbs to altitude
  /// 1 (its footprint covers the strip), flies to the strip, then sweeps it north and south.
  [[nodiscard]] std::array<std::int64_t, kAgents> lawnmower() const noexcept {
    std::array<std::int64_t, kAgents> act{};
    constexpr int strip = kPositions / kAgents;
    for (int i = 0; i < kAgents; ++i) {
      const auto& a = agents_[i];
      const int target_x = i * strip + strip / 2;  // the footprint at altitude 1 spans the strip
      if (a.alt < 1) act[i] = up;
      else if (a.alt > 1) act[i] = down;
      else if (a.x < target_x) act[i] = east;
      else if (a.x > target_x) act[i] = west;
      else {
        // Sweep: north on even passes, south on odd ones, turning at the edges.
        const bool north_pass = sweep_north_[i];
        if (north_pass && a.y + 1 < kPositions) act[i] = north;
        else if (!north_pass && a.y > 0) act[i] = south;
        else act[i] = north_pass ? south : north;
      }
    }
    return act;
  }
  /// Call after stepping with `lawnmower()` actions: turns the sweeps at the edges.
  void lawnmower_turns() noexcept {
    for (int i = 0; i < kAgents; ++i) {
      if (agents_[i].y + 1 >= kPositions) sweep_north_[i] = false;
      if (agents_[i].y <= 0) sweep_north_[i] = true;
    }
  }

 private:
  struct Pose {
    int x = 0, y = 0, alt = 0;
  };
  // The prior map's (weighted) entropy: 1 bit per cell at p = 0.5, weighted 1/2 when weighted.
  static constexpr double prior_entropy(MappingReward r) noexcept {
    return (r == MappingReward::weighted_entropy ? 0.5 : 1.0) * kCells * kCells;
  }
  // The weight of a cell the map believes holds a target with probability p.
  static constexpr double weight(double p) noexcept { return p > 0.501 ? 1.0 : p < 0.499 ? 0.0 : 0.5; }

  static constexpr std::size_t index(int x, int y) noexcept { return static_cast<std::size_t>(y * kCells + x); }
  [[nodiscard]] double probability(int c) const noexcept { return 1.0 / (1.0 + std::exp(-log_odds_[static_cast<std::size_t>(c)])); }
  static double binary_entropy(double p) noexcept {
    if (p <= 0.0 || p >= 1.0) return 0.0;
    return -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
  }
  // Brings the cells' entropies, the blocks' means (for the observations) and the map's
  // entropy up to date with the belief map; returns the (weighted) entropy removed since
  // the last call, each cell weighted by the updated belief.
  double update_entropies() noexcept {
    double total = 0, removed = 0;
    for (int by = 0; by < kPositions; ++by)
      for (int bx = 0; bx < kPositions; ++bx) {
        double h = 0, ps = 0;
        for (int y = by * kBlock; y < (by + 1) * kBlock; ++y)
          for (int x = bx * kBlock; x < (bx + 1) * kBlock; ++x) {
            const auto c = index(x, y);
            const double p = probability(static_cast<int>(c));
            const double hc = binary_entropy(p);
            removed += (reward_ == MappingReward::weighted_entropy ? weight(p) : 1.0) * (cell_h_[c] - hc);
            cell_h_[c] = hc;
            h += hc;
            ps += p;
          }
        block_h_[static_cast<std::size_t>(by * kPositions + bx)] = static_cast<float>(h / (kBlock * kBlock));
        block_p_[static_cast<std::size_t>(by * kPositions + bx)] = static_cast<float>(ps / (kBlock * kBlock));
        total += h;
      }
    entropy_ = total;
    return removed;
  }
  // The blocks' mean entropies, then their mean target probabilities.
  void block_summaries(std::span<float> out) const noexcept {
    std::copy(block_h_.begin(), block_h_.end(), out.begin());
    std::copy(block_p_.begin(), block_p_.end(), out.begin() + kPositions * kPositions);
  }
  [[nodiscard]] float budget_left() const noexcept { return static_cast<float>(kBudget - steps_) / kBudget; }

  static bool available(const Pose& p, std::int64_t a) noexcept {
    switch (a) {
      case stay: return true;
      case north: return p.y + 1 < kPositions;
      case south: return p.y > 0;
      case east: return p.x + 1 < kPositions;
      case west: return p.x > 0;
      case up: return p.alt + 1 < kAltitudes;
      case down: return p.alt > 0;
      default: return false;
    }
  }
  static Pose moved(Pose p, std::int64_t a) noexcept {
    if (a == north) ++p.y;
    if (a == south) --p.y;
    if (a == east) ++p.x;
    if (a == west) --p.x;
    if (a == up) ++p.alt;
    if (a == down) --p.alt;
    return p;
  }
  // One noisy measurement of the footprint under `p`, folded into the belief map.
  void measure(const Pose& p) {
    const int half = kFootprintHalf[static_cast<std::size_t>(p.alt)];
    const double flip = kFlip[static_cast<std::size_t>(p.alt)];
    const double evidence = std::log((1 - flip) / flip);
    const int cx = p.x * kBlock + kBlock / 2, cy = p.y * kBlock + kBlock / 2;
    for (int y = std::max(0, cy - half); y < std::min(kCells, cy + half); ++y)
      for (int x = std::max(0, cx - half); x < std::min(kCells, cx + half); ++x) {
        const bool t = truth_[index(x, y)] != 0;
        const bool reading = rng_.uniform() < flip ? !t : t;
        log_odds_[index(x, y)] += reading ? evidence : -evidence;
      }
  }

  Rng rng_{0};
  std::array<std::uint8_t, kCells * kCells> truth_{};
  std::array<double, kCells * kCells> log_odds_{};
  std::array<double, kCells * kCells> cell_h_{};  // each cell's entropy (bits) at the last update
  std::array<Pose, kAgents> agents_{};
  std::array<bool, kAgents> sweep_north_{true, true, true, true};
  std::array<float, kPositions * kPositions> block_h_{}, block_p_{};
  double entropy_ = kCells * kCells;
  MappingReward reward_ = MappingReward::weighted_entropy;
  std::int64_t steps_ = 0;
  bool started_ = false;
};

static_assert(MultiAgentEnv<MappingTask>);

}  // namespace anvil::envs
