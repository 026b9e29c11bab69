#pragma once
/// @file
/// The multi-UAV mapping mission as Westheider, Rückin, Popović publish it ("Multi-UAV
/// Adaptive Path Planning Using Deep Reinforcement Learning", IROS 2023, arXiv 2303.01150),
/// beside this library's own mission (mapping.hpp): its field, altitudes, camera, sensor
/// noise, communication, reward and budget, and its inputs, map channels for a CNN. The
/// paper's text gives the setting; the numbers are those of its public implementation
/// (dmar-bonn/ipp-marl, marl_framework/: params.yaml and the files named below), read, not
/// copied. Light header: no torch.
///
/// - **Field** 50 m x 50 m (params.yaml environment.x_dim, y_dim), held as 100 x 100 cells
///   of 0.5 m. The implementation's cells are about 0.1 m (493 x 493, mapping/grid_maps.py);
///   0.5 m keeps a step within a few hundred microseconds on one core, and every input the
///   networks see is the map shrunk to 11 x 11 (below), as there.
/// - **Targets**: one rectangular region against one of the field's four edges (drawn per
///   episode), 30-60 % of the field's depth, the rest empty: the ground truth the
///   implementation trains on (mapping/ground_truths.py, layout 0). Prior 0.5 per cell.
/// - **Agents**: 4 (params.yaml n_agents) over an 11 x 11 grid of positions 5 m apart
///   (0 .. 50 m) at 5, 10 or 15 m (agent/state_space.py); actions (agent/action_space.py, 6):
///   0 up, 1 -x, 2 -y, 3 +y, 4 +x, 5 down, each 5 m; moves off the grid or beyond the
///   altitudes are unavailable; there is no "stay". They start at random positions at
///   15 m. The implementation also keeps two agents from choosing the same x-y cell in one
///   step (a sequential mask); this env does not (joint actions are chosen at once), and,
///   as there, there is no collision penalty.
/// - **Camera** 60 x 60 degrees (params.yaml sensor.fov): a square footprint 2 h tan 30 deg
///   wide, 5.8, 11.5, 17.3 m at the three altitudes (sensors/cameras.py), centred under the
///   agent and clipped to the field.
/// - **Sensor**: each cell of a footprint reads its class wrongly with probability 0.01,
///   0.265, 0.375 at 5, 10, 15 m (sensors/models/sensor_models.py); a reading is fused into
///   a map by Bayes' rule in log-odds, z = 1 - e for "target" and e for "empty" (e: that
///   error), p clamped to [1e-4, 0.9999] (mapping/mappings.py).
/// - **Communication**: each agent keeps its own map; an agent's measurement reaches the
///   agents within 25 m (3-D distance, params.yaml communication_range) and is fused into
///   theirs (agent/communication_log.py). The team's map fuses every measurement.
/// - **Reward** (utils/reward.py), one for the team each step: 22 r - 0.5, where r is the
///   step's relative reduction of the team map's weighted entropy, sum w (H_before -
///   H_after) / sum w H_before; w per cell from the updated map: 1 where p > 0.501, 0.5 for
///   p in [0.499, 0.501], 0 below (class_weighting [0, 1]); H binary entropy in bits.
/// - **Budget** 14 (params.yaml budget): a first measurement where the agents start, then
///   steps t = 0 .. 14 (15 moves, each followed by a measurement); the episode ends
///   (terminated) after the last (missions/episode_generator.py).
/// - **Inputs** (actor/transformations.py, critic/transformations.py): an agent's
///   observation is 7 maps of 11 x 11 (channel-major): the budget left (14 - t) / 14 and
///   its id (i + 1) / 4, each a constant map; a map centred on the agent over the position
///   grid (1 on the field, 0 beyond it, (altitude index + 1) / 4 where it and the agents in
///   communication range are); its own map's weighted entropy (w H per cell); that within
///   its current footprint, 0 elsewhere; its map's probabilities; and this step's
///   footprints (1 its own, 0 those of the agents it heard, 0.5 elsewhere). Field maps are
///   shrunk to 11 x 11 by area averages. The state (the critic's) is 4 maps of 11 x 11 --
///   every agent's position ((altitude index + 1) / 3 at its cell), the team map's weighted
///   entropy and probabilities, and every footprint of this step (1, else 0) -- and the
///   budget left. The implementation's critic also reads the other agents' actions as a
///   map; COMA's critic here reads them as one-hots (algorithms/coma.hpp).
///
/// The env declares its maps (`observation_map`, `state_map`), so COMA reads them through
/// a CNN (coma.map_encoder: the implementation's three convolutions, 5x5, 4x4, 4x4, 256
/// channels). Trivially copyable: checkpoints save it as bytes.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>

