// Host tests of the CUDA attention kernels (src/runtime/cuda/kernels/attention_plan.hpp, src/runtime/cuda/kernels/attention_kernels.cuh)
// without a GPU:
//  * the geometry: the key tiles a query block visits (and the query blocks a key block visits)
//    cover every visible (query, key) pair, the skipped tiles hold none, a tile computed without the
//    per-element mask holds only visible in-range pairs; causal work is about half of the full;
//    launch plans (path choice, grids, shared memory) and their errors;
//  * the kernels themselves, run on an emulated GPU: the very device code of attention_kernels.cuh
//    compiled for the host against emulated primitives — each CUDA thread a fiber (ucontext),
//    __syncthreads a block barrier, and the warp-collective instructions (shuffles, ldmatrix,
//    mma.sync m16n8k16) evaluated for the 32 lanes together from the PTX ISA's fragment layouts;
//    cp.async copies land only at cp.async.wait_group (their destination holds NaN until then, so
//    a read before the wait or a write while another warp still reads is caught), out-of-range
//    global reads of cp.async and ldmatrix/cp.async addresses outside shared memory are errors, a
//    barrier or warp collective that not every thread reaches is a deadlock error, and fibers run
//    in ascending and in descending thread order (a missing barrier shows in one of them). Forward
//    and backward, both paths (tensor cores: bf16/f16, head_dim 64 and 128; generic: f32 and other
//    head dims), both layouts, causal and not, Sk > Sq, lengths off the tile sizes, compared with
//    the CPU kernels (the oracle) as the GPU test tests/gpu/test_cuda_attention.cpp does on a GPU.
// What this cannot show: timing, the real hardware's rounding inside the tensor cores (summation
// order), and anything about the PTX itself (the emulated primitives stand in for it).
#include <catch2/catch.hpp>

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "../../src/runtime/cuda/kernels/attention_plan.hpp"
#include "../../src/runtime/cuda/kernels/dtype_convert.hpp"
#include "../../src/runtime/attention_params.hpp"
#include "kernel_check.hpp"
#include "tessel/runtime/compare.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define TESSEL_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSEL_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define TESSEL_EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TESSEL_EMU_TSAN 1
#endif
#endif
#ifdef TESSEL_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef TESSEL_EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

using namespace tessel;
namespace ck = tessel::cuda_kernels;
namespace at = tessel::cuda_kernels::attn;

// ================================ the emulated GPU ===============================================
namespace emu {

enum class St : uint8_t { Ready, WaitWarp, WaitBlock, Done, Failed };
enum class Op : uint8_t { None, Shfl, Ldsm, LdsmT, MmaBf16, MmaF16 };

// One lane's operands of a warp collective and, once the warp has run it, its results.
struct Lane {
  Op op = Op::None;
  float f = 0;
  int mask = 0;
  const unsigned char* addr = nullptr;
  uint32_t a[4] = {}, b[2] = {}, r[4] = {};
  float c[4] = {};
};

struct Copy {
  unsigned char* dst;
  const unsigned char* src;
  bool valid;
};

constexpr std::size_t kStack = std::size_t{256} << 10;
constexpr std::size_t kGuard = 64;  // poisoned bytes after the shared memory, checked after each block

struct Fiber {
  ucontext_t ctx{};
  std::vector<unsigned char> stack;
  St st = St::Done;
  std::vector<Copy> open;                 // issued, not committed
  std::deque<std::vector<Copy>> groups;   // committed, not waited for
#ifdef TESSEL_EMU_TSAN
  void* tsan = nullptr;
#endif
};

class Device;
Device* g_dev = nullptr;  // the device running a block now

// The order fibers run in between their synchronisation points: ascending or descending thread
// index, or warps held back at random (each pass runs each warp with probability 1/2), so one warp
// runs ahead of another by many steps, as on hardware (a write into a buffer another warp still
// reads then shows).
enum class Schedule { Ascending, Descending, Random };

class Device {
 public:
  explicit Device(Schedule sched, uint64_t seed = 1) : order_(sched), rng_(seed) {}
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() {
#ifdef TESSEL_EMU_TSAN
    for (Fiber& f : fibers_)
      if (f.tsan) __tsan_destroy_fiber(f.tsan);
#endif
  }

  // Global memory cp.async may read.
  void add_global(const void* p, std::size_t bytes) {
    const auto* b = static_cast<const unsigned char*>(p);
    globals_.push_back({b, b + bytes});
  }

  // Runs body as block `block` of `threads` emulated threads with `smem` bytes of shared memory.
  void run_block(int64_t block, int threads, int64_t smem, const std::function<void()>& body);

  int64_t warp_ops = 0, barriers = 0;

  // ---- called from inside a fiber ----
  int thread() const { return cur_; }
  int64_t block() const { return block_; }
  unsigned char* smem() { return smem_base_; }
  Fiber& self() { return fibers_[static_cast<std::size_t>(cur_)]; }
  Lane& lane() { return lanes_[static_cast<std::size_t>(cur_)]; }
  void wait(St s);
  [[noreturn]] void fail(const std::string& why);
  void check_smem(const void* p, std::size_t bytes, const char* what);
  void check_global(const void* p, std::size_t bytes, const char* what);

