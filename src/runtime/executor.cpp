// Device executor: kernels, local shard slices and collectives of one device's program.
#include "tessel/runtime/executor.hpp"

#include <fmt/format.h>

#include <cstring>
#include <map>

#include "tessel/ops.hpp"
#include "tessel/runtime/block_copy.hpp"

namespace tessel {
namespace {

// Product of the dims before `d`: 1 means the dim is "leading" and its blocks are
// contiguous, so no packing is needed.
int64_t outer(const Shape& s, int d) {
  int64_t n = 1;
  for (int i = 0; i < d; ++i) n *= s[i];
  return n;
}

std::vector<int64_t> offset_at(std::size_t rank, int dim, int64_t at) {
  std::vector<int64_t> off(rank, 0);
  if (dim >= 0 && static_cast<std::size_t>(dim) < rank) off[static_cast<std::size_t>(dim)] = at;
  return off;
}

ReduceOp reduce_op() { return ReduceOp::Sum; }

struct DeviceExecutor {
  const Program& p;
  const std::vector<int>& last_use;
  int64_t pos;
  Backend& be;
  const CommunicatorFactory& factory;
  const DeviceRunOptions& opts;
  std::unique_ptr<Stream> stream;
  std::vector<std::unique_ptr<Buffer>> buf;
  std::map<std::vector<std::string>, std::unique_ptr<Communicator>> comms;
  int64_t live = 0, peak = 0;

  Communicator& comm(const std::vector<std::string>& axes) {
    auto it = comms.find(axes);
    if (it != comms.end()) return *it->second;
    auto c = factory(axes);
    Communicator& ref = *c;
    comms.emplace(axes, std::move(c));
    return ref;
  }

  std::unique_ptr<Buffer> scratch(std::size_t bytes) {
    live += static_cast<int64_t>(bytes);
    peak = std::max(peak, live);
    return be.allocate(bytes);
  }
  void release_scratch(std::unique_ptr<Buffer>& b) {
    live -= static_cast<int64_t>(b->bytes());
    b.reset();
  }

  Buffer& alloc(int v) {
    const LocalValue& lv = p.values[v];
    std::size_t bytes = static_cast<std::size_t>(lv.bytes());
    buf[v] = be.allocate(bytes);
    live += static_cast<int64_t>(bytes);
    peak = std::max(peak, live);
    if (opts.poison) be.poison(*buf[v], lv.dtype, *stream);
    return *buf[v];
  }
  void free_value(int v) {
    if (!buf[v]) return;
    live -= static_cast<int64_t>(buf[v]->bytes());
    buf[v].reset();
  }

  void kernel(const Instr& in) {
    const LocalValue& o = p.values[in.out];
    KernelArgs a;
    a.kind = in.op;
    a.attrs = &in.attrs;
    const bool needs_offsets = op_def(in.op).needs_offsets;
    for (int v : in.in) {
      const LocalValue& lv = p.values[v];
      a.in.push_back(buf[v]->data());
      a.in_shapes.push_back(lv.shape);
      a.in_dtypes.push_back(lv.dtype);
      if (needs_offsets) {
        a.in_offsets.push_back(lv.sharding.local_offset(p.mesh, lv.global_shape, pos));
        a.in_global_shapes.push_back(lv.global_shape);
      } else {
        a.in_offsets.emplace_back();
      }
    }
    if (needs_offsets) {
      a.out_offset = o.sharding.local_offset(p.mesh, o.global_shape, pos);
      a.out_global_shape = o.global_shape;
    }
    Buffer& out = alloc(in.out);
    a.out = out.data();
    a.out_shape = o.shape;
    a.out_dtype = o.dtype;
    a.num_threads = opts.kernel_threads;
    be.run_kernel(a, *stream);
  }

  void shard_slice(const Instr& in) {
    const LocalValue& src = p.values[in.in[0]];
    const LocalValue& dst = p.values[in.out];
    Buffer& out = alloc(in.out);
    int64_t idx = in.axes.empty() ? 0 : p.mesh.index_in_group(pos, in.axes);
    int64_t at = idx == 0 ? 0 : idx * dst.shape[static_cast<std::size_t>(in.dim)];
    copy_block(buf[in.in[0]]->data(), src.shape, offset_at(src.shape.size(), in.dim, at),
               out.data(), dst.shape, std::vector<int64_t>(dst.shape.size(), 0), dst.shape,
               dtype_size(dst.dtype));
  }

