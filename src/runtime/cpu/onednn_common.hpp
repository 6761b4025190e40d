// src/runtime/cpu/onednn_common.hpp — internal, included only by src/runtime/cpu/onednn_*.cpp built
// with TESSEL_WITH_ONEDNN: what the oneDNN kernels share — the CPU engine, the OpenMP
// thread-count scope every call runs under, the lock that serialises primitive creation, and a
// bounded, thread-safe primitive cache keyed by layout. Why each exists: onednn_einsum.cpp's
// file header and docs/cpu-backend.md.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include <oneapi/dnnl/dnnl.hpp>

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
// libgomp's API (linked by CMake); declared here so that no omp.h (and no -fopenmp) is needed.
extern "C" int omp_get_max_threads(void);
extern "C" void omp_set_num_threads(int);
#endif

namespace tessel::onednn {

// Sets the calling thread's OpenMP thread count for the scope (oneDNN's parallel regions
// take it), restoring the previous one after.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    old_ = omp_get_max_threads();
    if (old_ != n) omp_set_num_threads(n);
    n_ = n;
#else
    (void)n;
#endif
  }
  ~ScopedThreads() {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    if (old_ != n_) omp_set_num_threads(old_);
#endif
  }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int old_ = 1, n_ = 1;
};

inline const dnnl::engine& cpu_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// One primitive creation at a time, process-wide: Debian's libdnnl initialises shared state
// lazily on the first primitive descriptors, and ThreadSanitizer saw two device threads race
// there. Creation happens once per layout, so the lock costs nothing in the step loop.
inline std::mutex& creation_mutex() {
  static std::mutex mu;
  return mu;
}

// Primitives by key (the layout and dtype as a string), shared by all device threads.
// Bounded: a program has few distinct shapes; a stream of new ones (random tests) must not
// grow without limit. Dropping all is simple, and entries in use stay alive (shared_ptr).
template <class Entry>
class PrimitiveCache {
 public:
  std::shared_ptr<const Entry> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  std::shared_ptr<const Entry> insert(const std::string& key, std::shared_ptr<const Entry> e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= kCapacity) map_.clear();
    return map_.emplace(key, std::move(e)).first->second;  // first writer wins
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
  }

 private:
  static constexpr std::size_t kCapacity = 4096;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Entry>> map_;
};

}  // namespace tessel::onednn