 private:
  friend void fiber_entry();
  void resume(int t);
  [[noreturn]] void leave();  // the fiber's last switch back
  void resolve_warp(int w0);
  std::string states() const;

  Schedule order_;
  std::mt19937_64 rng_;
  std::vector<std::pair<const unsigned char*, const unsigned char*>> globals_;
  std::vector<Fiber> fibers_;
  std::vector<Lane> lanes_;
  std::vector<unsigned char> smem_raw_;
  unsigned char* smem_base_ = nullptr;
  int64_t smem_size_ = 0;
  int threads_ = 0;
  int cur_ = -1;
  int64_t block_ = 0;
  const std::function<void()>* body_ = nullptr;
  std::string error_;
  ucontext_t sched_{};
#ifdef TESSEL_EMU_ASAN
  const void* sched_bottom_ = nullptr;  // the scheduler's stack, for ASan's fiber switches
  std::size_t sched_size_ = 0;
#endif
#ifdef TESSEL_EMU_TSAN
  void* sched_tsan_ = nullptr;
#endif
};

void fiber_entry() {
  Device& d = *g_dev;
#ifdef TESSEL_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &d.sched_bottom_, &d.sched_size_);
#endif
  (*d.body_)();
  Fiber& f = d.self();
  if (!f.open.empty() || !f.groups.empty()) d.fail("the thread exited with cp.async copies not waited for");
  f.st = St::Done;
  d.leave();
}

void Device::leave() {
  Fiber& f = self();
#ifdef TESSEL_EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, sched_bottom_, sched_size_);
#endif
#ifdef TESSEL_EMU_TSAN
  __tsan_switch_to_fiber(sched_tsan_, 0);
#endif
  swapcontext(&f.ctx, &sched_);
  std::abort();  // never resumed
}

void Device::wait(St s) {
  Fiber& f = self();
  f.st = s;
#ifdef TESSEL_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, sched_bottom_, sched_size_);
#endif
#ifdef TESSEL_EMU_TSAN
  __tsan_switch_to_fiber(sched_tsan_, 0);
#endif
  swapcontext(&f.ctx, &sched_);
#ifdef TESSEL_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, &sched_bottom_, &sched_size_);
#endif
}

void Device::fail(const std::string& why) {
  error_ = "block " + std::to_string(block_) + " thread " + std::to_string(cur_) + ": " + why;
  self().st = St::Failed;
  leave();
}

void Device::check_smem(const void* p, std::size_t bytes, const char* what) {
  const auto* b = static_cast<const unsigned char*>(p);
  if (b < smem_base_ || b + bytes > smem_base_ + smem_size_)
    fail(std::string(what) + ": address outside the block's shared memory");
  if ((reinterpret_cast<uintptr_t>(b) & 15u) != 0) fail(std::string(what) + ": shared address not 16-byte aligned");
}

void Device::check_global(const void* p, std::size_t bytes, const char* what) {
  const auto* b = static_cast<const unsigned char*>(p);
  if ((reinterpret_cast<uintptr_t>(b) & 15u) != 0) fail(std::string(what) + ": global address not 16-byte aligned");
  for (const auto& [lo, hi] : globals_)
    if (b >= lo && b + bytes <= hi) return;
  fail(std::string(what) + ": global read outside every operand");
}

void Device::resume(int t) {
  cur_ = t;
  Fiber& f = fibers_[static_cast<std::size_t>(t)];
#ifdef TESSEL_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack.data(), f.stack.size());
#endif
#ifdef TESSEL_EMU_TSAN
  __tsan_switch_to_fiber(f.tsan, 0);
#endif
  swapcontext(&sched_, &f.ctx);
#ifdef TESSEL_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

std::string Device::states() const {
  std::string s;
  for (int t = 0; t < threads_; ++t) {
    const St st = fibers_[static_cast<std::size_t>(t)].st;
    s += st == St::Ready ? 'R' : st == St::WaitWarp ? 'W' : st == St::WaitBlock ? 'B' : st == St::Done ? '.' : 'F';
  }
  return s;
}

uint16_t u16_at(const unsigned char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

float half_bits(uint16_t v, Op op) {
  return op == Op::MmaBf16 ? ck::bf16_bits_to_f32(v) : ck::f16_bits_to_f32(v);
}

void Device::resolve_warp(int w0) {
  Lane* L = &lanes_[static_cast<std::size_t>(w0)];
  const Op op = L[0].op;
  for (int l = 1; l < 32; ++l)
    if (L[l].op != op) {
      error_ = "block " + std::to_string(block_) + " warp " + std::to_string(w0 / 32) +
               ": lanes run different warp collectives (divergence)";
      throw std::runtime_error(error_);
    }
  ++warp_ops;
  auto bad = [&](const std::string& why) {
    error_ = "block " + std::to_string(block_) + " warp " + std::to_string(w0 / 32) + ": " + why;
    throw std::runtime_error(error_);
  };
  if (op == Op::Shfl) {
    float out[32];
    for (int l = 0; l < 32; ++l) {
      const int src = l ^ L[l].mask;
      if (src < 0 || src > 31) bad("shuffle source lane out of range");
      out[l] = L[src].f;
    }
    for (int l = 0; l < 32; ++l) L[l].f = out[l];
  } else if (op == Op::Ldsm || op == Op::LdsmT) {
    for (int l = 0; l < 32; ++l) {
      const unsigned char* p = L[l].addr;
      if (p < smem_base_ || p + 16 > smem_base_ + smem_size_) bad("ldmatrix row address outside shared memory");
      if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) bad("ldmatrix row address not 16-byte aligned");
    }
    uint32_t out[32][4];
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 4; ++m) {
        const int g = l >> 2, t = l & 3;
        uint16_t lo, hi;
        if (op == Op::Ldsm) {  // row g, columns 2t and 2t + 1 of matrix m
          lo = u16_at(L[8 * m + g].addr + 4 * t);
          hi = u16_at(L[8 * m + g].addr + 4 * t + 2);
        } else {  // column g, rows 2t and 2t + 1 of matrix m
          lo = u16_at(L[8 * m + 2 * t].addr + 2 * g);
          hi = u16_at(L[8 * m + 2 * t + 1].addr + 2 * g);
        }
        out[l][m] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
      }
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 4; ++m) L[l].r[m] = out[l][m];
  } else if (op == Op::MmaBf16 || op == Op::MmaF16) {
    // The fragments of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4,
    // t = lane % 4: A a0,a1 (g, 2t..2t+1), a2,a3 (g+8, 2t..), a4,a5 (g, 2t+8..), a6,a7 (g+8, 2t+8..);
    // B b0,b1 (k 2t..2t+1, n g), b2,b3 (k 2t+8.., n g); C c0,c1 (g, 2t..), c2,c3 (g+8, 2t..).
    float A[16][16], B[16][8], C[16][8];
    auto lo = [&](uint32_t v) { return half_bits(static_cast<uint16_t>(v & 0xffffu), op); };
    auto hi = [&](uint32_t v) { return half_bits(static_cast<uint16_t>(v >> 16), op); };
    for (int l = 0; l < 32; ++l) {
      const int g = l >> 2, t = l & 3;
      for (int q = 0; q < 4; ++q) {
        const int row = g + (q & 1) * 8, col = 2 * t + (q >> 1) * 8;
        A[row][col] = lo(L[l].a[q]);
        A[row][col + 1] = hi(L[l].a[q]);
      }
      for (int q = 0; q < 2; ++q) {
        B[2 * t + 8 * q][g] = lo(L[l].b[q]);
        B[2 * t + 8 * q + 1][g] = hi(L[l].b[q]);
      }
      C[g][2 * t] = L[l].c[0];
      C[g][2 * t + 1] = L[l].c[1];
      C[g + 8][2 * t] = L[l].c[2];
      C[g + 8][2 * t + 1] = L[l].c[3];
    }
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        float acc = C[i][j];
        for (int k = 0; k < 16; ++k) acc += A[i][k] * B[k][j];
        C[i][j] = acc;
      }
    for (int l = 0; l < 32; ++l) {
      const int g = l >> 2, t = l & 3;
      L[l].c[0] = C[g][2 * t];
      L[l].c[1] = C[g][2 * t + 1];
      L[l].c[2] = C[g + 8][2 * t];
      L[l].c[3] = C[g + 8][2 * t + 1];
    }
  } else {
    bad("unknown warp collective");
  }
  for (int l = 0; l < 32; ++l) {
    L[l].op = Op::None;
    fibers_[static_cast<std::size_t>(w0 + l)].st = St::Ready;
  }
}