#include <anvil/core/random.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/envs/multi_agent/multi_agent_env.hpp>

namespace anvil::envs {

/// The published mapping mission (see file comment).
class PublishedMapping {
 public:
  static constexpr std::string_view name = "MappingWestheider";
  static constexpr int kAgents = 4, kCells = 100, kGrid = 11, kAltitudes = 3, kActions = 6, kMaps = 7, kStateMaps = 4;
  static constexpr int kSide = 11;                 ///< the input maps' side
  static constexpr double kCellM = 0.5, kSpacingM = 5.0, kRangeM = 25.0;
  static constexpr std::int64_t kBudget = 14, kSteps = kBudget + 1;
  static constexpr std::array<double, kAltitudes> kAltitudeM{5, 10, 15};
  static constexpr std::array<double, kAltitudes> kError{0.01, 0.265, 0.375};  ///< misclassification per altitude
  enum Action : std::int64_t { up = 0, minus_x, minus_y, plus_y, plus_x, down };

  [[nodiscard]] std::int64_t num_agents() const noexcept { return kAgents; }
  [[nodiscard]] std::int64_t agent_observation_size() const noexcept { return kMaps * kSide * kSide; }
  [[nodiscard]] std::int64_t num_actions() const noexcept { return kActions; }
  [[nodiscard]] std::int64_t state_size() const noexcept { return kStateMaps * kSide * kSide + 1; }
  /// The maps at the start of an observation and of the state (channels, height, width).
  [[nodiscard]] MapShape observation_map() const noexcept { return {kMaps, kSide, kSide}; }
  [[nodiscard]] MapShape state_map() const noexcept { return {kStateMaps, kSide, kSide}; }

  void reset(std::uint64_t seed) {
    rng_.reseed(seed);
    truth_.fill(0);
    const int edge = static_cast<int>(rng_.below(4));
    const int depth = kCells * (30 + static_cast<int>(rng_.below(31))) / 100;  // 30-60 % of the field
    for (int y = 0; y < kCells; ++y)
      for (int x = 0; x < kCells; ++x) {
        const int d = edge == 0 ? y : edge == 1 ? kCells - 1 - y : edge == 2 ? x : kCells - 1 - x;
        truth_[index(x, y)] = d < depth ? 1 : 0;
      }
    team_.fill(0.0f);
    for (auto& m : local_) m.fill(0.0f);
    for (auto& a : agents_) a = Pose{static_cast<int>(rng_.below(kGrid)), static_cast<int>(rng_.below(kGrid)), kAltitudes - 1};
    sweep_north_.fill(true);
    steps_ = 0;
    started_ = true;
    measure_all();
    refresh();
  }

  TeamStep step(std::span<const std::int64_t> actions) {
    if (!started_) throw EnvError("MappingWestheider: step before reset");
    if (steps_ >= kSteps) throw EnvError("MappingWestheider: step after the budget (14: steps 0 .. 14) is spent");
    for (int i = 0; i < kAgents; ++i) {
      const auto a = actions[static_cast<std::size_t>(i)];
      if (a < 0 || a >= kActions || !available(agents_[i], a))
        throw EnvError("MappingWestheider: agent " + std::to_string(i) + " cannot take action " + std::to_string(a) + " now");
    }
    for (int i = 0; i < kAgents; ++i) agents_[i] = moved(agents_[i], actions[static_cast<std::size_t>(i)]);
    const Map prior = team_;
    measure_all();
    ++steps_;
    // The step's relative reduction of the weighted entropy, each cell weighted by the map
    // after the update (refresh: the sum before; weighted_entropy_: after).
    const double before = refresh(&prior);
    const double relative = before > 0 ? (before - weighted_entropy_) / before : 0.0;
    return TeamStep{22.0 * relative - 0.5, steps_ >= kSteps, false};
  }

