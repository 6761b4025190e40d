// tessel/compiler/visualize.hpp — where a tensor lives: the mesh drawn as a grid with, in each
// device's cell, the block of the global value that device holds (JAX's
// visualize_array_sharding, as text). tessel-explain FILE --show VALUE prints it.
//
//   %h f32[8,16,512] sharding [{data}, {}, {model}] on mesh {data=2, model=4}
//             model=0             model=1               ...
//   data=0    #0 [0:4, :, 0:128]  #1 [0:4, :, 128:256]  ...
//   data=1    #4 [4:8, :, 0:128]  #5 [4:8, :, 128:256]  ...
//
// Layout of the grid: a 1-D mesh is one row; a 2-D mesh has one row per coordinate of the
// first axis and one column per coordinate of the second; higher-D meshes keep the first
// axis as rows and flatten the trailing axes into columns (row-major, the last axis fastest,
// labelled e.g. `y=0,z=1`). A cell is `#<device id> [<range per dim>]`: `a:b` is the
// half-open range of the dim the device holds, `:` a dim it holds whole (not split). A
// partial value (an unreduced sum over some axes) marks each cell with `+` and says over
// which axes the blocks are summed. Blocks of a padded (uneven) sharding are clipped to the
// global shape.
//
// Thread safety: pure function of its arguments.
#pragma once

#include <string>
#include <string_view>

#include "tessel/core/common.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"

namespace tessel {

// The grid above, ending in a newline. `name` (e.g. "%h"), when given, heads the first line.
// Throws ShardingError when the sharding does not fit the mesh or the shape (validate()).
std::string show_sharding(const Mesh& mesh, const Shape& global, const Sharding& sharding,
                          std::string_view name = {}, DType dtype = DType::f32);

}  // namespace tessel