  void collective(const Instr& in) {
    const LocalValue& src = p.values[in.in[0]];
    const LocalValue& dst = p.values[in.out];
    const void* sp = buf[in.in[0]]->data();
    Buffer& out = alloc(in.out);
    std::size_t elem = dtype_size(dst.dtype);
    switch (in.collective) {
      case CollectiveKind::AllReduce: {
        comm(in.axes).all_reduce(sp, out.data(), static_cast<std::size_t>(num_elements(dst.shape)),
                                 dst.dtype, reduce_op());
        break;
      }
      case CollectiveKind::AllGather: {
        Communicator& c = comm(in.axes);
        std::size_t blk = static_cast<std::size_t>(src.bytes());
        if (outer(src.shape, in.dim) == 1) {
          c.all_gather(sp, out.data(), blk);
        } else {
          auto tmp = scratch(blk * static_cast<std::size_t>(c.size()));
          c.all_gather(sp, tmp->data(), blk);
          for (int r = 0; r < c.size(); ++r)
            copy_block(static_cast<const std::byte*>(tmp->data()) + r * blk, src.shape,
                       std::vector<int64_t>(src.shape.size(), 0), out.data(), dst.shape,
                       offset_at(dst.shape.size(), in.dim, r * src.shape[in.dim]), src.shape, elem);
          release_scratch(tmp);
        }
        break;
      }
      case CollectiveKind::ReduceScatter: {
        Communicator& c = comm(in.axes);
        std::size_t count = static_cast<std::size_t>(num_elements(dst.shape));
        if (outer(src.shape, in.dim) == 1) {
          c.reduce_scatter(sp, out.data(), count, dst.dtype, reduce_op());
        } else {
          std::size_t blk = static_cast<std::size_t>(dst.bytes());
          auto tmp = scratch(blk * static_cast<std::size_t>(c.size()));
          for (int r = 0; r < c.size(); ++r)
            copy_block(sp, src.shape, offset_at(src.shape.size(), in.dim, r * dst.shape[in.dim]),
                       static_cast<std::byte*>(tmp->data()) + r * blk, dst.shape,
                       std::vector<int64_t>(dst.shape.size(), 0), dst.shape, elem);
          c.reduce_scatter(tmp->data(), out.data(), count, dst.dtype, reduce_op());
          release_scratch(tmp);
        }
        break;
      }
      case CollectiveKind::AllToAll: {
        Communicator& c = comm(in.axes);
        int n = c.size();
        int split = in.dim, cat = in.dim2;
        Shape block = src.shape;
        block[split] /= n;
        std::size_t blk = static_cast<std::size_t>(num_elements(block)) * elem;
        const void* send = sp;
        std::unique_ptr<Buffer> packed, recv;
        if (outer(src.shape, split) != 1) {
          packed = scratch(blk * n);
          for (int r = 0; r < n; ++r)
            copy_block(sp, src.shape, offset_at(src.shape.size(), split, r * block[split]),
                       static_cast<std::byte*>(packed->data()) + r * blk, block,
                       std::vector<int64_t>(block.size(), 0), block, elem);
          send = packed->data();
        }
        if (outer(dst.shape, cat) == 1) {
          c.all_to_all(send, out.data(), blk);
        } else {
          recv = scratch(blk * n);
          c.all_to_all(send, recv->data(), blk);
          for (int r = 0; r < n; ++r)
            copy_block(static_cast<const std::byte*>(recv->data()) + r * blk, block,
                       std::vector<int64_t>(block.size(), 0), out.data(), dst.shape,
                       offset_at(dst.shape.size(), cat, r * block[cat]), block, elem);
          release_scratch(recv);
        }
        if (packed) release_scratch(packed);
        break;
      }
      case CollectiveKind::CollectivePermute: {
        std::vector<std::string> all;
        for (const auto& a : p.mesh.axes()) all.push_back(a.name);
        int send_to = -1, recv_from = -1;
        for (const auto& pr : in.pairs) {
          if (pr.first == pos) send_to = static_cast<int>(pr.second);
          if (pr.second == pos) recv_from = static_cast<int>(pr.first);
        }
        std::size_t bytes = static_cast<std::size_t>(dst.bytes());
        if (recv_from < 0) std::memcpy(out.data(), sp, bytes);  // my block does not move
        comm(all).collective_permute(sp, send_to, out.data(), recv_from, bytes);
        break;
      }
    }
  }

