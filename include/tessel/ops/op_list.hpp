// tessel/ops/op_list.hpp — the list of op kinds, part of the op registry (ops.hpp).
//
// The enum tessel::OpKind (graph.hpp) is generated from this list, so adding an op touches
// the registry only: a line here, its entry and builder in src/ops/, its attribute fields in
// op_attrs.hpp if it needs new ones, its builder declaration in builders.hpp, and one kernel
// per backend. docs/adding-an-op.md walks through one example.
//
// X(Kind) — the order is the enum order; Input stays first and is never a kernel.
#pragma once

#define TESSEL_OP_KINDS(X)                                                                   \
  X(Input)              /* a graph input: bound by the runtime, never computed          */   \
  X(Constant)           /* scalar attrs.scalar broadcast to attrs.shape                  */   \
  X(Einsum)             /* attrs.equation, one or two operands                           */   \
  X(Neg) X(Exp) X(Log) X(Tanh) X(Gelu) X(Relu) X(Sqrt) X(Rsqrt) /* unary elementwise     */   \
  X(Add) X(Sub) X(Mul) X(Div) X(Max) /* binary elementwise, numpy broadcasting           */   \
  X(ReduceSum) X(ReduceMax) X(ReduceMean) /* over attrs.dims, attrs.keepdims             */   \
  X(Reshape)            /* to attrs.shape                                                */   \
  X(Transpose)          /* result dim i = operand dim attrs.dims[i]                      */   \
  X(Broadcast)          /* numpy broadcast_to(attrs.shape)                               */   \
  X(Slice)              /* [attrs.starts, attrs.limits) per dim                          */   \
  X(Concat)             /* along attrs.axis                                              */   \
  X(Softmax)            /* along attrs.axis                                              */   \
  X(LayerNorm)          /* (x, gamma, beta) over the last dim, attrs.eps                 */   \
  X(Embedding)          /* (table [V, D], ids i32 [...]) -> [..., D]                     */   \
  X(CrossEntropy)       /* (logits [..., V], labels i32 [...]) -> f32 [...]              */   \
  X(CausalMask)         /* x [..., Q, K]: -inf where k > q (global positions)            */   \
  X(ShardingConstraint) /* identity whose result has attrs.sharding                      */   \
  X(Sigmoid) X(Silu)    /* unary float: 1/(1+e^-x), x/(1+e^-x)                           */   \
  X(Cast)               /* to attrs.dtype (float->i32: truncate, saturate, NaN -> 0)     */   \
  X(Eq) X(Ne) X(Lt) X(Le) X(Gt) X(Ge) /* comparisons with broadcasting: i32 1 or 0     */   \
  X(Where)              /* (cond i32, a, b): a where cond != 0, else b; broadcasting     */   \
  X(OneHot)             /* ids i32 [...] -> [..., attrs.depth] of attrs.dtype            */   \
  X(Gather)             /* (table, indices i32) along attrs.axis (numpy take)            */   \
  X(ScatterAdd)         /* (updates, indices i32) summed into attrs.depth rows at axis   */   \
  X(MaskPadding)        /* x with positions >= attrs.depth along attrs.axis := scalar     */   \
  X(WriteAt)            /* (dst, indices i32, values): dst with one row per index written */   \
  X(SampleTokens)       /* (logits, keys, temperature, top_k, top_p) -> i32 token per row */   \
  X(LayerNormGrad)      /* (x, gamma, dy) -> (dx, dgamma, dbeta): layer_norm's backward  */   \
  X(AdamW)              /* (p, g, m, v, lr, bc1, bc2, gscale) -> (p', m', v'): fused step */   \
  X(GeluGrad)           /* (x, g) -> g * gelu'(x): gelu's backward, fused; broadcasting  */   \
  X(SoftmaxGrad)        /* (y, dy) -> y (dy - sum(dy y, axis)): softmax's backward, fused */   \
  X(CrossEntropyGrad)   /* (logits, labels, g) -> (softmax - one_hot) g: fused backward   */   \
  X(FusedElementwise)   /* operands -> attrs.equation's elementwise expression (fused_expr) */ \
  X(FusedSoftmax)       /* softmax along attrs.axis of attrs.equation's expression        */ \
  X(FusedEinsum)        /* einsum attrs.equation, then attrs.epilogue over the product    */ \
  X(Attention)          /* (q, k, v) -> (out, lse): softmax(scale q k^T, causal) v, tiled */ \
  X(AttentionGrad)      /* (q, k, v, out, lse, dout) -> (dq, dk, dv): flash backward     */

// The elementwise families, one list each: the kernel tables (CPU and CUDA), the fusion code
// (fused_expr.cpp, the CPU fused kernel) and the CUDA backend's op codes are generated from
// them; each op's math stays one function per backend (cpu_elementwise.hpp,
// src/runtime/cuda/kernels/elementwise_math.cuh), whose switches warn on a missing op. Names as in
// TESSEL_OP_KINDS. docs/adding-an-op.md.
#define TESSEL_UNARY_OPS(X) X(Neg) X(Exp) X(Log) X(Tanh) X(Gelu) X(Relu) X(Sqrt) X(Rsqrt) X(Sigmoid) X(Silu)
#define TESSEL_BINARY_OPS(X) X(Add) X(Sub) X(Mul) X(Div) X(Max) X(GeluGrad)
#define TESSEL_COMPARE_OPS(X) X(Eq) X(Ne) X(Lt) X(Le) X(Gt) X(Ge)
