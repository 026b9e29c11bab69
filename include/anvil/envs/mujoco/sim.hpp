#pragma once
/// @file
/// MuJoCo (2.2, Debian's libmujoco-dev) behind two small owners: `Model` compiles MJCF
/// text from memory (no files) and `Sim` holds one simulation, a model and its data, which
/// copies deeply (a VecEnv copies its prototype env once per env) and saves and restores
/// the state a resumed run needs to step on bitwise alike. Optional component: only the
/// MuJoCo suite includes it.

#include <mujoco/mujoco.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>

namespace anvil::envs::mujoco {

/// A compiled model, shared and never changed (a `Sim` copies it before changing it).
class Model {
 public:
  /// Compiles MJCF `xml`; an Error with MuJoCo's message when it does not compile.
  static std::shared_ptr<const Model> compile(std::string_view xml, const std::string& what) {
    // MuJoCo's default warning handler also appends to MUJOCO_LOG.TXT in the working
    // directory; unless the program installed its own, warnings go to stderr alone.
    if (!mju_user_warning) mju_user_warning = [](const char* msg) { std::fprintf(stderr, "MuJoCo warning: %s\n", msg); };
    auto vfs = std::make_unique<mjVFS>();  // ~2 MB: not on the stack
    mj_defaultVFS(vfs.get());
    const char* file = "model.xml";
    if (mj_makeEmptyFileVFS(vfs.get(), file, static_cast<int>(xml.size())) != 0)
      throw Error("MuJoCo: cannot hold the model of " + what + " in memory");
    const int i = mj_findFileVFS(vfs.get(), file);
    std::memcpy(vfs->filedata[i], xml.data(), xml.size());
    char err[1024] = {};
    mjModel* m = mj_loadXML(file, vfs.get(), err, sizeof err);
    mj_deleteVFS(vfs.get());
    if (!m) throw Error("MuJoCo: the model of " + what + " does not compile: " + err);
    return std::shared_ptr<const Model>(new Model(m));
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model() { mj_deleteModel(m_); }
  [[nodiscard]] const mjModel* get() const noexcept { return m_; }

  /// The id of the named object of `type` (mjOBJ_BODY, ...), or an Error naming it.
  [[nodiscard]] int id(mjtObj type, const char* name) const {
    const int i = mj_name2id(m_, type, name);
    if (i < 0) throw Error(std::string("MuJoCo model: no object named '") + name + "'");
    return i;
  }

 private:
  explicit Model(mjModel* m) : m_(m) {}
  mjModel* m_;
};

/// One simulation: its own copy of a model (so a task can move its fixtures) and data.
class Sim {
 public:
  Sim() = default;
  explicit Sim(const Model& model) : m_(mj_copyModel(nullptr, model.get())), d_(mj_makeData(m_)) {
    if (!m_ || !d_) throw Error("MuJoCo: out of memory making a simulation");
  }
  Sim(const Sim& o) : m_(o.m_ ? mj_copyModel(nullptr, o.m_) : nullptr), d_(m_ ? mj_makeData(m_) : nullptr) {
    if (o.m_ && (!m_ || !d_)) throw Error("MuJoCo: out of memory copying a simulation");
    if (d_) mj_copyData(d_, m_, o.d_);
  }
  Sim(Sim&& o) noexcept : m_(o.m_), d_(o.d_) { o.m_ = nullptr, o.d_ = nullptr; }
  Sim& operator=(Sim o) noexcept {
    std::swap(m_, o.m_);
    std::swap(d_, o.d_);
    return *this;
  }
  ~Sim() {
    if (d_) mj_deleteData(d_);
    if (m_) mj_deleteModel(m_);
  }

  [[nodiscard]] mjModel* m() const noexcept { return m_; }
  [[nodiscard]] mjData* d() const noexcept { return d_; }

  /// The numbers that make up the simulation's state, in one fixed order: time, joint
  /// positions and velocities, controls, applied forces, mocap poses, the solver's warm
  /// start (without it the next step differs in the last bits) and the bodies' model
  /// positions (a task moves its fixtures). Enough to step on bitwise alike.
  void save(BinaryWriter& w) const {
    w.value(m_->nq);
    w.value(m_->nv);
    w.value(m_->nbody);
    w.value(d_->time);
    put(w, d_->qpos, m_->nq);
    put(w, d_->qvel, m_->nv);
    put(w, d_->act, m_->na);
    put(w, d_->ctrl, m_->nu);
    put(w, d_->qfrc_applied, m_->nv);
    put(w, d_->xfrc_applied, 6 * m_->nbody);
    put(w, d_->mocap_pos, 3 * m_->nmocap);
    put(w, d_->mocap_quat, 4 * m_->nmocap);
    put(w, d_->qacc_warmstart, m_->nv);
    put(w, m_->body_pos, 3 * m_->nbody);
  }
  /// Reads what `save` wrote into this simulation (the caller checked the env kind; a
  /// model of another size is refused by name).
  void read(BinaryReader& r) {
    if (r.value<int>("MuJoCo qpos size") != m_->nq || r.value<int>("MuJoCo qvel size") != m_->nv ||
        r.value<int>("MuJoCo body count") != m_->nbody)
      r.fail("MuJoCo state", "belongs to another model");
    d_->time = r.value<mjtNum>("MuJoCo time");
    get(r, d_->qpos, m_->nq, "MuJoCo qpos");
    get(r, d_->qvel, m_->nv, "MuJoCo qvel");
    get(r, d_->act, m_->na, "MuJoCo act");
    get(r, d_->ctrl, m_->nu, "MuJoCo ctrl");
    get(r, d_->qfrc_applied, m_->nv, "MuJoCo qfrc_applied");
    get(r, d_->xfrc_applied, 6 * m_->nbody, "MuJoCo xfrc_applied");
    get(r, d_->mocap_pos, 3 * m_->nmocap, "MuJoCo mocap positions");
    get(r, d_->mocap_quat, 4 * m_->nmocap, "MuJoCo mocap orientations");
    get(r, d_->qacc_warmstart, m_->nv, "MuJoCo warm start");
    get(r, m_->body_pos, 3 * m_->nbody, "MuJoCo body positions");
    // Positions of bodies and sites from the state (kinematics only: a full mj_forward
    // would overwrite the solver's warm start). mj_kinematics normalises free joints'
    // quaternions in qpos in place, which moves their last bits; the next step normalises
    // them again, so qpos goes back to the saved bits to step on exactly as the original.
    std::vector<mjtNum> qpos(d_->qpos, d_->qpos + m_->nq);
    mj_kinematics(m_, d_);
    mj_comPos(m_, d_);
    std::copy(qpos.begin(), qpos.end(), d_->qpos);
  }

 private:
  static void put(BinaryWriter& w, const mjtNum* p, int n) {
    w.bytes(p, static_cast<std::size_t>(n) * sizeof(mjtNum));
  }
  static void get(BinaryReader& r, mjtNum* p, int n, const char* what) {
    r.bytes(p, static_cast<std::size_t>(n) * sizeof(mjtNum), what);
  }
  mjModel* m_ = nullptr;
  mjData* d_ = nullptr;
};

}  // namespace anvil::envs::mujoco
