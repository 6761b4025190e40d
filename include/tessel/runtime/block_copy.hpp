// tessel/runtime/block_copy.hpp — N-d strided block copies between dense row-major buffers:
// the one primitive behind scatter/gather of shards, local shard slices and the packing of
// a tensor dim into the rank-major blocks collectives exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessel/core/common.hpp"

namespace tessel {

// Copies a block of shape `block` from src (shape src_shape, block starting at src_off) to
// dst (shape dst_shape, block starting at dst_off). Elements are `elem` bytes.
void copy_block(const void* src, const Shape& src_shape, const std::vector<int64_t>& src_off,
                void* dst, const Shape& dst_shape, const std::vector<int64_t>& dst_off,
                const Shape& block, std::size_t elem);

}  // namespace tessel