void Device::run_block(int64_t block, int threads, int64_t smem, const std::function<void()>& body) {
  g_dev = this;
  block_ = block;
  body_ = &body;
  threads_ = threads;
  error_.clear();
  // Shared memory: 16-byte aligned, NaN bytes (0xff) at first, a guard after it.
  smem_raw_.assign(static_cast<std::size_t>(smem) + kGuard + 16, 0xff);
  smem_base_ = smem_raw_.data() + ((16 - (reinterpret_cast<uintptr_t>(smem_raw_.data()) & 15u)) & 15u);
  smem_size_ = smem;
  if (fibers_.size() < static_cast<std::size_t>(threads)) fibers_.resize(static_cast<std::size_t>(threads));
  lanes_.assign(static_cast<std::size_t>(threads), Lane{});
#ifdef TESSEL_EMU_TSAN
  sched_tsan_ = __tsan_get_current_fiber();
#endif
  for (int t = 0; t < threads; ++t) {
    Fiber& f = fibers_[static_cast<std::size_t>(t)];
    if (f.stack.empty()) f.stack.resize(kStack);
#ifdef TESSEL_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(f.stack.data(), f.stack.size());  // frames left by an abandoned fiber
#endif
#ifdef TESSEL_EMU_TSAN
    if (!f.tsan) f.tsan = __tsan_create_fiber(0);
#endif
    f.st = St::Ready;
    f.open.clear();
    f.groups.clear();
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry, 0);
  }
  const int warps = (threads + 31) / 32;
  std::vector<char> run_warp(static_cast<std::size_t>(warps), 1);
  auto ready = [&](int t) { return fibers_[static_cast<std::size_t>(t)].st == St::Ready; };
  for (;;) {
    if (order_ == Schedule::Random) {  // each warp with a ready thread runs with probability 1/2, one at least
      std::vector<int> cand;
      for (int w = 0; w < warps; ++w) {
        bool r = false;
        for (int t = 32 * w; t < std::min(threads, 32 * w + 32); ++t) r = r || ready(t);
        run_warp[static_cast<std::size_t>(w)] = 0;
        if (r) cand.push_back(w);
      }
      bool any = false;
      for (int w : cand) any = any || (run_warp[static_cast<std::size_t>(w)] = static_cast<char>(rng_() & 1));
      if (!any && !cand.empty()) run_warp[static_cast<std::size_t>(cand[rng_() % cand.size()])] = 1;
    }
    for (int i = 0; i < threads; ++i) {
      const int t = order_ == Schedule::Descending ? threads - 1 - i : i;
      if (!ready(t) || !run_warp[static_cast<std::size_t>(t / 32)]) continue;
      resume(t);
      if (fibers_[static_cast<std::size_t>(t)].st == St::Failed) throw std::runtime_error(error_);
    }
    for (int w0 = 0; w0 < threads; w0 += 32) {
      int waiting = 0;
      const int n = std::min(32, threads - w0);
      for (int l = 0; l < n; ++l) waiting += fibers_[static_cast<std::size_t>(w0 + l)].st == St::WaitWarp;
      if (waiting == 32) resolve_warp(w0);
    }
    int live = 0, at_barrier = 0, runnable = 0;
    for (int t = 0; t < threads; ++t) {
      const St st = fibers_[static_cast<std::size_t>(t)].st;
      live += st != St::Done;
      at_barrier += st == St::WaitBlock;
      runnable += st == St::Ready;
    }
    if (runnable) continue;
    if (live == 0) break;
    if (at_barrier != live)
      throw std::runtime_error("block " + std::to_string(block) + ": deadlock (W warp collective, B barrier, "
                               ". exited): " + states());
    for (int t = 0; t < threads; ++t)
      if (fibers_[static_cast<std::size_t>(t)].st == St::WaitBlock) fibers_[static_cast<std::size_t>(t)].st = St::Ready;
    ++barriers;
  }
  for (std::size_t i = 0; i < kGuard; ++i)
    if (smem_base_[smem + static_cast<int64_t>(i)] != 0xff)
      throw std::runtime_error("block " + std::to_string(block) + ": a write past the end of shared memory");
  g_dev = nullptr;
}

}  // namespace emu

