// src/runtime/tensor.cpp — HostTensor element access and the bf16/f16 <-> f32 conversions.
//
// The conversions are bit-exact, round to nearest even, keep NaN a (quiet) NaN and handle
// f16 subnormals, so a value survives f32 -> bf16/f16 -> f32 -> bf16/f16 unchanged.
#include "tessel/runtime/tensor.hpp"

#include "tessel/runtime/block_copy.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <new>

namespace tessel {

HostTensor::HostTensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  const std::size_t bytes = static_cast<std::size_t>(num_elements(shape_)) * dtype_size(dtype_);
  const auto fail = [&] {
    return OutOfMemoryError(fmt::format("host memory: cannot allocate a host tensor {} ({} bytes, {:.4g} GiB)",
                                        type_str(dtype_, shape_), bytes, static_cast<double>(bytes) / (1u << 30)),
                            bytes);
  };
  // Beyond a 47-bit address space no allocation can succeed: refuse it without asking the
  // allocator (sanitizer allocators abort on such sizes instead of throwing), as the CPU
  // backend does.
  if (bytes > (std::size_t{1} << 47)) throw fail();
  try {
    data_.resize(bytes);
  } catch (const std::bad_alloc&) {
    throw fail();
  }
}

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

float bf16_to_f32(uint16_t v) { return bits_float(static_cast<uint32_t>(v) << 16); }

uint16_t f32_to_bf16(float v) {
  uint32_t u = float_bits(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncate and force the quiet bit so the payload cannot round to infinity.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x8000u) << 16;
  const uint32_t exp = (v >> 10) & 0x1fu;
  const uint32_t mant = v & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in f32.
    float mag = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -mag : mag;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float v) {
  // After F. Giesen's float_to_half_fast3_rtne: exact round-to-nearest-even, including
  // subnormal results (which use the FPU's own rounding through a magic addend).
  const uint32_t f32_infty = 255u << 23;
  const uint32_t f16_max = (127u + 16u) << 23;  // 2^16: everything >= rounds to inf
  const uint32_t denorm_magic_u = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u = float_bits(v);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t o;
  if (u >= f16_max) {
    o = (u > f32_infty) ? 0x7e00 : 0x7c00;  // NaN -> quiet NaN, overflow -> inf
  } else if (u < (113u << 23)) {
    // Result is a subnormal or zero: let the FPU round by adding a magic number.
    float f = bits_float(u) + bits_float(denorm_magic_u);
    o = static_cast<uint16_t>(float_bits(f) - denorm_magic_u);
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;  // rebias exponent, round
    u += mant_odd;
    o = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

void HostTensor::poison() {
  const int64_t n = numel();
  switch (dtype_) {
    case DType::f32: {
      float* p = as<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = std::numeric_limits<float>::quiet_NaN();
      break;
    }
    case DType::bf16:
    case DType::f16: {
      const uint16_t nan = dtype_ == DType::bf16 ? 0x7fc0 : 0x7e00;
      uint16_t* p = as<uint16_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = nan;
      break;
    }
    case DType::i32: {
      int32_t* p = as<int32_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = std::numeric_limits<int32_t>::min();
      break;
    }
  }
}

double HostTensor::get(int64_t i) const {
  if (i < 0 || i >= numel())
    throw RuntimeError("HostTensor::get: index " + std::to_string(i) + " out of range for " +
                       type_str(dtype_, shape_));
  switch (dtype_) {
    case DType::f32: return as<float>()[i];
    case DType::bf16: return bf16_to_f32(as<uint16_t>()[i]);
    case DType::f16: return f16_to_f32(as<uint16_t>()[i]);
    case DType::i32: return as<int32_t>()[i];
  }
  return 0.0;
}

void HostTensor::set(int64_t i, double v) {
  if (i < 0 || i >= numel())
    throw RuntimeError("HostTensor::set: index " + std::to_string(i) + " out of range for " +
                       type_str(dtype_, shape_));
  switch (dtype_) {
    case DType::f32: as<float>()[i] = static_cast<float>(v); break;
    case DType::bf16: as<uint16_t>()[i] = f32_to_bf16(static_cast<float>(v)); break;
    case DType::f16: as<uint16_t>()[i] = f32_to_f16(static_cast<float>(v)); break;
    case DType::i32: {
      // Truncate toward zero like a C++ cast, but saturate (and map NaN to INT32_MIN, the
      // poison value) instead of invoking undefined behaviour.
      int32_t r = std::numeric_limits<int32_t>::min();
      if (v >= 2147483647.0) r = std::numeric_limits<int32_t>::max();
      else if (v > -2147483648.0) r = static_cast<int32_t>(v);
      as<int32_t>()[i] = r;
      break;
    }
  }
}

HostTensor pad_host(const HostTensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  if (t.shape().size() != shape.size())
    throw RuntimeError("pad_host: cannot pad " + type_str(t.dtype(), t.shape()) + " to " + shape_str(shape));
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (t.shape()[d] > shape[d])
      throw RuntimeError("pad_host: cannot pad " + type_str(t.dtype(), t.shape()) + " to " + shape_str(shape));
  HostTensor out(t.dtype(), shape);  // zero-filled
  if (t.numel() > 0)
    copy_block(t.data(), t.shape(), std::vector<int64_t>(shape.size(), 0), out.data(), shape,
               std::vector<int64_t>(shape.size(), 0), t.shape(), dtype_size(t.dtype()));
  return out;
}

HostTensor trim_host(const HostTensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  bool inside = t.shape().size() == shape.size();
  for (std::size_t d = 0; inside && d < shape.size(); ++d) inside = shape[d] >= 0 && shape[d] <= t.shape()[d];
  if (!inside) throw RuntimeError("trim_host: cannot trim " + type_str(t.dtype(), t.shape()) + " to " + shape_str(shape));
  HostTensor out(t.dtype(), shape);
  if (out.numel() > 0)
    copy_block(t.data(), t.shape(), std::vector<int64_t>(shape.size(), 0), out.data(), shape,
               std::vector<int64_t>(shape.size(), 0), shape, dtype_size(t.dtype()));
  return out;
}

}  // namespace tessel
