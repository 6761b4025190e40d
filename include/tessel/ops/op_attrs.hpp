// tessel/ops/op_attrs.hpp — the attributes an op may carry, part of the op registry (ops.hpp).
//
// OpAttrs is one plain struct with a field per attribute kind; which fields an op uses, under
// which text-form key, and whether they are required is the op's attribute schema
// (OpDef::attrs). The schema drives parsing, printing and validation of the text forms of
// graphs and programs: a new op that reuses these fields touches neither.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/core/sharding.hpp"

namespace tessel {

struct OpAttrs {
  std::string equation;          // Einsum; FusedElementwise / FusedSoftmax: the expression;
                                 // Attention*: the layout ("bhsd" or "bshd")
  std::string epilogue;          // FusedEinsum: the elementwise expression applied to the product
  std::vector<int64_t> dims;     // Reduce*: reduced dims; Transpose: permutation
  Shape shape;                   // Reshape / Broadcast / Constant target shape
  std::vector<int64_t> starts;   // Slice
  std::vector<int64_t> limits;   // Slice
  int64_t axis = -1;             // Concat / Softmax / Gather / ScatterAdd (normalized to >= 0)
  int64_t depth = 0;             // OneHot: number of classes
  double scalar = 0.0;           // Constant; Attention*: the scores' scale
  double eps = 1e-5;             // LayerNorm, AdamW
  double beta1 = 0.9;            // AdamW: first-moment decay
  double beta2 = 0.999;          // AdamW: second-moment decay
  double weight_decay = 0.0;     // AdamW: decoupled weight decay
  bool keepdims = false;         // Reduce*
  bool causal = false;           // Attention*: mask keys after each query
  std::optional<Sharding> sharding;  // ShardingConstraint
  int priority = 0;                  // ShardingConstraint
  DType dtype = DType::f32;          // Constant / Input / Cast / OneHot: result dtype
};

// The fields of OpAttrs an attribute schema can name. Each has one text syntax:
//   Equation "bsd,df->bsf" · Epilogue "gelu(add($0,$1))" · Ints / Shape [1,2] · Int / Depth 3 · Float 1e-5 ·
//   Bool (Keepdims, Causal) true ·
//   DType bf16
enum class AttrField { Equation, Dims, Shape, Starts, Limits, Axis, Depth, Scalar, Eps, Keepdims, DType, Beta1, Beta2,
                       WeightDecay, Epilogue, Causal };

struct AttrSpec {
  const char* key;          // text-form name, e.g. "perm" for Transpose's dims
  AttrField field;
  bool required = true;     // the text form must give it
  bool always_print = true; // printed even when equal to the default
};

}  // namespace tessel
