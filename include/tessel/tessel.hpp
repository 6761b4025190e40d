// tessel/tessel.hpp — umbrella header: the compiler core and the CPU runtime.
#pragma once

#include "tessel/common.hpp"
#include "tessel/cost.hpp"
#include "tessel/executable.hpp"
#include "tessel/graph.hpp"
#include "tessel/mesh.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/ops.hpp"
#include "tessel/partition.hpp"
#include "tessel/program.hpp"
#include "tessel/propagate.hpp"
#include "tessel/reshard.hpp"
#include "tessel/sharding.hpp"
#include "tessel/text.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/tensor.hpp"
