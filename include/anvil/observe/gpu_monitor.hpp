#pragma once
/// @file
/// `GpuMonitor`: utilisation, memory and power of each visible NVIDIA GPU, read through
/// NVML, which is loaded at run time (dlopen of libnvidia-ml.so.1, installed with the
/// driver): anvil neither links nor needs it. Without NVML or without a GPU the monitor is
/// off and says why once. Light header.

#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <vector>

namespace anvil {

/// One GPU at one moment.
struct GpuSample {
  int index = 0;
  double utilization = 0;  ///< percent of the last sample period a kernel ran
  double memory_used_gb = 0, memory_total_gb = 0;
  double power_w = 0;  ///< 0 when the GPU does not report it
};

class GpuMonitor {
 public:
  /// Loads NVML and counts the GPUs; `available()` says whether it worked, `status()` why not.
  GpuMonitor() {
    lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      status_ = "GPU monitor off: NVML (libnvidia-ml.so.1) is not installed, so there is no NVIDIA driver here";
      return;
    }
    auto sym = [&](const char* name) { return ::dlsym(lib_, name); };
    init_ = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    shutdown_ = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
    count_ = reinterpret_cast<int (*)(unsigned*)>(sym("nvmlDeviceGetCount_v2"));
    handle_ = reinterpret_cast<int (*)(unsigned, void**)>(sym("nvmlDeviceGetHandleByIndex_v2"));
    util_ = reinterpret_cast<int (*)(void*, Utilization*)>(sym("nvmlDeviceGetUtilizationRates"));
    memory_ = reinterpret_cast<int (*)(void*, Memory*)>(sym("nvmlDeviceGetMemoryInfo"));
    power_ = reinterpret_cast<int (*)(void*, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
    if (!init_ || !shutdown_ || !count_ || !handle_ || !util_ || !memory_) {
      status_ = "GPU monitor off: this NVML lacks the functions anvil reads";
      return;
    }
    if (const int rc = init_(); rc != 0) {
      status_ = "GPU monitor off: NVML failed to start (error " + std::to_string(rc) + "; is the driver loaded?)";
      return;
    }
    started_ = true;
    unsigned n = 0;
    if (count_(&n) != 0 || n == 0) {
      status_ = "GPU monitor off: NVML sees no GPU";
      return;
    }
    for (unsigned i = 0; i < n; ++i) {
      void* h = nullptr;
      if (handle_(i, &h) == 0) devices_.push_back({static_cast<int>(i), h});
    }
    status_ = "GPU monitor: " + std::to_string(devices_.size()) + " GPU(s) through NVML";
  }
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;
  ~GpuMonitor() {
    if (started_) shutdown_();
    if (lib_) ::dlclose(lib_);
  }

  [[nodiscard]] bool available() const noexcept { return !devices_.empty(); }
  /// One line: how many GPUs it watches, or why it is off.
  [[nodiscard]] const std::string& status() const noexcept { return status_; }

  /// Every GPU now (empty when off).
  [[nodiscard]] std::vector<GpuSample> sample() const {
    std::vector<GpuSample> out;
    for (const auto& d : devices_) {
      GpuSample s;
      s.index = d.index;
      Utilization u{};
      if (util_(d.handle, &u) == 0) s.utilization = u.gpu;
      Memory m{};
      if (memory_(d.handle, &m) == 0) {
        s.memory_used_gb = static_cast<double>(m.used) / 1e9;
        s.memory_total_gb = static_cast<double>(m.total) / 1e9;
      }
      unsigned mw = 0;
      if (power_ && power_(d.handle, &mw) == 0) s.power_w = mw / 1000.0;
      out.push_back(s);
    }
    return out;
  }

  /// "gpu0 97% 12.3/80.0 GB 301 W" for each GPU, for a progress line.
  [[nodiscard]] static std::string describe(const std::vector<GpuSample>& samples) {
    std::string s;
    for (const auto& g : samples) {
      char b[96];
      std::snprintf(b, sizeof b, "%sgpu%d %.0f%% %.1f/%.1f GB %.0f W", s.empty() ? "" : "  ", g.index, g.utilization,
                    g.memory_used_gb, g.memory_total_gb, g.power_w);
      s += b;
    }
    return s;
  }

 private:
  // NVML's structs, as its header declares them.
  struct Utilization {
    unsigned gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  struct Device {
    int index;
    void* handle;
  };

  void* lib_ = nullptr;
  bool started_ = false;
  int (*init_)() = nullptr;
  int (*shutdown_)() = nullptr;
  int (*count_)(unsigned*) = nullptr;
  int (*handle_)(unsigned, void**) = nullptr;
  int (*util_)(void*, Utilization*) = nullptr;
  int (*memory_)(void*, Memory*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  std::vector<Device> devices_;
  std::string status_;
};

}  // namespace anvil
