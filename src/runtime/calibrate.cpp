// calibrate_links (tessel/runtime/calibrate.hpp): α and bus bandwidth per mesh axis from
// timed all-reduces on the runtime's communication streams.
#include "tessel/runtime/calibrate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <memory>
#include <thread>
#include <vector>

#include "tessel/compiler/compiled_program.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/kernels.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

namespace tessel {

std::map<std::string, LinkSpec> LinkCalibration::links() const {
  std::map<std::string, LinkSpec> out;
  for (const auto& a : axes) out[a.axis] = a.link;
  return out;
}

std::string LinkCalibration::to_links_file(const std::string& machine) const {
  std::string out;
  out += "# tessel link figures (format: docs/links.md), written by calibrate_links\n";
  out += fmt::format("# runtime {}, mesh {}{}\n", runtime, mesh.to_string(), machine.empty() ? "" : ", machine " + machine);
  out += fmt::format("# f32 all-reduce on every group of an axis at once: alpha = median time of {} bytes, "
                     "bw = {}*2(n-1)/n / (t_large - alpha) with t_large the median time of {} bytes; "
                     "{} timed calls per size after {} warm-up calls\n",
                     options.small_bytes, options.large_bytes, options.large_bytes, options.iterations,
                     options.warmup);
  for (const auto& a : axes)
    out += fmt::format("# {}: n={} t_small={:.4g} us t_large={:.4g} us busbw={:.4g} GB/s\n", a.axis, a.group_size,
                       a.small_seconds * 1e6, a.large_seconds * 1e6, a.busbw / 1e9);
  if (axes.empty()) out += "# (no axis of size > 1: nothing to measure)\n";
  out += format_links(links());
  return out;
}

LinkCalibration calibrate_links(Runtime& rt, const Mesh& mesh, const CalibrationOptions& o) {
  if (o.small_bytes < 4 || o.small_bytes % 4 || o.large_bytes % 4 || o.large_bytes <= o.small_bytes)
    throw RuntimeError(fmt::format("calibrate_links: small_bytes ({}) and large_bytes ({}) must be multiples of 4 "
                                   "bytes (f32) with 4 <= small < large",
                                   o.small_bytes, o.large_bytes));
  if (o.iterations < 1 || o.warmup < 0)
    throw RuntimeError(fmt::format("calibrate_links: iterations ({}) must be >= 1 and warmup ({}) >= 0",
                                   o.iterations, o.warmup));
  LinkCalibration cal;
  cal.runtime = rt.name();
  cal.mesh = mesh;
  cal.options = o;
  const std::vector<int64_t> positions = rt.devices_for(mesh);
  std::vector<std::vector<std::string>> groups;
  for (const MeshAxis& a : mesh.axes())
    if (a.size > 1) groups.push_back({a.name});
  if (groups.empty()) return cal;
  std::unique_ptr<CollectiveWorld> world = rt.make_world(mesh, groups, o.timeout_s);
  DeviceThreads& lr = rt.local();
  const std::size_t nlocal = positions.size();

  // Buffers (zeros: no denormal or NaN arithmetic in the timed reductions).
  std::vector<std::shared_ptr<Buffer>> send(nlocal), recv(nlocal);
  {
    const std::vector<char> zeros(o.large_bytes, 0);
    for (std::size_t d = 0; d < nlocal; ++d) {
      Backend& be = lr.backend(static_cast<int64_t>(d));
      send[d] = be.allocate(o.large_bytes);
      recv[d] = be.allocate(o.large_bytes);
      be.copy_from_host(*send[d], zeros.data(), o.large_bytes, lr.transfer_stream(static_cast<int64_t>(d)));
      be.copy_from_host(*recv[d], zeros.data(), o.large_bytes, lr.transfer_stream(static_cast<int64_t>(d)));
    }
    for (std::size_t d = 0; d < nlocal; ++d) lr.transfer_stream(static_cast<int64_t>(d)).synchronize();
  }

  for (const auto& axes : groups) {
    const std::string& axis = axes[0];
    std::vector<std::unique_ptr<Communicator>> comms;
    for (std::size_t d = 0; d < nlocal; ++d) comms.push_back(world->communicator(positions[d], axes));
    const int64_t n = mesh.axis_size(axis);
    auto time_size = [&](std::size_t bytes) {
      const std::size_t count = bytes / 4;
      std::vector<std::vector<double>> t(nlocal, std::vector<double>(static_cast<std::size_t>(o.iterations)));
      const auto errors = lr.run_on_devices([&](int64_t d) {
        const auto i = static_cast<std::size_t>(d);
        // As a step runs it: a program with at most inline_max_comm_bytes of collectives runs
        // them on the device thread itself (no hand-off to a stream worker), a larger one on
        // the communication stream.
        const bool inline_run = lr.settings().stream_mode == StreamMode::Async &&
                                static_cast<int64_t>(bytes) <= lr.settings().inline_max_comm_bytes;
        Stream& s = inline_run ? lr.inline_stream(d) : lr.comm_stream(d);
        for (int k = 0; k < o.warmup; ++k) {
          comms[i]->all_reduce(send[i]->data(), recv[i]->data(), count, DType::f32, ReduceOp::Sum, s);
          s.synchronize();
        }
        for (int k = 0; k < o.iterations; ++k) {
          const auto t0 = std::chrono::steady_clock::now();
          comms[i]->all_reduce(send[i]->data(), recv[i]->data(), count, DType::f32, ReduceOp::Sum, s);
          s.synchronize();
          t[i][static_cast<std::size_t>(k)] =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
      });
      for (const auto& e : errors)
        if (e) {
          world->abort("calibrate_links: a device failed");
          std::rethrow_exception(e);
        }
      // Per call, the slowest device of this process, then of every process.
      std::vector<HostTensor> local;
      for (std::size_t d = 0; d < nlocal; ++d) {
        HostTensor h(DType::f32, {o.iterations});
        for (int k = 0; k < o.iterations; ++k) h.as<float>()[k] = static_cast<float>(t[d][static_cast<std::size_t>(k)]);
        local.push_back(std::move(h));
      }
      const std::vector<HostTensor> all = rt.allgather_shards(mesh, std::move(local));
      std::vector<double> worst(static_cast<std::size_t>(o.iterations), 0.0);
      for (const HostTensor& h : all)
        for (int k = 0; k < o.iterations; ++k)
          worst[static_cast<std::size_t>(k)] = std::max(worst[static_cast<std::size_t>(k)], static_cast<double>(h.as<float>()[k]));
      return median(worst);
    };
    AxisCalibration a;
    a.axis = axis;
    a.group_size = n;
    a.small_seconds = time_size(o.small_bytes);
    a.large_seconds = time_size(o.large_bytes);
    const double moved = static_cast<double>(o.large_bytes) * CostModel::ring_factor(CollectiveKind::AllReduce, n);
    a.busbw = moved / a.large_seconds;
    a.link.alpha_s = a.small_seconds;
    // The latency comes out of the large call too; a large call faster than the small one
    // (noise on a busy machine) falls back to the plain busbw.
    const double transfer = a.large_seconds - a.small_seconds;
    a.link.bandwidth = transfer > 0.05 * a.large_seconds ? moved / transfer : a.busbw;
    cal.axes.push_back(a);
  }
  return cal;
}

ComputeCalibration calibrate_compute(const CalibrationOptions& o) {
  if (o.iterations < 1 || o.warmup < 0)
    throw RuntimeError(fmt::format("calibrate_compute: iterations {} and warmup {} (want iterations >= 1, warmup >= 0)",
                                   o.iterations, o.warmup));
  ComputeCalibration c;
  auto timed = [&](const KernelArgs& a) {
    std::vector<double> t;
    for (int k = 0; k < o.warmup + o.iterations; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      run_cpu_kernel(a);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (k >= o.warmup) t.push_back(s);
    }
    return median(std::move(t));
  };
  // A binary kernel x op y -> z on f32 tensors.
  auto binary = [](OpKind kind, const OpAttrs& attrs, HostTensor& x, HostTensor& y, HostTensor& z) {
    KernelArgs a;
    a.kind = kind;
    a.attrs = &attrs;
    a.in = {x.data(), y.data()};
    a.in_shapes = {x.shape(), y.shape()};
    a.in_dtypes = {DType::f32, DType::f32};
    a.out = z.data();
    a.out_shape = z.shape();
    a.out_dtype = DType::f32;
    return a;
  };
  auto ones = [](Shape shape) {
    HostTensor t(DType::f32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = 1.0f;  // (values do not change the time)
    return t;
  };
  const int64_t n = c.gemm_size;
  HostTensor x = ones({n, n}), y = ones({n, n}), z(DType::f32, {n, n});
  OpAttrs mm;
  mm.equation = "mk,kn->mn";
  c.gemm_seconds = timed(binary(OpKind::Einsum, mm, x, y, z));
  c.flops_per_s = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / c.gemm_seconds;
  const int64_t m = c.stream_bytes / 4;  // a + b -> out, each stream_bytes
  HostTensor a = ones({m}), b = ones({m}), out(DType::f32, {m});
  c.stream_seconds = timed(binary(OpKind::Add, OpAttrs{}, a, b, out));
  c.memory_bandwidth = 3.0 * static_cast<double>(c.stream_bytes) / c.stream_seconds;
  return c;
}

DispatchCalibration calibrate_dispatch(Runtime& rt, const Mesh& mesh, const CalibrationOptions& o) {
  if (o.iterations < 1 || o.warmup < 0)
    throw RuntimeError(fmt::format("calibrate_dispatch: iterations ({}) must be >= 1 and warmup ({}) >= 0",
                                   o.iterations, o.warmup));
  DispatchCalibration c;
  // A chain of n kernels on 16 floats, replicated (every device runs all of it), unfused.
  auto time_chain = [&](int64_t n, bool resident) {
    Graph g;
    Tensor x = input(g, "x", DType::f32, {16});
    Tensor y = x;
    for (int64_t k = 0; k < n; ++k) y = k % 2 ? add(y, x) : mul(y, x);
    g.mark_output(y);
    LoadOptions lo;
    lo.lowering.fuse_elementwise = false;
    LoadedExecutable le = load(compile_program(g, mesh), rt, lo);
    HostTensor ones(DType::f32, {16});
    for (int64_t i = 0; i < 16; ++i) ones.as<float>()[i] = 1.0f;
    std::vector<double> t;
    const std::vector<ShardedArray> kept = le.to_device(std::vector<HostTensor>{ones});
    for (int k = 0; k < o.warmup + o.iterations; ++k) {
      // A step as a caller runs one: its input sent, the run, a result read back (resident: the
      // run alone).
      const auto t0 = std::chrono::steady_clock::now();
      if (resident) {
        le.run(kept);
      } else {
        const std::vector<ShardedArray> in = le.to_device(std::vector<HostTensor>{ones});
        const RunResult r = le.run(in);
        le.to_host(r.outputs.at(0));
      }
      if (k >= o.warmup) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(std::move(t));
  };
  c.short_seconds = time_chain(c.short_chain, false);
  c.long_seconds = time_chain(c.long_chain, false);
  c.resident_seconds = time_chain(c.short_chain, true);
  c.per_instruction_s =
      std::max(0.0, (c.long_seconds - c.short_seconds) / static_cast<double>(c.long_chain - c.short_chain));
  c.per_run_s = std::max(0.0, c.short_seconds - static_cast<double>(c.short_chain) * c.per_instruction_s);
  c.per_launch_s = std::min(
      c.per_run_s, std::max(0.0, c.resident_seconds - static_cast<double>(c.short_chain) * c.per_instruction_s));
  return c;
}

namespace {

// A made-up operand: floats in [0.5, 1) (no log or square root of a negative, no denormal),
// integers 0 (an index in range of any table).
HostTensor made_up(DType dtype, const Shape& shape, uint64_t seed) {
  HostTensor t(dtype, shape);
  const bool is_float = dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t.set(i, is_float ? 0.5 + 0.5 * static_cast<double>(x >> 11) / static_cast<double>(1ull << 53) : 0.0);
  }
  return t;
}

}  // namespace

KernelTimes time_kernels(const Program& p, int64_t devices_at_once, const CalibrationOptions& o) {
  if (o.iterations < 1 || o.warmup < 0)
    throw RuntimeError(fmt::format("time_kernels: iterations ({}) must be >= 1 and warmup ({}) >= 0", o.iterations,
                                   o.warmup));
  if (!(o.warmup_s >= 0) || !std::isfinite(o.warmup_s))
    throw RuntimeError(fmt::format("time_kernels: warmup_s ({}) must be a finite number of seconds >= 0", o.warmup_s));
  if (devices_at_once < 1)
    throw RuntimeError(fmt::format("time_kernels: devices_at_once {} (give at least 1)", devices_at_once));
  KernelTimes out;
  out.devices = devices_at_once;
  out.seconds.assign(p.instrs.size(), 0.0);
  out.timed.assign(p.instrs.size(), false);
  const std::size_t nv = p.values.size();
  // One device's memory: the arena and host pool of the plan, a buffer of its own for every
  // value outside them (inputs, outputs), the inputs made up; each kernel's arguments over it.
  struct Device {
    std::vector<char> arena, host_pool;
    std::deque<HostTensor> own;
    std::vector<void*> at;
    std::vector<std::pair<std::size_t, KernelArgs>> kernels;  // (instruction, args)
    // sync[k]: a collective comes before kernel k (k == kernels.size(): after the last one).
    std::vector<char> sync;
  };
  std::vector<Device> devs(static_cast<std::size_t>(devices_at_once));
  for (Device& d : devs) {
    d.arena.assign(static_cast<std::size_t>(std::max<int64_t>(p.memory.arena_bytes, 1)), 0);
    d.host_pool.assign(static_cast<std::size_t>(std::max<int64_t>(p.memory.host_bytes, 1)), 0);
    d.at.assign(nv, nullptr);
    for (std::size_t v = 0; v < nv; ++v) {
      const LocalValue& lv = p.values[v];
      // Integer values (token ids, labels, indices) keep a buffer of zeros of their own: the
      // copies and collectives that would write them into the arena do not run, and a kernel's
      // floats there are no index.
      if (v < p.memory.offset.size() && p.memory.offset[v] >= 0 && lv.dtype != DType::i32) {
        d.at[v] = (lv.host ? d.host_pool.data() : d.arena.data()) + p.memory.offset[v];
      } else {
        d.own.push_back(made_up(lv.dtype, lv.shape, v + 1));
        d.at[v] = d.own.back().data();
      }
    }
    bool pending = false;  // a collective since the last kernel
    for (std::size_t i = 0; i < p.instrs.size(); ++i) {
      const Instr& in = p.instrs[i];
      // Where a device needs a collective's result (its peers must have come to it too).
      if (in.kind == InstrKind::Collective || in.kind == InstrKind::CollectiveDone) pending = true;
      if (in.kind != InstrKind::Kernel) continue;
      d.sync.push_back(pending ? 1 : 0);
      pending = false;
      KernelArgs a = kernel_args_of(p, i, 0);
      for (std::size_t k = 0; k < in.in.size(); ++k) a.in[k] = d.at[static_cast<std::size_t>(in.in[k])];
      a.out = d.at[static_cast<std::size_t>(in.out)];
      for (std::size_t k = 0; k < in.extra_out.size(); ++k) a.extra_out[k] = d.at[static_cast<std::size_t>(in.extra_out[k])];
      a.num_threads = 1;
      d.kernels.emplace_back(i, std::move(a));
    }
    d.sync.push_back(pending ? 1 : 0);
  }
  // What fails on made-up values is left out (named): found in a first pass on device 0
  // alone, or later on any device (a value a kernel made from made-up ones).
  std::unique_ptr<std::atomic<bool>[]> runs(new std::atomic<bool>[p.instrs.size()]);
  for (std::size_t i = 0; i < p.instrs.size(); ++i) runs[i] = false;
  std::mutex fail_mu;
  std::set<std::size_t> reported;
  auto failed = [&](std::size_t i, const char* why) {
    runs[i] = false;
    std::lock_guard<std::mutex> l(fail_mu);
    if (reported.insert(i).second)
      out.untimed.push_back(fmt::format("instruction #{} ({}): {}", i, op_name(p.instrs[i].op), why));
  };
  for (const auto& [i, a] : devs[0].kernels) {
    ++out.kernels;
    try {
      run_cpu_kernel(a);
      runs[i] = true;
    } catch (const std::exception& e) {
      failed(i, e.what());
    }
  }
  // The passes: every device's thread runs its kernels in program order, all released together;
  // a pass lasts from the release to the last device's end (a device the cores do not take at
  // once starts late: its wait is in the pass, as in a step). Untimed passes first, `warmup` of
  // them and for at least `warmup_s`: fresh threads on cores they share run slower for tens of
  // milliseconds (the 2-core VM, 4 devices: about 70 ms at 1.4x, in which 3 + 20 passes of a 2-ms
  // program all fell), then `iterations` timed ones.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const int passes = o.iterations;
  std::vector<Clock::time_point> released(static_cast<std::size_t>(passes));
  std::vector<std::vector<Clock::time_point>> ended(devs.size(), std::vector<Clock::time_point>(static_cast<std::size_t>(passes)));
  std::vector<std::vector<double>> instr_s(p.instrs.size());
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0, generation = 0;
  int warm_done = 0, timed_done = 0;
  int next_pass = 0;  // set by the last to come to a pass's barrier: -1 warm-up, >= 0 the timed pass, passes: done
  // Every device's thread waits here until all have come. At a pass's start (`pass_start`) the
  // last to come decides the pass (next_pass) and stamps a timed pass's release.
  auto barrier = [&](bool pass_start) {
    std::unique_lock<std::mutex> l(mu);
    if (++ready == static_cast<int>(devs.size())) {
      ready = 0;
      ++generation;
      if (pass_start) {
        const double warm_s = std::chrono::duration<double>(Clock::now() - start).count();
        if (warm_done < o.warmup || warm_s < o.warmup_s) {
          ++warm_done;
          next_pass = -1;
        } else {
          next_pass = timed_done < passes ? timed_done++ : passes;
          if (next_pass < passes) released[static_cast<std::size_t>(next_pass)] = Clock::now();
        }
      }
      cv.notify_all();
      return next_pass;
    }
    const int g = generation;
    cv.wait(l, [&] { return generation != g; });
    return next_pass;
  };
  const bool sync = o.sync_at_collectives && devs.size() > 1;
  if (sync)
    for (std::size_t k = 0; k < devs[0].kernels.size(); ++k) out.sync_points += devs[0].sync[k] != 0;
  auto body = [&](std::size_t t) {
    Device& d = devs[t];
    while (true) {
      const int r = barrier(true);
      if (r >= passes) break;
      for (std::size_t k = 0; k < d.kernels.size(); ++k) {
        if (sync && d.sync[k]) barrier(false);
        const auto& [i, a] = d.kernels[k];
        if (!runs[i]) continue;
        const auto k0 = Clock::now();
        try {
          run_cpu_kernel(a);
        } catch (const std::exception& e) {
          failed(i, e.what());
          continue;
        }
        if (t == 0 && r >= 0) instr_s[i].push_back(std::chrono::duration<double>(Clock::now() - k0).count());
      }
      if (r >= 0) ended[t][static_cast<std::size_t>(r)] = Clock::now();
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t t = 1; t < devs.size(); ++t) threads.emplace_back(body, t);
  body(0);
  for (std::thread& th : threads) th.join();
  std::vector<double> worst;
  for (int r = 0; r < passes; ++r) {
    Clock::time_point last = released[static_cast<std::size_t>(r)];
    for (const auto& e : ended) last = std::max(last, e[static_cast<std::size_t>(r)]);
    worst.push_back(std::chrono::duration<double>(last - released[static_cast<std::size_t>(r)]).count());
  }
  out.sequence_s = median(std::move(worst));
  for (std::size_t i = 0; i < p.instrs.size(); ++i)
    if (runs[i] && instr_s[i].size() == static_cast<std::size_t>(o.iterations)) {
      out.seconds[i] = median(instr_s[i]);
      out.timed[i] = true;
    }
  return out;
}

std::string ProgramPrediction::to_string() const {
  return fmt::format("{:.3f} ms (compute {:.3f}{} + collectives {:.3f} + dispatch {:.3f} + run {:.3f})", total() * 1e3,
                     compute_s * 1e3,
                     !timed ? " [roofline]"
                            : untimed.empty() ? " [timed kernels]"
                                              : fmt::format(" [timed kernels; {} of {} by the roofline: they do not run on "
                                                            "made-up inputs]",
                                                            untimed.size(), kernels),
                     comm_s * 1e3, dispatch_s * 1e3, run_s * 1e3);
}

ProgramPrediction predict_program(const Program& p, const CostModel& cost, const KernelTimes* timed) {
  if (timed && timed->seconds.size() != p.instrs.size())
    throw Error(fmt::format("predict_program: kernel times for {} instructions, the program has {} (time the program "
                            "itself: time_kernels)",
                            timed->seconds.size(), p.instrs.size()));
  ProgramPrediction out;
  out.timed = timed != nullptr;
  // Timed: the pass over the kernels as the devices ran it together (the cores' sharing in it),
  // and the roofline of the kernels it could not run and of the copies; else the roofline of all.
  if (timed) out.compute_s = timed->sequence_s;
  for (std::size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    if (in.kind != InstrKind::Kernel && in.kind != InstrKind::Copy) continue;
    if (timed && in.kind == InstrKind::Kernel && timed->timed[i]) continue;
    double bytes = 0;
    for (int v : in.defs()) bytes += static_cast<double>(p.values[static_cast<std::size_t>(v)].bytes());
    for (int v : in.in) bytes += static_cast<double>(p.values[static_cast<std::size_t>(v)].bytes());
    out.compute_s += cost.op_seconds(in.kind == InstrKind::Kernel ? in.flops : 0.0, bytes);
  }
  out.comm_s = p.comm_seconds(cost);
  out.dispatch_s = p.dispatch_seconds(cost);
  out.run_s = cost.run_s;
  out.launch_s = cost.launch_s;
  return out;
}

ProgramPrediction predict_on(const Program& lowered, const CostModel& cost, Runtime& runtime) {
  const std::string name = runtime.name();
  if (name != "threads" && name != "mpi") return predict_program(lowered, cost);
  // This process's devices: all of them on threads; a block of mesh / processes under MPI (known
  // before any program is loaded).
  const int64_t local = name == "mpi" ? std::max<int64_t>(1, lowered.mesh.num_devices() / std::max(1, runtime.process_count()))
                                      : static_cast<int64_t>(runtime.devices_for(lowered.mesh).size());
  const KernelTimes kt = time_kernels(lowered, local);
  ProgramPrediction out = predict_program(lowered, cost, &kt);
  out.untimed = kt.untimed;
  out.kernels = kt.kernels;
  return out;
}

bool plan_predicted_faster(const ProgramPrediction& plan, const ProgramPrediction& other, Runtime& runtime,
                           double margin) {
  if (!(margin > 0)) throw Error(fmt::format("plan_predicted_faster: margin {} (give a number > 0)", margin));
  const std::string mine = plan.total() <= margin * other.total() ? "plan" : "other";
  const std::vector<std::string> all = runtime.allgather_host(mine);
  return (all.empty() ? mine : all[0]) == "plan";
}

CostModel measured_cost_model(Runtime& runtime, const Mesh& mesh, const CalibrationOptions& options) {
  CostModel cost;
  cost.links = calibrate_links(runtime, mesh, options).links();
  const ComputeCalibration c = calibrate_compute(options);
  cost.flops_per_s = c.flops_per_s;
  cost.memory_bandwidth = c.memory_bandwidth;
  const int64_t local = mesh.num_devices() / std::max(1, runtime.process_count());
  cost.compute_sharing = compute_sharing(local, static_cast<int64_t>(std::thread::hardware_concurrency()));
  const DispatchCalibration d = calibrate_dispatch(runtime, mesh, options);
  cost.dispatch_s = d.per_instruction_s / cost.compute_sharing;
  cost.run_s = d.per_run_s;
  cost.launch_s = d.per_launch_s;
  return cost;
}

}  // namespace tessel

