// calibrate_links (tessel/runtime/calibrate.hpp): α and bus bandwidth per mesh axis from
// timed all-reduces on the runtime's communication streams.
#include "tessel/runtime/calibrate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

namespace tessel {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

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

CostModel measured_cost_model(Runtime& runtime, const Mesh& mesh, const CalibrationOptions& options) {
  CostModel cost;
  cost.links = calibrate_links(runtime, mesh, options).links();
  const ComputeCalibration c = calibrate_compute(options);
  cost.flops_per_s = c.flops_per_s;
  cost.memory_bandwidth = c.memory_bandwidth;
  const int64_t local = mesh.num_devices() / std::max(1, runtime.process_count());
  cost.compute_sharing = compute_sharing(local, static_cast<int64_t>(std::thread::hardware_concurrency()));
  return cost;
}

}  // namespace tessel