  void observe(std::int64_t agent, std::span<float> out) const noexcept {
    const auto i = static_cast<std::size_t>(agent);
    const auto& me = agents_[i];
    float* o = out.data();
    constexpr int n = kSide * kSide;
    std::fill(o, o + n, static_cast<float>(kSteps - 1 - std::min<std::int64_t>(steps_, kSteps - 1)) / kBudget);
    std::fill(o + n, o + 2 * n, static_cast<float>(agent + 1) / kAgents);
    float* pos = o + 2 * n;
    for (int dy = -5; dy <= 5; ++dy)
      for (int dx = -5; dx <= 5; ++dx) {
        const int x = me.x + dx, y = me.y + dy;
        pos[(dy + 5) * kSide + (dx + 5)] = x >= 0 && x < kGrid && y >= 0 && y < kGrid ? 1.0f : 0.0f;
      }
    for (int j = 0; j < kAgents; ++j)
      if (j == static_cast<int>(agent) || heard_[i][static_cast<std::size_t>(j)])
        pos[(agents_[j].y - me.y + 5) * kSide + (agents_[j].x - me.x + 5)] = static_cast<float>(agents_[j].alt + 1) / 4.0f;
    // The agent's own map: weighted entropy, that within the footprint, probabilities.
    std::array<float, kCells * kCells> wh{}, in_fp{}, p{}, fp{};
    const auto& m = local_[i];
    const auto& mine = footprint_[i];
    for (int y = 0; y < kCells; ++y)
      for (int x = 0; x < kCells; ++x) {
        const auto c = index(x, y);
        const double pc = probability(m[c]);
        wh[c] = static_cast<float>(weight(pc) * binary_entropy(pc));
        in_fp[c] = mine.contains(x, y) ? wh[c] : 0.0f;
        p[c] = static_cast<float>(pc);
        float f = 0.5f;
        for (int j = 0; j < kAgents; ++j)
          if (j != static_cast<int>(agent) && heard_[i][static_cast<std::size_t>(j)] && footprint_[j].contains(x, y)) f = 0.0f;
        fp[c] = mine.contains(x, y) ? 1.0f : f;
      }
    shrink(wh, o + 3 * n);
    shrink(in_fp, o + 4 * n);
    shrink(p, o + 5 * n);
    shrink(fp, o + 6 * n);
  }
  void available_actions(std::int64_t agent, std::span<float> out) const noexcept {
    for (int a = 0; a < kActions; ++a)
      out[static_cast<std::size_t>(a)] = available(agents_[static_cast<std::size_t>(agent)], a) ? 1.0f : 0.0f;
  }
  void write_state(std::span<float> out) const noexcept {
    float* o = out.data();
    constexpr int n = kSide * kSide;
    std::fill(o, o + n, 0.0f);
    for (const auto& a : agents_) o[a.y * kSide + a.x] = std::max(o[a.y * kSide + a.x], static_cast<float>(a.alt + 1) / 3.0f);
    std::array<float, kCells * kCells> wh{}, p{}, fp{};
    for (int y = 0; y < kCells; ++y)
      for (int x = 0; x < kCells; ++x) {
        const auto c = index(x, y);
        const double pc = probability(team_[c]);
        wh[c] = static_cast<float>(weight(pc) * binary_entropy(pc));
        p[c] = static_cast<float>(pc);
        bool any = false;
        for (const auto& f : footprint_) any = any || f.contains(x, y);
        fp[c] = any ? 1.0f : 0.0f;
      }
    shrink(wh, o + n);
    shrink(p, o + 2 * n);
    shrink(fp, o + 3 * n);
    o[kStateMaps * n] = static_cast<float>(kSteps - std::min<std::int64_t>(steps_, kSteps)) / kSteps;
  }

  // --- What a mission ends with, and the reference policies -------------------------

  /// The team map's weighted entropy left, as a fraction of the prior's (w = 1/2 at p = 0.5).
  [[nodiscard]] double weighted_entropy_fraction() const noexcept { return weighted_entropy_ / (0.5 * kCells * kCells); }
  /// The team map's entropy left, as a fraction of the prior's.
  [[nodiscard]] double entropy_fraction() const noexcept { return entropy_ / (kCells * kCells); }
  /// Mean absolute error of the team map against the targets (0.5 for the prior).
  [[nodiscard]] double map_error() const noexcept {
    double e = 0;
    for (int c = 0; c < kCells * kCells; ++c) e += std::abs(probability(team_[static_cast<std::size_t>(c)]) - truth_[static_cast<std::size_t>(c)]);
    return e / (kCells * kCells);
  }
  /// F1 score of the target class, the team map thresholded at 0.5 (the implementation's
  /// mission metric, utils/utils.py); 0 when nothing is found.
  [[nodiscard]] double f1() const noexcept {
    double tp = 0, fp = 0, fn = 0;
    for (int c = 0; c < kCells * kCells; ++c) {
      const bool said = probability(team_[static_cast<std::size_t>(c)]) > 0.5, is = truth_[static_cast<std::size_t>(c)] != 0;
      tp += said && is, fp += said && !is, fn += !said && is;
    }
    return tp > 0 ? 2 * tp / (2 * tp + fp + fn) : 0.0;
  }
  [[nodiscard]] bool available(int i, std::int64_t a) const noexcept { return available(agents_[i], a); }
  [[nodiscard]] std::array<int, 3> pose(int i) const noexcept { return {agents_[i].x, agents_[i].y, agents_[i].alt}; }
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  [[nodiscard]] bool target(int x, int y) const noexcept { return truth_[index(x, y)] != 0; }
  [[nodiscard]] double belief(int x, int y) const noexcept { return probability(team_[index(x, y)]); }
  /// Agent i's footprint of its last measurement: cells [x0, x1) x [y0, y1).
  [[nodiscard]] std::array<int, 4> footprint(int i) const noexcept {
    const auto& w = footprint_[static_cast<std::size_t>(i)];
    return {w.x0, w.x1, w.y0, w.y1};
  }
  /// Whether agent i heard agent j's last measurement (j within 25 m of it).
  [[nodiscard]] bool heard(int i, int j) const noexcept { return heard_[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)]; }

