// make_cpu_virtual_world: the virtual-device protocol (src/runtime/virtual_world.hpp) on CPU
// streams. Its device operations are tasks of the member's CPU stream: memcpy between the
// members' buffers, the thread communicator's member-order reduction (thread_reduce.hpp: f32
// accumulation for bf16 and f16, rounded once, as the CUDA reduction kernel), and scratch
// freed when the stream reaches the free.
#include <cstring>
#include <memory>

#include "../virtual_world.hpp"
#include "cpu_stream.hpp"
#include "tessel/runtime/cpu/thread_communicator.hpp"
#include "thread_reduce.hpp"

namespace tessel {
namespace {

class CpuVirtualOps final : public detail::VirtualDeviceOps {
 public:
  std::string name() const override { return "cpu virtual communicator"; }
  // CPU events hold no device: any CPU backend makes them.
  std::unique_ptr<Event> create_event(Stream& s) override {
    detail::cpu_stream(s, "cpu virtual communicator");
    return events_->create_event();
  }
  void copy(void* dst, const void* src, std::size_t bytes, Stream& s) override {
    detail::cpu_stream(s, "cpu virtual communicator").enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }
  void reduce(const std::vector<const void*>& srcs, void* dst, DType dtype, ReduceOp op, std::size_t count,
              Stream& s) override {
    detail::cpu_stream(s, "cpu virtual communicator").enqueue([srcs, dst, dtype, op, count] {
      detail::reduce(dst, srcs.data(), static_cast<int>(srcs.size()), count, dtype, op);
    });
  }
  void* scratch(std::size_t bytes, Stream& s) override {
    detail::cpu_stream(s, "cpu virtual communicator");
    return ::operator new(bytes);
  }
  void free_scratch(void* p, Stream& s) override {
    // `always`: freed even when an earlier task of the stream failed.
    detail::cpu_stream(s, "cpu virtual communicator").enqueue([p] { ::operator delete(p); }, /*always=*/true);
  }

 private:
  std::unique_ptr<Backend> events_ = make_cpu_backend({StreamMode::Async, 1});
};

}  // namespace

std::unique_ptr<CollectiveWorld> make_cpu_virtual_world(const Mesh& mesh, double timeout_seconds) {
  return detail::make_virtual_world(mesh, timeout_seconds, std::make_shared<CpuVirtualOps>());
}

}  // namespace tessel
