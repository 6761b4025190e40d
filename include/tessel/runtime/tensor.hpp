// tessel/runtime/tensor.hpp — a dense row-major host tensor (global inputs/outputs and the
// CPU backend's buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "tessel/core/common.hpp"

namespace tessel {

// Every buffer tessel allocates is aligned to 64 bytes (a cache line, and the widest SIMD
// vector). This is not only for speed: vectorised kernels peel unaligned heads with scalar
// code, so equal inputs at different alignments could give results that differ in the last
// bit — and replicas of one value on different devices must agree bit for bit.
constexpr std::size_t kBufferAlignment = 64;

template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kBufferAlignment)));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(kBufferAlignment)); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const AlignedAllocator<U>&) const { return false; }
};

class HostTensor {
 public:
  HostTensor() = default;
  // Zero-filled. OutOfMemoryError naming the type and bytes when host memory runs out.
  HostTensor(DType dtype, Shape shape);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return num_elements(shape_); }
  std::size_t bytes() const { return data_.size(); }
  void* data() { return data_.data(); }
  const void* data() const { return data_.data(); }
  template <class T> T* as() { return reinterpret_cast<T*>(data_.data()); }
  template <class T> const T* as() const { return reinterpret_cast<const T*>(data_.data()); }

  // Fills every element with NaN (float types) or INT32_MIN (i32): an unwritten element is
  // then caught by comparisons.
  void poison();
  // Element i converted to double (any dtype).
  double get(int64_t i) const;
  void set(int64_t i, double v);

 private:
  DType dtype_ = DType::f32;
  Shape shape_;
  std::vector<std::byte, AlignedAllocator<std::byte>> data_;
};

// `t` padded with zeros at the end of each dim up to `shape` (every dim >= t's; same rank).
// Returns t itself when the shapes are equal. Throws RuntimeError otherwise.
HostTensor pad_host(const HostTensor& t, const Shape& shape);
// The leading `shape` block of `t` (every dim <= t's; same rank): an uneven layout's padding cut
// off. Returns t itself when the shapes are equal. Throws RuntimeError otherwise.
HostTensor trim_host(const HostTensor& t, const Shape& shape);

// bf16 / f16 <-> f32 conversions (round to nearest even).
float bf16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float v);
float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float v);

}  // namespace tessel
