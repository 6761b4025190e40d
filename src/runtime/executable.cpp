// compile() and Executable: scatter, one thread per device, gather.
#include "tessel/executable.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <thread>

#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/block_copy.hpp"
#include "tessel/runtime/executor.hpp"
#include "tessel/runtime/thread_communicator.hpp"
#include "tessel/runtime/trace.hpp"

namespace tessel {

Executable compile(const Graph& graph, const Mesh& mesh, const CompileOptions& opts) {
  PropagationResult prop = propagate(graph, mesh, opts.propagation);
  Program prog = partition(graph, mesh, prop, opts.partition);
  return Executable(graph, mesh, std::move(prop), std::move(prog));
}

Executable::Executable(Graph graph, Mesh mesh, PropagationResult prop, Program program)
    : graph_(std::move(graph)), mesh_(std::move(mesh)), prop_(std::move(prop)),
      program_(std::move(program)) {
  last_use_ = program_.last_use();
}

std::vector<HostTensor> Executable::scatter(std::size_t input, const HostTensor& global) const {
  if (input >= program_.inputs.size())
    throw RuntimeError(fmt::format("scatter: input #{} does not exist ({} inputs)", input, program_.inputs.size()));
  const LocalValue& lv = program_.values[program_.inputs[input]];
  if (global.dtype() != lv.dtype || global.shape() != lv.global_shape)
    throw RuntimeError(fmt::format("scatter: input #{} %{} expects {} but got {}", input, lv.name,
                                   type_str(lv.dtype, lv.global_shape), type_str(global.dtype(), global.shape())));
  std::vector<HostTensor> out;
  out.reserve(static_cast<std::size_t>(mesh_.num_devices()));
  for (int64_t d = 0; d < mesh_.num_devices(); ++d) {
    HostTensor t(lv.dtype, lv.shape);
    copy_block(global.data(), global.shape(), lv.sharding.local_offset(mesh_, lv.global_shape, d),
               t.data(), lv.shape, std::vector<int64_t>(lv.shape.size(), 0), lv.shape, dtype_size(lv.dtype));
    out.push_back(std::move(t));
  }
  return out;
}

HostTensor Executable::gather(std::size_t output, const std::vector<HostTensor>& shards, bool check) const {
  if (output >= program_.outputs.size())
    throw RuntimeError(fmt::format("gather: output #{} does not exist ({} outputs)", output, program_.outputs.size()));
  const LocalValue& lv = program_.values[program_.outputs[output]];
  if (static_cast<int64_t>(shards.size()) != mesh_.num_devices())
    throw RuntimeError(fmt::format("gather: {} shards for {} devices", shards.size(), mesh_.num_devices()));
  for (int64_t d = 0; d < mesh_.num_devices(); ++d)
    if (shards[d].dtype() != lv.dtype || shards[d].shape() != lv.shape)
      throw RuntimeError(fmt::format("gather: output #{} %{} with sharding {} expects local shards {} "
                                     "but device {} gave {}", output, lv.name, lv.sharding.to_string(),
                                     type_str(lv.dtype, lv.shape), d, type_str(shards[d].dtype(), shards[d].shape())));
  HostTensor g(lv.dtype, lv.global_shape);
  g.poison();
  std::vector<bool> done(static_cast<std::size_t>(mesh_.num_devices()), false);
  std::map<std::vector<int64_t>, int64_t> first;
  for (int64_t d = 0; d < mesh_.num_devices(); ++d) {
    auto off = lv.sharding.local_offset(mesh_, lv.global_shape, d);
    auto it = first.find(off);
    if (it == first.end()) {
      first[off] = d;
      copy_block(shards[d].data(), lv.shape, std::vector<int64_t>(lv.shape.size(), 0), g.data(),
                 lv.global_shape, off, lv.shape, dtype_size(lv.dtype));
    } else if (check) {
      const HostTensor& a = shards[it->second];
      const HostTensor& b = shards[d];
      if (a.bytes() != b.bytes() || std::memcmp(a.data(), b.data(), a.bytes()) != 0)
        throw RuntimeError(fmt::format("gather: output %{} has replicas that disagree: devices {} and {} "
                                       "hold the same block {} but different data",
                                       lv.name, it->second, d, shape_str(off)));
    }
  }
  return g;
}

std::vector<HostTensor> Executable::run(const std::vector<HostTensor>& inputs, const RunOptions& opts) {
  if (inputs.size() != graph_.inputs.size())
    throw RuntimeError(fmt::format("run: the graph has {} inputs but {} tensors were given",
                                   graph_.inputs.size(), inputs.size()));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Value& v = graph_.values[graph_.inputs[i]];
    if (inputs[i].dtype() != v.dtype || inputs[i].shape() != v.shape)
      throw RuntimeError(fmt::format("run: input #{} %{} expects {} but got {}", i, v.name,
                                     type_str(v.dtype, v.shape), type_str(inputs[i].dtype(), inputs[i].shape())));
  }
  const int64_t n = mesh_.num_devices();
  // Replicated inputs are read in place; sharded ones are scattered.
  std::vector<std::vector<HostTensor>> scattered(inputs.size());
  std::vector<std::vector<const HostTensor*>> per(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const LocalValue& lv = program_.values[program_.inputs[i]];
    if (lv.shape == lv.global_shape) {
      per[i].assign(static_cast<std::size_t>(n), &inputs[i]);
    } else {
      scattered[i] = scatter(i, inputs[i]);
      for (const auto& t : scattered[i]) per[i].push_back(&t);
    }
  }
  auto outs = run_devices(per, opts);
  std::vector<HostTensor> result;
  for (std::size_t o = 0; o < outs.size(); ++o) {
    const LocalValue& lv = program_.values[program_.outputs[o]];
    if (lv.shape == lv.global_shape && !opts.check_replicas && !opts.poison) result.push_back(std::move(outs[o][0]));
    else result.push_back(gather(o, outs[o], opts.check_replicas));
  }
  return result;
}

