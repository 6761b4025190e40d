// tests/integration/hiding_backend.hpp — a CPU backend behind a wrapper (for
// ThreadRuntimeOptions::make_backend): it can report some kernels missing, as a GPU backend
// that lacks them would, and call a hook before each kernel, so a test can hold a run.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "tessel/runtime/backend.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/kernels.hpp"

namespace tessel_test {
using namespace tessel;

// The CPU backend with the kernels of `hidden` reported missing (and refused).
class HidingBackend : public tessel::Backend {
 public:
  explicit HidingBackend(std::set<OpKind> hidden) : inner_(make_cpu_backend()), hidden_(std::move(hidden)) {}
  std::string name() const override { return "cpu-hiding"; }
  std::unique_ptr<Buffer> allocate(std::size_t bytes) override { return inner_->allocate(bytes); }
  tessel::MemoryMeter& device_memory() override { return inner_->device_memory(); }
  tessel::MemoryMeter& host_memory() override { return inner_->host_memory(); }
  void release(std::shared_ptr<Buffer> b, Stream& s) override { inner_->release(std::move(b), s); }
  void copy_from_host(Buffer& dst, const void* src, std::size_t bytes, Stream& s) override {
    inner_->copy_from_host(dst, src, bytes, s);
  }
  void copy_to_host(void* dst, const Buffer& src, std::size_t bytes, Stream& s) override {
    inner_->copy_to_host(dst, src, bytes, s);
  }
  void copy(Buffer& dst, std::size_t dst_off, const Buffer& src, std::size_t src_off, std::size_t bytes,
            Stream& s) override {
    inner_->copy(dst, dst_off, src, src_off, bytes, s);
  }
  void copy_block(Buffer& dst, const Buffer& src, const BlockCopy& c, Stream& s) override {
    inner_->copy_block(dst, src, c, s);
  }
  void poison(Buffer& b, DType dtype, Stream& s) override { inner_->poison(b, dtype, s); }
  void run_kernel(const KernelArgs& args, Stream& s) override {
    if (!has_kernel(args.kind)) throw RuntimeError(std::string("cpu-hiding: no kernel for ") + op_name(args.kind));
    ++kernels_run;
    if (before_kernel) before_kernel(args);
    inner_->run_kernel(args, s);
  }
  void prepare_kernel(const KernelArgs& args) override { inner_->prepare_kernel(args); }
  bool has_kernel(OpKind kind) const override { return hidden_.count(kind) == 0; }
  void launch_host_func(Stream& s, std::function<void()> fn) override { inner_->launch_host_func(s, std::move(fn)); }
  std::unique_ptr<Stream> create_stream(const std::string& name) override { return inner_->create_stream(name); }
  std::unique_ptr<Event> create_event() override { return inner_->create_event(); }

  std::atomic<int64_t> kernels_run{0};
  // Called before each kernel is handed on (set before the backend is used): a test can
  // hold a run at a known point.
  std::function<void(const KernelArgs&)> before_kernel;

 private:
  std::unique_ptr<Backend> inner_;
  std::set<OpKind> hidden_;
};

}  // namespace tessel_test
