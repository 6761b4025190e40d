// src/checkpoint/box.hpp — copying an n-d box between row-major buffers: the blocks of a
// checkpoint's shards and inner chunks, cut from and pasted into global tensors.
#pragma once

#include <cstring>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel::zarr {

// Copies the box `box` from src (shape src_shape, at src_at) to dst (at dst_at), row-major.
inline void copy_box(const char* src, const Shape& src_shape, const std::vector<int64_t>& src_at, char* dst,
              const Shape& dst_shape, const std::vector<int64_t>& dst_at, const Shape& box, std::size_t elem) {
  const std::size_t r = box.size();
  if (r == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  for (int64_t b : box)
    if (b <= 0) return;
  const auto sst = contiguous_strides(src_shape);
  const auto dst_st = contiguous_strides(dst_shape);
  std::vector<int64_t> i(r, 0);
  const std::size_t run = static_cast<std::size_t>(box[r - 1]) * elem;
  while (true) {
    int64_t so = 0, d_o = 0;
    for (std::size_t d = 0; d < r; ++d) {
      so += (src_at[d] + i[d]) * sst[d];
      d_o += (dst_at[d] + i[d]) * dst_st[d];
    }
    std::memcpy(dst + static_cast<std::size_t>(d_o) * elem, src + static_cast<std::size_t>(so) * elem, run);
    // The next row: dims r-2 .. 0 as an odometer (the last dim is the contiguous run).
    int d = static_cast<int>(r) - 2;
    for (; d >= 0; --d) {
      if (++i[static_cast<std::size_t>(d)] < box[static_cast<std::size_t>(d)]) break;
      i[static_cast<std::size_t>(d)] = 0;
    }
    if (d < 0) return;
  }
}

// The box [start, start + shape) of `t`, as its own tensor.
inline HostTensor slice_host(const HostTensor& t, const std::vector<int64_t>& start, const Shape& shape) {
  HostTensor out(t.dtype(), shape);
  copy_box(static_cast<const char*>(t.data()), t.shape(), start, static_cast<char*>(out.data()), shape,
           std::vector<int64_t>(shape.size(), 0), shape, dtype_size(t.dtype()));
  return out;
}

}  // namespace tessel::zarr