// ---- the primitives of attention_kernels.cuh on the emulated GPU --------------------------------
namespace tessel::cuda_kernels {

struct EmuBf16 {
  uint16_t bits;
};
struct EmuF16 {
  uint16_t bits;
};

template <class T> inline float to_f(T v);
template <> inline float to_f<float>(float v) { return v; }
template <> inline float to_f<EmuBf16>(EmuBf16 v) { return bf16_bits_to_f32(v.bits); }
template <> inline float to_f<EmuF16>(EmuF16 v) { return f16_bits_to_f32(v.bits); }
template <class T> inline T from_f(float v);
template <> inline float from_f<float>(float v) { return v; }
template <> inline EmuBf16 from_f<EmuBf16>(float v) { return {f32_to_bf16_bits(v)}; }
template <> inline EmuF16 from_f<EmuF16>(float v) { return {f32_to_f16_bits(v)}; }

namespace attn {

using ta_bf16 = EmuBf16;
using ta_f16 = EmuF16;

inline int ta_thread() { return emu::g_dev->thread(); }
inline int64_t ta_block() { return emu::g_dev->block(); }
inline char* ta_smem() { return reinterpret_cast<char*>(emu::g_dev->smem()); }
inline void ta_sync() { emu::g_dev->wait(emu::St::WaitBlock); }
inline float ta_shfl_xor(float v, int m) {
  emu::Lane& L = emu::g_dev->lane();
  L.op = emu::Op::Shfl;
  L.f = v;
  L.mask = m;
  emu::g_dev->wait(emu::St::WaitWarp);
  return L.f;
}
inline float ta_exp2(float x) { return std::exp2(x); }
inline float ta_exp(float x) { return std::exp(x); }
inline float ta_log(float x) { return std::log(x); }

inline void ldsm(uint32_t (&r)[4], const void* p, emu::Op op) {
  emu::Lane& L = emu::g_dev->lane();
  L.op = op;
  L.addr = static_cast<const unsigned char*>(p);
  emu::g_dev->wait(emu::St::WaitWarp);
  for (int i = 0; i < 4; ++i) r[i] = L.r[i];
}
inline void ta_ldsm_x4(uint32_t (&r)[4], const void* p) { ldsm(r, p, emu::Op::Ldsm); }
inline void ta_ldsm_x4_t(uint32_t (&r)[4], const void* p) { ldsm(r, p, emu::Op::LdsmT); }

template <class T>
inline void ta_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::Lane& L = emu::g_dev->lane();
  L.op = std::is_same_v<T, EmuBf16> ? emu::Op::MmaBf16 : emu::Op::MmaF16;
  for (int i = 0; i < 4; ++i) L.a[i] = a[i], L.c[i] = c[i];
  L.b[0] = b0;
  L.b[1] = b1;
  emu::g_dev->wait(emu::St::WaitWarp);
  for (int i = 0; i < 4; ++i) c[i] = L.c[i];
}

inline void ta_cp_async16(void* dst, const void* src, bool valid) {
  emu::Device& d = *emu::g_dev;
  d.check_smem(dst, 16, "cp.async");
  if (valid) d.check_global(src, 16, "cp.async");
  std::memset(dst, 0xff, 16);  // undefined (NaN) until the wait
  d.self().open.push_back({static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), valid});
}
inline void ta_cp_async_commit() {
  emu::Fiber& f = emu::g_dev->self();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
template <int N>
inline void ta_cp_async_wait() {
  emu::Fiber& f = emu::g_dev->self();
  while (f.groups.size() > static_cast<std::size_t>(N)) {
    for (const emu::Copy& c : f.groups.front()) {
      if (c.valid) std::memcpy(c.dst, c.src, 16);
      else std::memset(c.dst, 0, 16);
    }
    f.groups.pop_front();
  }
}

template <class T> inline uint32_t ta_pack2(float lo, float hi) {
  return static_cast<uint32_t>(from_f<T>(lo).bits) | (static_cast<uint32_t>(from_f<T>(hi).bits) << 16);
}
template <class T> inline void ta_store2(T* p, float a, float b) {
  p[0] = from_f<T>(a);
  p[1] = from_f<T>(b);
}

}  // namespace attn
}  // namespace tessel::cuda_kernels

