// The CPU backend: host buffers (not zero-filled: every buffer is written before it is
// read), the Eigen kernels, and eager streams/events.
#include <cstring>
#include <limits>
#include <new>

#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {
namespace {

class CpuBuffer final : public Buffer {
 public:
  explicit CpuBuffer(std::size_t bytes)
      : data_(static_cast<std::byte*>(::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(kBufferAlignment)))),
        bytes_(bytes) {}
  void* data() override { return data_.get(); }
  const void* data() const override { return data_.get(); }
  std::size_t bytes() const override { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t(kBufferAlignment)); }
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t bytes_;
};

// A non-owning view of caller memory (inputs are only read by kernels).
class HostView final : public Buffer {
 public:
  HostView(const void* p, std::size_t bytes) : p_(const_cast<void*>(p)), bytes_(bytes) {}
  void* data() override { return p_; }
  const void* data() const override { return p_; }
  std::size_t bytes() const override { return bytes_; }

 private:
  void* p_;
  std::size_t bytes_;
};

class CpuStream final : public Stream {
 public:
  void synchronize() override {}
};

class CpuEvent final : public Event {
 public:
  void record(Stream&) override {}
  void wait(Stream&) override {}
  void synchronize() override {}
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads < 1 ? 1 : threads) {}
  std::string name() const override { return "cpu"; }
  std::unique_ptr<Buffer> allocate(std::size_t bytes) override { return std::make_unique<CpuBuffer>(bytes); }
  std::unique_ptr<Buffer> wrap_host(const void* host, std::size_t bytes) override {
    return std::make_unique<HostView>(host, bytes);
  }
  void copy_from_host(Buffer& dst, const void* src, std::size_t bytes, Stream&) override {
    if (bytes) std::memcpy(dst.data(), src, bytes);
  }
  void copy_to_host(void* dst, const Buffer& src, std::size_t bytes, Stream&) override {
    if (bytes) std::memcpy(dst, src.data(), bytes);
  }
  void copy(Buffer& dst, std::size_t doff, const Buffer& src, std::size_t soff, std::size_t bytes, Stream&) override {
    if (bytes) std::memcpy(static_cast<std::byte*>(dst.data()) + doff,
                           static_cast<const std::byte*>(src.data()) + soff, bytes);
  }
  void poison(Buffer& b, DType dtype, Stream&) override {
    std::size_t n = b.bytes() / dtype_size(dtype);
    switch (dtype) {
      case DType::f32: {
        float* p = static_cast<float*>(b.data());
        for (std::size_t i = 0; i < n; ++i) p[i] = std::numeric_limits<float>::quiet_NaN();
        break;
      }
      case DType::i32: {
        int32_t* p = static_cast<int32_t*>(b.data());
        for (std::size_t i = 0; i < n; ++i) p[i] = std::numeric_limits<int32_t>::min();
        break;
      }
      default: {
        uint16_t* p = static_cast<uint16_t*>(b.data());
        uint16_t nan = dtype == DType::bf16 ? 0x7FC0 : 0x7E00;
        for (std::size_t i = 0; i < n; ++i) p[i] = nan;
      }
    }
  }
  void run_kernel(const KernelArgs& args, Stream&) override {
    if (args.num_threads == threads_) {
      run_cpu_kernel(args);
    } else {
      KernelArgs a = args;
      a.num_threads = threads_;
      run_cpu_kernel(a);
    }
  }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<CpuStream>(); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }

 private:
  int threads_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int kernel_threads) {
  return std::make_unique<CpuBackend>(kernel_threads);
}

}  // namespace tessel
