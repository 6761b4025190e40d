// N-d strided block copy: the innermost contiguous run is copied with memcpy.
#include "tessel/runtime/block_copy.hpp"

#include <cstring>

namespace tessel {

void copy_block(const void* src, const Shape& src_shape, const std::vector<int64_t>& src_off,
                void* dst, const Shape& dst_shape, const std::vector<int64_t>& dst_off,
                const Shape& block, std::size_t elem) {
  const int rank = static_cast<int>(block.size());
  if (num_elements(block) == 0) return;
  if (rank == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  // Merge the trailing dims that are contiguous in both buffers into one run.
  int inner = rank - 1;
  std::size_t run = static_cast<std::size_t>(block[inner]);
  while (inner > 0 && block[inner] == src_shape[inner] && block[inner] == dst_shape[inner]) {
    --inner;
    run *= static_cast<std::size_t>(block[inner]);
  }
  std::vector<int64_t> sstride(rank), dstride(rank);
  int64_t ss = 1, ds = 1;
  for (int d = rank - 1; d >= 0; --d) {
    sstride[d] = ss;
    dstride[d] = ds;
    ss *= src_shape[d];
    ds *= dst_shape[d];
  }
  const auto* s = static_cast<const unsigned char*>(src);
  auto* t = static_cast<unsigned char*>(dst);
  int64_t sbase = 0, dbase = 0;
  for (int d = 0; d < rank; ++d) {
    sbase += src_off[d] * sstride[d];
    dbase += dst_off[d] * dstride[d];
  }
  // Iterate over the outer index space [0, block[0..inner)).
  std::vector<int64_t> idx(static_cast<std::size_t>(inner), 0);
  const std::size_t bytes = run * elem;
  while (true) {
    int64_t so = sbase, dof = dbase;
    for (int d = 0; d < inner; ++d) {
      so += idx[d] * sstride[d];
      dof += idx[d] * dstride[d];
    }
    std::memcpy(t + static_cast<std::size_t>(dof) * elem, s + static_cast<std::size_t>(so) * elem, bytes);
    int d = inner - 1;
    while (d >= 0) {
      if (++idx[d] < block[d]) break;
      idx[d] = 0;
      --d;
    }
    if (d < 0) break;
  }
}

}  // namespace tessel