#define TESSEL_ATTENTION_EMULATE 1
#define TA_HAS_SM80 1
#define TA_DEV inline
#define TA_KERNEL(threads) inline void
#define TA_UNROLL
#include "../../src/runtime/cuda/kernels/attention_kernels.cuh"

// ================================ tests =========================================================
namespace {

ck::AttentionDims dims(int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D, bool causal, bool bshd = false) {
  ck::AttentionDims p;
  p.B = B, p.H = H, p.Sq = Sq, p.Sk = Sk, p.D = D;
  p.causal = causal;
  p.offset = Sk - Sq;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D > 0 ? D : 1));
  auto st = [&](int64_t S, int64_t& sb, int64_t& sh, int64_t& ss) {
    if (bshd) ss = H * D, sh = D, sb = S * H * D;
    else ss = D, sh = S * D, sb = H * S * D;
  };
  st(Sq, p.q_sb, p.q_sh, p.q_ss);
  st(Sk, p.k_sb, p.k_sh, p.k_ss);
  return p;
}

}  // namespace

TEST_CASE("cuda attention plan: visited tiles cover every visible pair and skipped ones none", "[cuda][attention]") {
  std::mt19937_64 rng(7);
  for (int c = 0; c < 400; ++c) {
    const int64_t Sq = 1 + static_cast<int64_t>(rng() % 300);
    const int64_t Sk = Sq + (rng() % 2 ? static_cast<int64_t>(rng() % 200) : 0);
    const bool causal = rng() % 2;
    const ck::AttentionDims p = dims(1, 1, Sq, Sk, 64, causal);
    INFO("Sq " << Sq << " Sk " << Sk << " causal " << causal);
    for (int64_t bm : {16, 32, 64, 128})
      for (int64_t bn : {16, 32, 64}) {
        // Forward / dQ: query block i0 visits key tiles [0, ceil(kv_end / bn)).
        for (int64_t i0 = 0; i0 < Sq; i0 += bm) {
          const int64_t tiles = at::ceil_div(at::kv_end(p, i0, bm), bn);
          for (int64_t j0 = 0; j0 < Sk; j0 += bn) {
            bool any = false, all = true;
            for (int64_t i = i0; i < std::min(Sq, i0 + bm); ++i)
              for (int64_t j = j0; j < j0 + bn; ++j) {
                const bool vis = j < Sk && at::visible(p, i, j);
                any = any || vis;
                all = all && vis;
              }
            REQUIRE(any == (j0 / bn < tiles));
            if (j0 / bn < tiles && !at::tile_needs_mask(p, i0, j0, bn)) REQUIRE(all);
          }
        }
        // dK/dV: key block j0 visits query tiles from q_begin(j0) / bm on.
        for (int64_t j0 = 0; j0 < Sk; j0 += bn) {
          const int64_t first = at::q_begin(p, j0) / bm;
          for (int64_t i0 = 0; i0 < Sq; i0 += bm) {
            bool any = false, all = true;
            for (int64_t i = i0; i < std::min(Sq, i0 + bm); ++i)
              for (int64_t j = j0; j < std::min(Sk, j0 + bn); ++j) {
                const bool vis = at::visible(p, i, j);
                any = any || vis;
                all = all && vis;
              }
            if (any) REQUIRE(i0 / bm >= first);
            if (i0 / bm >= first && !at::causal_partial(p, i0, j0, bn)) REQUIRE(all);
          }
        }
      }
  }
}