  /// A lawnmower sweep at the published baseline's altitude (5 m, params.yaml
  /// baselines.lawnmower.altitude): agent i owns the columns [ceil(11 i / 4), ceil(11 (i+1) / 4)),
  /// descends, flies to its strip's first column and sweeps it along y, stepping one column
  /// over at each end.
  [[nodiscard]] std::array<std::int64_t, kAgents> lawnmower(int altitude = 0) const noexcept {
    std::array<std::int64_t, kAgents> act{};
    for (int i = 0; i < kAgents; ++i) {
      const auto& a = agents_[i];
      const int x0 = (kGrid * i + kAgents - 1) / kAgents, x1 = (kGrid * (i + 1) + kAgents - 1) / kAgents - 1;
      const bool north = sweep_north_[i];
      if (a.alt > altitude) act[i] = down;
      else if (a.alt < altitude) act[i] = up;
      else if (a.x < x0) act[i] = plus_x;
      else if (a.x > x1) act[i] = minus_x;
      else if (north && a.y + 1 < kGrid) act[i] = plus_y;
      else if (!north && a.y > 0) act[i] = minus_y;
      else act[i] = a.x < x1 ? plus_x : (a.x > x0 ? minus_x : (north ? minus_y : plus_y));
    }
    return act;
  }
  /// Call after stepping with `lawnmower()` actions: turns the sweeps at the edges.
  void lawnmower_turns() noexcept {
    for (int i = 0; i < kAgents; ++i) {
      if (agents_[i].y + 1 >= kGrid) sweep_north_[i] = false;
      if (agents_[i].y <= 0) sweep_north_[i] = true;
    }
  }

 private:
  struct Pose {
    int x = 0, y = 0, alt = 0;
  };
  struct Window {  // cells [x0, x1) x [y0, y1)
    int x0 = 0, x1 = 0, y0 = 0, y1 = 0;
    [[nodiscard]] bool contains(int x, int y) const noexcept { return x >= x0 && x < x1 && y >= y0 && y < y1; }
  };
  using Map = std::array<float, kCells * kCells>;  // log-odds per cell

