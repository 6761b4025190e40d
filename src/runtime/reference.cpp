// src/runtime/reference.cpp — the unpartitioned reference executor and seeded test inputs.
//
// The oracle is deliberately simple: global shapes, ops in graph order, the same kernels as
// the partitioned executor (so any difference is a partitioning bug), intermediates freed
// after their last use so that big graphs fit in memory.
#include "tessel/runtime/reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>

#include "tessel/ops/registry.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"

namespace tessel {

std::vector<HostTensor> run_reference(const Graph& g, const std::vector<HostTensor>& inputs,
                                      int num_threads) {
  if (inputs.size() != g.inputs.size())
    throw RuntimeError("run_reference: the graph has " + std::to_string(g.inputs.size()) +
                       " inputs but " + std::to_string(inputs.size()) +
                       " tensors were given (pass them in graph input order)");
  const std::size_t nv = g.values.size();
  // Each value is either borrowed (a caller's input) or owned (computed here).
  std::vector<const HostTensor*> ptr(nv, nullptr);
  std::vector<std::optional<HostTensor>> owned(nv);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const int v = g.inputs[i];
    const Value& val = g.values.at(static_cast<std::size_t>(v));
    const HostTensor& t = inputs[i];
    if (t.dtype() != val.dtype || t.shape() != val.shape)
      throw RuntimeError("run_reference: input #" + std::to_string(i) + " " + g.describe(v) +
                         " expects " + type_str(val.dtype, val.shape) + " but got " +
                         type_str(t.dtype(), t.shape()));
    ptr[v] = &t;
  }

  // Last op that reads each value; graph outputs are never freed.
  std::vector<int> last_use(nv, -1);
  for (std::size_t i = 0; i < g.ops.size(); ++i)
    for (int v : g.ops[i].inputs) last_use[v] = static_cast<int>(i);
  std::vector<bool> is_output(nv, false);
  for (int v : g.outputs) is_output[v] = true;

  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.kind == OpKind::Input) {
      if (!ptr[op.output])
        throw RuntimeError("run_reference: " + g.describe(op.output) +
                           " is an input op but not listed in graph.inputs");
      continue;
    }
    const Value& ov = g.values[op.output];
    KernelArgs args;
    args.kind = op.kind;
    args.attrs = &op.attrs;
    for (int v : op.inputs) {
      const HostTensor* t = ptr[v];
      if (!t)
        throw RuntimeError("run_reference: " + g.describe_op(static_cast<int>(i)) + " reads " +
                           g.describe(v) + " before it is computed");
      args.in.push_back(t->data());
      args.in_shapes.push_back(t->shape());
      args.in_dtypes.push_back(t->dtype());
    }
    owned[op.output].emplace(ov.dtype, ov.shape);
    HostTensor& out = *owned[op.output];
    args.out = out.data();
    args.out_shape = ov.shape;
    args.out_dtype = ov.dtype;
    for (int e : op.extra_outputs) {
      const Value& ev = g.values[static_cast<std::size_t>(e)];
      owned[static_cast<std::size_t>(e)].emplace(ev.dtype, ev.shape);
      args.extra_out.push_back(owned[static_cast<std::size_t>(e)]->data());
      args.extra_out_shapes.push_back(ev.shape);
      args.extra_out_dtypes.push_back(ev.dtype);
    }
    args.num_threads = num_threads;
    try {
      run_cpu_kernel(args);
    } catch (const RuntimeError& e) {
      throw RuntimeError("run_reference: " + g.describe_op(static_cast<int>(i)) + ": " + e.what());
    }
    ptr[op.output] = &out;
    for (int e : op.extra_outputs) ptr[static_cast<std::size_t>(e)] = &*owned[static_cast<std::size_t>(e)];
    for (int v : op.inputs)
      if (last_use[v] == static_cast<int>(i) && !is_output[v] && owned[v]) {
        owned[v].reset();
        ptr[v] = nullptr;
      }
    // A result nobody reads and nobody asked for is dropped at once.
    for (int r : op.results())
      if (last_use[static_cast<std::size_t>(r)] < 0 && !is_output[static_cast<std::size_t>(r)]) {
        owned[static_cast<std::size_t>(r)].reset();
        ptr[static_cast<std::size_t>(r)] = nullptr;
      }
  }

  std::vector<HostTensor> result;
  result.reserve(g.outputs.size());
  for (int v : g.outputs) {
    if (!ptr[v]) throw RuntimeError("run_reference: output " + g.describe(v) + " was not computed");
    result.push_back(*ptr[v]);
  }
  return result;
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool passes_values_through(OpKind k) {
  return k == OpKind::Reshape || k == OpKind::Transpose || k == OpKind::Slice ||
         k == OpKind::Broadcast || k == OpKind::Concat || k == OpKind::ShardingConstraint;
}

// Exclusive upper bound for the integers of value v given how it is used (0: no constraint).
int64_t int_bound(const Graph& g, const std::vector<std::vector<int>>& users, int v, int depth) {
  int64_t bound = 0;
  auto tighten = [&](int64_t b) {
    if (b > 0) bound = bound == 0 ? b : std::min(bound, b);
  };
  if (depth > 64) return 0;
  for (int u : users[v]) {
    const Op& op = g.ops[u];
    if (const IndexBoundFn ib = op_def(op.kind).index_bound) {
      std::vector<Shape> shapes;
      for (int x : op.inputs) shapes.push_back(g.values[x].shape);
      for (std::size_t i = 0; i < op.inputs.size(); ++i)
        if (op.inputs[i] == v) tighten(ib(op.attrs, shapes, static_cast<int>(i)));
    } else if (passes_values_through(op.kind)) {
      tighten(int_bound(g, users, op.output, depth + 1));
    }
  }
  return bound;
}

}  // namespace

std::vector<HostTensor> random_inputs(const Graph& g, uint64_t seed) {
  const auto users = g.users();
  std::vector<HostTensor> out;
  out.reserve(g.inputs.size());
  for (std::size_t i = 0; i < g.inputs.size(); ++i) {
    const Value& val = g.values.at(static_cast<std::size_t>(g.inputs[i]));
    HostTensor t = [&] {
      try {
        return HostTensor(val.dtype, val.shape);
      } catch (const OutOfMemoryError& e) {
        throw OutOfMemoryError(fmt::format("random_inputs: input %{}: {}", val.name, e.what()), e.bytes());
      }
    }();
    std::mt19937_64 rng(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i) + 1)));
    const int64_t n = t.numel();
    switch (val.dtype) {
      case DType::f32: {
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        float* p = t.as<float>();
        for (int64_t j = 0; j < n; ++j) p[j] = dist(rng);
        break;
      }
      case DType::bf16:
      case DType::f16: {
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        for (int64_t j = 0; j < n; ++j) t.set(j, dist(rng));
        break;
      }
      case DType::i32: {
        int64_t hi = int_bound(g, users, g.inputs[i], 0);
        if (hi <= 0) hi = 8;
        std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(hi - 1));
        int32_t* p = t.as<int32_t>();
        for (int64_t j = 0; j < n; ++j) p[j] = dist(rng);
        break;
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace tessel