TEST_CASE("cuda attention plan: causal blocks skip the masked half", "[cuda][attention]") {
  // [8, 12, 1024, 64] causal: the forward's key tiles per query block, over all blocks, against
  // the full square (the benchmark's shape, issue 35).
  const ck::AttentionDims p = dims(8, 12, 1024, 1024, 64, true);
  int64_t tiles = 0;
  for (int64_t i0 = 0; i0 < p.Sq; i0 += at::kFwdBlockM) tiles += at::ceil_div(at::kv_end(p, i0, at::kFwdBlockM), at::fwd_block_n(64));
  const int64_t full = at::ceil_div(p.Sq, at::kFwdBlockM) * at::ceil_div(p.Sk, at::fwd_block_n(64));
  CHECK(static_cast<double>(tiles) / static_cast<double>(full) <= 0.57);
  // The heaviest query block runs first (blocks are scheduled in index order).
  const at::BlockCoord first = at::block_coord(0, 96, 8, true), last = at::block_coord(8 * 96 - 1, 96, 8, true);
  CHECK(first.tile == 7);
  CHECK(first.bh == 0);
  CHECK(last.tile == 0);
  CHECK(last.bh == 95);
}

TEST_CASE("cuda attention plan: paths and grids and limits", "[cuda][attention]") {
  using at::Path;
  const ck::AttentionDims p64 = dims(8, 12, 1024, 1024, 64, true, true);
  at::Plan pl = at::plan_attention(p64, DType::bf16, true, true, "attention");
  CHECK(pl.path == Path::TensorCore);
  CHECK(pl.forward.blocks == 96 * 8);
  CHECK(pl.forward.threads == at::kFwdThreads);
  CHECK(pl.dkdv.blocks == 96 * 16);
  CHECK(pl.dq.blocks == 96 * 16);
  CHECK(pl.dsum.blocks == 96 * 1024 / 8);
  CHECK(pl.forward.smem == (128 * 64 + 4 * 64 * 64) * 2);
  CHECK(pl.dkdv.smem <= 227 * 1024);
  CHECK(at::plan_attention(dims(1, 1, 8, 8, 128, false), DType::f16, true, true, "a").dq.smem <= 227 * 1024);
  // Not the tensor-core path: f32, another head_dim, misaligned, an old device.
  CHECK(at::plan_attention(p64, DType::f32, true, true, "a").path == Path::Generic);
  CHECK(at::plan_attention(dims(1, 1, 8, 8, 32, false), DType::bf16, true, true, "a").path == Path::Generic);
  CHECK(at::plan_attention(p64, DType::bf16, false, true, "a").path == Path::Generic);
  CHECK(at::plan_attention(p64, DType::bf16, true, false, "a").path == Path::Generic);
  // Generic tiles: 32 up to head_dim 64, else 16; shared memory within an sm_80 block's limit.
  CHECK(at::plan_attention(dims(1, 1, 100, 100, 4, false), DType::f32, true, true, "a").forward.tile == 32);
  CHECK(at::plan_attention(dims(1, 1, 100, 100, 256, false), DType::f32, true, true, "a").forward.tile == 16);
  for (int64_t D : {1, 4, 16, 63, 64, 65, 100, 128, 255, 256}) {
    CHECK(at::generic_smem_floats(D) * 4 <= 99 * 1024);
    CHECK(at::generic_tile(D) * D <= at::kGenericAcc * at::kGenericThreads);
  }
  // Errors: head_dim above 256, a grid above 2^31 - 1 blocks.
  CHECK_THROWS_WITH(at::plan_attention(dims(1, 1, 8, 8, 257, false), DType::f32, true, true, "attention"),
                    Catch::Contains("head_dim 257") && Catch::Contains("256"));
  CHECK_THROWS_WITH(at::plan_attention(dims(int64_t{1} << 26, 64, 1024, 1024, 64, false), DType::bf16, true, true, "attention"),
                    Catch::Contains("grid limit"));
  // Strides: bhsd and bshd with head_dim 64 are multiples of 8; head_dim 4 is not.
  CHECK(at::strides_multiple_of(dims(2, 3, 5, 7, 64, false, true), 8));
  CHECK_FALSE(at::strides_multiple_of(dims(2, 3, 5, 7, 4, false, false), 8));
}