  static constexpr std::size_t index(int x, int y) noexcept { return static_cast<std::size_t>(y * kCells + x); }
  static double probability(float l) noexcept { return 1.0 / (1.0 + std::exp(-static_cast<double>(l))); }
  static double binary_entropy(double p) noexcept {
    if (p <= 0.0 || p >= 1.0) return 0.0;
    return -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
  }
  static constexpr double weight(double p) noexcept { return p > 0.501 ? 1.0 : p < 0.499 ? 0.0 : 0.5; }
  static constexpr bool available(const Pose& p, std::int64_t a) noexcept {
    switch (a) {
      case up: return p.alt + 1 < kAltitudes;
      case down: return p.alt > 0;
      case minus_x: return p.x > 0;
      case plus_x: return p.x + 1 < kGrid;
      case minus_y: return p.y > 0;
      case plus_y: return p.y + 1 < kGrid;
      default: return false;
    }
  }
  static constexpr Pose moved(Pose p, std::int64_t a) noexcept {
    if (a == up) ++p.alt;
    if (a == down) --p.alt;
    if (a == minus_x) --p.x;
    if (a == plus_x) ++p.x;
    if (a == minus_y) --p.y;
    if (a == plus_y) ++p.y;
    return p;
  }
  static Window window(const Pose& p) noexcept {
    const double side = 2.0 * kAltitudeM[static_cast<std::size_t>(p.alt)] * std::tan(M_PI / 6.0);
    const int w = static_cast<int>(std::lround(side / kCellM));
    const double cx = p.x * kSpacingM / kCellM, cy = p.y * kSpacingM / kCellM;
    const int x0 = static_cast<int>(std::lround(cx - w / 2.0)), y0 = static_cast<int>(std::lround(cy - w / 2.0));
    return Window{std::max(0, x0), std::min(kCells, x0 + w), std::max(0, y0), std::min(kCells, y0 + w)};
  }
  // Every agent measures its footprint; each reading goes into the team map, the agent's
  // own map and the maps of the agents within range.
  void measure_all() {
    constexpr float kClamp = 9.21024f;  // logit(0.9999)
    for (int i = 0; i < kAgents; ++i) {
      footprint_[i] = window(agents_[i]);
      for (int j = 0; j < kAgents; ++j) {
        const double dx = (agents_[i].x - agents_[j].x) * kSpacingM, dy = (agents_[i].y - agents_[j].y) * kSpacingM;
        const double dz = kAltitudeM[static_cast<std::size_t>(agents_[i].alt)] - kAltitudeM[static_cast<std::size_t>(agents_[j].alt)];
        heard_[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)] = j != i && std::sqrt(dx * dx + dy * dy + dz * dz) <= kRangeM;
      }
    }
    for (int i = 0; i < kAgents; ++i) {
      const double e = kError[static_cast<std::size_t>(agents_[i].alt)];
      const auto evidence = static_cast<float>(std::log((1 - e) / e));
      const Window& w = footprint_[i];
      for (int y = w.y0; y < w.y1; ++y)
        for (int x = w.x0; x < w.x1; ++x) {
          const auto c = index(x, y);
          const bool t = truth_[c] != 0;
          const bool reads = rng_.uniform() < e ? !t : t;
          const float d = reads ? evidence : -evidence;
          team_[c] = std::clamp(team_[c] + d, -kClamp, kClamp);
          for (int j = 0; j < kAgents; ++j)
            if (j == i || heard_[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)])
              local_[static_cast<std::size_t>(j)][c] = std::clamp(local_[static_cast<std::size_t>(j)][c] + d, -kClamp, kClamp);
        }
    }
  }
  // The team map's entropy and weighted entropy (the reward and the mission's metrics), in
  // one pass; with `prior` (the team map before this step's measurements), also returns the
  // prior's entropy weighted by the updated map (cells no reading touched: the same entropy).
  double refresh(const Map* prior = nullptr) noexcept {
    double h = 0, wh = 0, before = 0;
    for (int c = 0; c < kCells * kCells; ++c) {
      const auto i = static_cast<std::size_t>(c);
      const double p = probability(team_[i]), w = weight(p);
      const double hc = binary_entropy(p);
      h += hc;
      wh += w * hc;
      if (prior) before += w * ((*prior)[i] == team_[i] ? hc : binary_entropy(probability((*prior)[i])));
    }
    entropy_ = h;
    weighted_entropy_ = wh;
    return before;
  }
  // Area averages of a field map over an 11 x 11 grid of bins (each 9 or 10 cells a side).
  static void shrink(const std::array<float, kCells * kCells>& m, float* out) noexcept {
    for (int by = 0; by < kSide; ++by)
      for (int bx = 0; bx < kSide; ++bx) {
        const int x0 = bx * kCells / kSide, x1 = (bx + 1) * kCells / kSide, y0 = by * kCells / kSide, y1 = (by + 1) * kCells / kSide;
        double s = 0;
        for (int y = y0; y < y1; ++y)
          for (int x = x0; x < x1; ++x) s += m[index(x, y)];
        out[by * kSide + bx] = static_cast<float>(s / ((x1 - x0) * (y1 - y0)));
      }
  }

  Rng rng_{0};
  std::array<std::uint8_t, kCells * kCells> truth_{};
  Map team_{};
  std::array<Map, kAgents> local_{};
  std::array<Pose, kAgents> agents_{};
  std::array<Window, kAgents> footprint_{};
  std::array<std::array<bool, kAgents>, kAgents> heard_{};  // heard_[j][i]: j received i's measurement
  std::array<bool, kAgents> sweep_north_{true, true, true, true};
  double entropy_ = kCells * kCells, weighted_entropy_ = 0.5 * kCells * kCells;
  std::int64_t steps_ = 0;
  bool started_ = false;
};

static_assert(MultiAgentEnv<PublishedMapping>);

}  // namespace anvil::envs