  DeviceRunResult run(const std::vector<const HostTensor*>& inputs) {
    stream = be.create_stream();
    buf.resize(p.values.size());
    for (std::size_t i = 0; i < p.inputs.size(); ++i) {
      int v = p.inputs[i];
      // Inputs are read in place when the device can read host memory; they count towards
      // the device's peak bytes either way.
      if (auto view = be.wrap_host(inputs[i]->data(), inputs[i]->bytes())) {
        buf[v] = std::move(view);
        live += static_cast<int64_t>(inputs[i]->bytes());
        peak = std::max(peak, live);
      } else {
        Buffer& b = alloc(v);
        be.copy_from_host(b, inputs[i]->data(), inputs[i]->bytes(), *stream);
      }
    }
    for (std::size_t i = 0; i < p.instrs.size(); ++i) {
      const Instr& in = p.instrs[i];
      double t0 = opts.trace ? opts.trace->now_us() : 0;
      try {
        switch (in.kind) {
          case InstrKind::Kernel: kernel(in); break;
          case InstrKind::ShardSlice: shard_slice(in); break;
          case InstrKind::Collective: collective(in); break;
        }
      } catch (const RuntimeError& e) {
        throw RuntimeError(fmt::format("device {} instruction #{} (%{} = {}): {}", pos, i,
                                       p.values[in.out].name, instr_name(in), e.what()));
      }
      if (opts.trace) trace_event(in, t0);
      for (int v : in.in)
        if (last_use[v] == static_cast<int>(i)) free_value(v);
      // A value nobody reads (and that is not an output) is freed at once.
      if (last_use[in.out] < 0) free_value(in.out);
    }
    DeviceRunResult res;
    for (int v : p.outputs) {
      const LocalValue& lv = p.values[v];
      HostTensor t(lv.dtype, lv.shape);
      be.copy_to_host(t.data(), *buf[v], t.bytes(), *stream);
      res.outputs.push_back(std::move(t));
    }
    stream->synchronize();
    res.peak_bytes = peak;
    return res;
  }

  std::string instr_name(const Instr& in) const {
    if (in.kind == InstrKind::Kernel) return op_name(in.op);
    if (in.kind == InstrKind::ShardSlice) return "shard_slice";
    return collective_name(in.collective);
  }

  void trace_event(const Instr& in, double t0) {
    TraceEvent e;
    e.name = instr_name(in);
    e.category = in.kind == InstrKind::Kernel ? "kernel" : in.kind == InstrKind::ShardSlice ? "slice" : "collective";
    e.device = pos;
    e.start_us = t0;
    e.dur_us = opts.trace->now_us() - t0;
    const LocalValue& o = p.values[in.out];
    e.args = fmt::format("\"value\": \"%{}\", \"shape\": \"{}\", \"sharding\": \"{}\"", o.name,
                         type_str(o.dtype, o.shape), o.sharding.to_string());
    if (in.kind == InstrKind::Collective)
      e.args += fmt::format(", \"bytes\": {}, \"axes\": \"{}\"", in.bytes, join(in.axes, ","));
    if (in.kind == InstrKind::Kernel) e.args += fmt::format(", \"flops\": {}", in.flops);
    opts.trace->add(std::move(e));
  }
};

}  // namespace

DeviceRunResult execute_device(const Program& program, const std::vector<int>& last_use,
                               int64_t position, Backend& backend, const CommunicatorFactory& comms,
                               const std::vector<const HostTensor*>& inputs,
                               const DeviceRunOptions& opts) {
  DeviceExecutor ex{program, last_use, position, backend, comms, opts, nullptr, {}, {}, 0, 0};
  return ex.run(inputs);
}

}  // namespace tessel