// ---- the kernels on the emulated GPU against the CPU kernels ------------------------------------
namespace {

struct AttnCase {
  DType dt;
  int64_t B, H, Sq, Sk, D;
  bool causal, bshd;
};

std::string describe(const AttnCase& c) {
  return std::string(dtype_name(c.dt)) + " [" + std::to_string(c.B) + "," + std::to_string(c.H) + "," +
         std::to_string(c.Sq) + "/" + std::to_string(c.Sk) + "," + std::to_string(c.D) + "] " +
         (c.bshd ? "bshd" : "bhsd") + (c.causal ? " causal" : "");
}

HostTensor random_tensor(DType dt, const Shape& s, std::mt19937_64& rng, double lo, double hi) {
  HostTensor t(dt, s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

Shape shape_of(const AttnCase& c, int64_t S) { return c.bshd ? Shape{c.B, S, c.H, c.D} : Shape{c.B, c.H, S, c.D}; }

// An attention op's kernel arguments on `in` (q, k, v), results unset but for their types: what
// attention_params reads.
KernelArgs attention_args(const OpAttrs& attrs, std::vector<HostTensor>& in, const Shape& lse_shape) {
  static float dummy[1];
  KernelArgs a;
  a.kind = OpKind::Attention;
  a.attrs = &attrs;
  for (HostTensor& t : in) {
    a.in.push_back(t.data());
    a.in_shapes.push_back(t.shape());
    a.in_dtypes.push_back(t.dtype());
  }
  a.out = dummy;
  a.out_shape = in[0].shape();
  a.out_dtype = in[0].dtype();
  a.extra_out = {dummy};
  a.extra_out_shapes = {lse_shape};
  a.extra_out_dtypes = {DType::f32};
  return a;
}

Op op_of(OpKind kind, const OpAttrs& attrs) {
  Op op;
  op.kind = kind;
  op.attrs = attrs;
  return op;
}

struct EmuRun {
  emu::Device dev;
  explicit EmuRun(emu::Schedule s, uint64_t seed) : dev(s, seed) {}
  // A launch callback for at::run_forward / run_backward.
  auto launcher() {
    return [this](auto kernel, const at::Launch& l, const at::Args& a, const char*) {
      at::Args b = a;
      b.tiles = l.tiles;
      const std::function<void()> body = [&] { kernel(b); };
      for (int64_t blk = 0; blk < l.blocks; ++blk) dev.run_block(blk, l.threads, l.smem, body);
    };
  }
};

// Runs the forward and the backward of c on the CPU and on the emulated GPU and compares.
void check_case(const AttnCase& c, uint64_t seed, bool tc_device, emu::Schedule sched, double tol) {
  INFO(describe(c) << (tc_device ? "" : " (no tensor cores)")
                   << (sched == emu::Schedule::Descending ? " (threads in descending order)"
                       : sched == emu::Schedule::Random  ? " (warps held back at random)"
                                                         : "")
                   << " seed " << seed);
  std::mt19937_64 rng(seed);
  OpAttrs attrs;
  attrs.equation = c.bshd ? "bshd" : "bhsd";
  attrs.causal = c.causal;
  attrs.scalar = 1.0 / std::sqrt(static_cast<double>(c.D));
  const Shape qs = shape_of(c, c.Sq), ks = shape_of(c, c.Sk), ls{c.B, c.H, c.Sq};
  std::vector<HostTensor> in = {random_tensor(c.dt, qs, rng, -2, 2), random_tensor(c.dt, ks, rng, -2, 2),
                                random_tensor(c.dt, ks, rng, -1, 1)};
  // The strides as every backend derives them (src/runtime/attention_params.hpp), from an
  // attention op's kernel arguments.
  const ck::AttentionDims p = ck::attention_dims(attention_params(attention_args(attrs, in, ls), "cuda"));
  const at::Plan plan = at::plan_attention(p, c.dt, true, tc_device, "attention");
  CHECK((plan.path == at::Path::TensorCore) == (tc_device && c.dt != DType::f32 && (c.D == 64 || c.D == 128)));
  // ---- forward
  const std::vector<HostTensor> want =
      tessel_test::cpu_kernel(op_of(OpKind::Attention, attrs), in, {{c.dt, qs}, {DType::f32, ls}});
  std::vector<HostTensor> got = {HostTensor(c.dt, qs), HostTensor(DType::f32, ls)};
  for (HostTensor& t : got) t.poison();
  EmuRun run(sched, seed);
  for (const HostTensor& t : in) run.dev.add_global(t.data(), t.bytes());
  at::Args a = at::make_args(p);
  a.q = in[0].data(), a.k = in[1].data(), a.v = in[2].data(), a.out = got[0].data();
  a.lse = got[1].as<float>();
  at::run_forward(plan, c.dt, a, run.launcher());
  for (std::size_t r = 0; r < 2; ++r) {
    const CompareResult cmp = compare(got[r], want[r], max_abs(in));
    INFO("forward result " << r << " " << cmp.to_string());
    CHECK(cmp.max_rel_err <= (r == 1 ? 1e-5 : tol));  // lse: f32 scores on every path
  }
  // ---- backward, on the CPU's forward results (the same operands on both sides)
  std::vector<HostTensor> bin = {in[0], in[1], in[2], want[0], want[1], random_tensor(c.dt, qs, rng, -1, 1)};
  const std::vector<HostTensor> bwant =
      tessel_test::cpu_kernel(op_of(OpKind::AttentionGrad, attrs), bin, {{c.dt, qs}, {c.dt, ks}, {c.dt, ks}});
  std::vector<HostTensor> bgot = {HostTensor(c.dt, qs), HostTensor(c.dt, ks), HostTensor(c.dt, ks)};
  for (HostTensor& t : bgot) t.poison();
  std::vector<float> dsum(static_cast<std::size_t>(c.B * c.H * c.Sq), std::nanf(""));
  EmuRun brun(sched, seed + 1);
  for (const HostTensor& t : bin) brun.dev.add_global(t.data(), t.bytes());
  at::Args b = at::make_args(p);
  b.q = bin[0].data(), b.k = bin[1].data(), b.v = bin[2].data(), b.o_in = bin[3].data(), b.dout = bin[5].data();
  b.lse = bin[4].as<float>();
  b.dsum = dsum.data();
  b.out = bgot[0].data(), b.dk = bgot[1].data(), b.dv = bgot[2].data();
  at::run_backward(plan, c.dt, b, brun.launcher());
  const char* names[] = {"dq", "dk", "dv"};
  for (std::size_t r = 0; r < 3; ++r) {
    const CompareResult cmp = compare(bgot[r], bwant[r], max_abs(bin));
    INFO("backward " << names[r] << " " << cmp.to_string());
    CHECK(cmp.max_rel_err <= tol);
  }
}

// Max-norm relative errors against the CPU kernels, the floor the largest operand (compare()):
// f32 differs in summation order only; bf16/f16 on the tensor-core path round P and dS to the
// operand type for the MMAs (FlashAttention-2 does the same) and each side rounds its results
// once, about 1e-3 (bf16) and 2e-4 (f16) in these cases.
double tolerance(DType dt) { return dt == DType::f32 ? 1e-5 : dt == DType::bf16 ? 8e-3 : 1e-3; }

}  // namespace

TEST_CASE("cuda attention kernels on an emulated warp: tensor-core path == CPU kernels", "[cuda][attention][emulated]") {
  using emu::Schedule;
  // Lengths off the tiles (128 queries, 64 keys), Sk > Sq, both layouts and masks, head_dim 64 and 128.
  const std::vector<AttnCase> cases = {
      {DType::bf16, 1, 2, 70, 150, 64, true, true},    {DType::bf16, 1, 1, 130, 130, 64, true, false},
      {DType::f16, 2, 1, 37, 90, 64, false, false},    {DType::f16, 1, 1, 150, 160, 128, true, true},
      {DType::bf16, 1, 1, 65, 65, 128, false, true},   {DType::f16, 1, 2, 20, 200, 64, true, false},
  };
  uint64_t seed = 100;
  for (const AttnCase& c : cases) check_case(c, ++seed, true, Schedule::Ascending, tolerance(c.dt));
  // Other schedules: a missing barrier or wait shows in one of them.
  check_case(cases[0], 7, true, Schedule::Descending, tolerance(cases[0].dt));
  for (uint64_t s = 0; s < 3; ++s) {
    check_case(cases[1], 20 + s, true, Schedule::Random, tolerance(cases[1].dt));
    check_case(cases[3], 30 + s, true, Schedule::Random, tolerance(cases[3].dt));
  }
}

TEST_CASE("cuda attention kernels on an emulated warp: generic path == CPU kernels", "[cuda][attention][emulated]") {
  using emu::Schedule;
  const std::vector<AttnCase> cases = {
      {DType::f32, 2, 2, 45, 45, 4, true, false},      {DType::f32, 1, 3, 33, 70, 16, true, true},
      {DType::f32, 1, 1, 70, 70, 64, false, true},     {DType::bf16, 2, 1, 19, 50, 16, false, false},
      {DType::f16, 1, 2, 40, 41, 4, true, true},       {DType::f32, 1, 1, 20, 37, 100, true, false},
      {DType::f32, 1, 1, 17, 17, 256, false, true},    {DType::f32, 1, 1, 1, 5, 8, true, false},
  };
  uint64_t seed = 200;
  for (const AttnCase& c : cases) check_case(c, ++seed, true, Schedule::Ascending, tolerance(c.dt));
  check_case(cases[1], 9, true, Schedule::Descending, tolerance(cases[1].dt));
  check_case(cases[1], 10, true, Schedule::Random, tolerance(cases[1].dt));
  // bf16 with head_dim 64 where the tensor-core kernels do not apply (an old device).
  check_case({DType::bf16, 1, 1, 50, 80, 64, true, true}, 11, false, Schedule::Ascending, tolerance(DType::bf16));
}