std::vector<std::vector<HostTensor>> Executable::run_sharded(const std::vector<std::vector<HostTensor>>& shards,
                                                             const RunOptions& opts) {
  if (shards.size() != graph_.inputs.size())
    throw RuntimeError(fmt::format("run_sharded: the graph has {} inputs but {} were given",
                                   graph_.inputs.size(), shards.size()));
  std::vector<std::vector<const HostTensor*>> per(shards.size());
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const LocalValue& lv = program_.values[program_.inputs[i]];
    if (static_cast<int64_t>(shards[i].size()) != mesh_.num_devices())
      throw RuntimeError(fmt::format("run_sharded: input #{} %{} has {} shards but the mesh {} has {} devices",
                                     i, lv.name, shards[i].size(), mesh_.to_string(), mesh_.num_devices()));
    for (const auto& t : shards[i]) {
      if (t.dtype() != lv.dtype || t.shape() != lv.shape)
        throw RuntimeError(fmt::format("run_sharded: input #{} %{} with sharding {} expects local shards {} "
                                       "but got {}", i, lv.name, lv.sharding.to_string(),
                                       type_str(lv.dtype, lv.shape), type_str(t.dtype(), t.shape())));
      per[i].push_back(&t);
    }
  }
  return run_devices(per, opts);
}

std::vector<std::vector<HostTensor>> Executable::run_devices(
    const std::vector<std::vector<const HostTensor*>>& in, const RunOptions& opts) {
  const int64_t n = mesh_.num_devices();
  ThreadWorldOptions wo;
  wo.timeout_seconds = opts.collective_timeout_s;
  ThreadWorld world(mesh_, wo);
  std::string trace_path = opts.trace_path;
  if (trace_path.empty())
    if (const char* e = std::getenv("TESSEL_TRACE")) trace_path = e;
  Trace trace;
  DeviceRunOptions dopts;
  dopts.poison = opts.poison;
  dopts.kernel_threads = opts.kernel_threads;
  dopts.trace = trace_path.empty() ? nullptr : &trace;
  std::vector<DeviceRunResult> results(static_cast<std::size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<bool> root_cause(static_cast<std::size_t>(n), false);
  auto device_main = [&](int64_t d) {
    try {
      auto backend = make_cpu_backend(opts.kernel_threads);
      std::vector<const HostTensor*> mine;
      for (const auto& v : in) mine.push_back(v[static_cast<std::size_t>(d)]);
      CommunicatorFactory factory = [&](const std::vector<std::string>& axes) {
        return world.communicator(d, axes);
      };
      results[d] = execute_device(program_, last_use_, d, *backend, factory, mine, dopts);
    } catch (const std::exception& e) {
      errors[d] = std::current_exception();
      if (!world.aborted()) {
        root_cause[d] = true;
        world.abort(fmt::format("device {} failed: {}", d, e.what()));
      }
    } catch (...) {
      errors[d] = std::current_exception();
      if (!world.aborted()) {
        root_cause[d] = true;
        world.abort(fmt::format("device {} failed with an unknown exception", d));
      }
    }
  };
  auto t0 = std::chrono::steady_clock::now();
  if (n == 1) {
    device_main(0);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(n));
    for (int64_t d = 0; d < n; ++d) threads.emplace_back(device_main, d);
    for (auto& t : threads) t.join();
  }
  stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!trace_path.empty()) trace.write(trace_path);
  // Report the device that failed first (the others only saw the abort).
  for (int64_t d = 0; d < n; ++d)
    if (errors[d] && root_cause[d]) {
      try {
        std::rethrow_exception(errors[d]);
      } catch (const Error& e) {
        throw RuntimeError(e.what());
      } catch (const std::exception& e) {
        throw RuntimeError(fmt::format("device {} failed: {}", d, e.what()));
      }
    }
  for (int64_t d = 0; d < n; ++d)
    if (errors[d]) std::rethrow_exception(errors[d]);
  stats_.peak_bytes.assign(static_cast<std::size_t>(n), 0);
  std::vector<std::vector<HostTensor>> outs(program_.outputs.size());
  for (int64_t d = 0; d < n; ++d) {
    stats_.peak_bytes[d] = results[d].peak_bytes;
    for (std::size_t o = 0; o < outs.size(); ++o) outs[o].push_back(std::move(results[d].outputs[o]));
  }
  return outs;
}

}  // namespace tessel
