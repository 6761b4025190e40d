// tessel/ops/builders.hpp — the builder functions of the graph (ggml style), part of the op
// registry: each is defined beside its op's entry in src/ops/. Every builder checks shapes
// and dtypes at once (ShapeError naming the op, operands and shapes) and records the op.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tessel/ir/graph.hpp"

namespace tessel {

// ---- builder: free functions, ggml style ---------------------------------------------
Tensor input(Graph& g, std::string name, DType dtype, Shape shape);
// Scalar (or filled) constant; broadcasts against any shape in binary ops.
Tensor constant(Graph& g, double value, DType dtype = DType::f32, Shape shape = {});
Tensor einsum(std::string_view equation, Tensor a, Tensor b);
Tensor einsum(std::string_view equation, Tensor a);
Tensor matmul(Tensor a, Tensor b);  // [..., m, k] x [k, n]

Tensor neg(Tensor x);
Tensor exp(Tensor x);
Tensor log(Tensor x);
Tensor tanh(Tensor x);
Tensor gelu(Tensor x);  // tanh approximation (GPT-2)
Tensor relu(Tensor x);
Tensor sqrt(Tensor x);
Tensor rsqrt(Tensor x);
Tensor sigmoid(Tensor x);  // 1 / (1 + exp(-x))
Tensor silu(Tensor x);     // x * sigmoid(x) (SiLU / swish)
// g * gelu'(x), gelu's backward in one pass (the vjp of gelu uses it); float, broadcasting.
Tensor gelu_grad(Tensor x, Tensor g);

// Converts to `dtype`. Float -> i32 truncates toward zero, saturates at the i32 range and
// maps NaN to 0; i32 -> float rounds to nearest; between floats rounds to nearest even.
Tensor cast(Tensor x, DType dtype);
// Comparisons with numpy broadcasting; operands of one dtype; the result is i32 1 (true) or
// 0 (false). NaN compares unequal to everything (ne is 1, the others 0).
Tensor eq(Tensor a, Tensor b);
Tensor ne(Tensor a, Tensor b);
Tensor lt(Tensor a, Tensor b);
Tensor le(Tensor a, Tensor b);
Tensor gt(Tensor a, Tensor b);
Tensor ge(Tensor a, Tensor b);
// a where cond != 0, else b (cond i32; a and b of one dtype; the three broadcast).
Tensor where(Tensor cond, Tensor a, Tensor b);
// Elementwise ops over `operands` evaluated in one pass (tessel/ir/fused_expr.hpp gives the
// expression text, e.g. "gelu(add($0,$1))"); what the fuse-elementwise pass makes of a chain.
Tensor fused_elementwise(const std::vector<Tensor>& operands, const std::string& expr);
// softmax(expr(operands), axis) in one pass: the expression may end in causal_mask (the
// attention's scale + mask + softmax), e.g. fused_softmax({s}, "causal_mask(mul($0,0.125:f32[]))", -1).
Tensor fused_softmax(const std::vector<Tensor>& operands, const std::string& expr, int64_t axis);
// An einsum with an epilogue (what the fuse-elementwise pass makes of an einsum and the
// elementwise chain that alone reads it): epilogue(einsum(equation, operands[0..n))), where n
// is the equation's operand count, `$0` in the epilogue is the product and `$k` operand n-1+k,
// e.g. fused_einsum("bsd,df->bsf", {x, w1, b1}, "gelu(add($0,$1))"). The epilogue must keep
// the product's shape and dtype. Its summed letters are never sharded (no partial product
// goes through the epilogue).
Tensor fused_einsum(const std::string& equation, const std::vector<Tensor>& operands, const std::string& epilogue);

Tensor add(Tensor a, Tensor b);
Tensor sub(Tensor a, Tensor b);
Tensor mul(Tensor a, Tensor b);
Tensor div(Tensor a, Tensor b);
Tensor maximum(Tensor a, Tensor b);
Tensor add(Tensor a, double b);
Tensor mul(Tensor a, double b);
Tensor operator+(Tensor a, Tensor b);
Tensor operator-(Tensor a, Tensor b);
Tensor operator*(Tensor a, Tensor b);
Tensor operator/(Tensor a, Tensor b);
Tensor operator*(Tensor a, double b);
Tensor operator+(Tensor a, double b);

Tensor reduce_sum(Tensor x, std::vector<int64_t> dims, bool keepdims = false);
Tensor reduce_max(Tensor x, std::vector<int64_t> dims, bool keepdims = false);
Tensor reduce_mean(Tensor x, std::vector<int64_t> dims, bool keepdims = false);
Tensor reshape(Tensor x, Shape shape);
Tensor transpose(Tensor x, std::vector<int64_t> perm);
Tensor broadcast_to(Tensor x, Shape shape);
Tensor slice(Tensor x, std::vector<int64_t> starts, std::vector<int64_t> limits);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
Tensor softmax(Tensor x, int64_t axis = -1);
// softmax's backward from its result y and the result's gradient dy (same type):
// y * (dy - sum(dy * y, axis, keepdims)), one pass per row (computed in f32).
Tensor softmax_grad(Tensor y, Tensor dy, int64_t axis = -1);
Tensor layer_norm(Tensor x, Tensor gamma, Tensor beta, double eps = 1e-5);
// The backward of layer_norm(x, gamma, beta, eps) for the gradient dy of its result: one op
// with three results (dx like x; dgamma and dbeta, [features], summed over every row).
struct LayerNormGrads {
  Tensor dx, dgamma, dbeta;
};
LayerNormGrads layer_norm_grad(Tensor x, Tensor gamma, Tensor dy, double eps = 1e-5);
// One fused AdamW step (train.hpp builds it): with gs = g * gscale,
//   m' = beta1 m + (1 - beta1) gs,  v' = beta2 v + (1 - beta2) gs^2,
//   p' = p - lr ((m' bc1) / (sqrt(v' bc2) + eps) + weight_decay p)
// p and g float of one shape, m and v f32 of that shape, lr, bc1, bc2 and gscale f32
// scalars (bc1 = 1/(1 - beta1^t), bc2 = 1/(1 - beta2^t)). Computes in f32. `apply`, an
// optional f32 scalar: where it is 0 the results are p, m and v unchanged (a step skipped on
// the devices, TrainOptions::guard_non_finite), in the same single pass.
struct AdamWResults {
  Tensor param, m, v;
};
AdamWResults adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor lr, Tensor bc1, Tensor bc2, Tensor gscale,
                   double beta1, double beta2, double eps, double weight_decay, Tensor apply = {});
// Fused attention (docs/attention.md): out = softmax(scale q kᵀ, masked when `causal`) v, and
// lse = the row log-sum-exp of the (masked, scaled) scores, f32 [batch, heads, Sq], which the
// backward reads instead of the [Sq, Sk] probabilities. `layout` "bhsd": q [batch, heads, Sq,
// head_dim], k and v [batch, heads, Sk, head_dim]; "bshd": [batch, Sq, heads, head_dim] (the
// GPT projections' own layout: no head split or merge copies). `scale` 0 means 1/sqrt(head_dim).
// Causal masking is aligned to the end: query i sees keys j <= i + Sk - Sq (Sq <= Sk). Batch and
// heads shard freely; the sequences and head_dim stay whole on each device. The kernels never
// write the scores (FlashAttention's tiled online softmax). Differentiable (attention_grad).
struct AttentionResults {
  Tensor out, lse;
};
AttentionResults attention(Tensor q, Tensor k, Tensor v, bool causal = false, double scale = 0,
                           const std::string& layout = "bhsd");
// attention's backward (FlashAttention-2's): dq, dk, dv from the forward's operands, its
// results and dout, the scores recomputed tile by tile from q, k and lse.
struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_grad(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor dout, bool causal,
                              double scale, const std::string& layout = "bhsd");
Tensor embedding(Tensor table, Tensor ids);
Tensor cross_entropy(Tensor logits, Tensor labels);
// cross_entropy's backward: (softmax(logits) - one_hot(labels)) * g[..., None], with g the
// gradient of the per-row losses (f32, the labels' shape); the logits' type. One pass per row.
Tensor cross_entropy_grad(Tensor logits, Tensor labels, Tensor g);
Tensor causal_mask(Tensor x);
// [..., depth] with 1 at [..., ids[...]] and 0 elsewhere; an id outside [0, depth) gives an
// all-zero row (as JAX).
Tensor one_hot(Tensor ids, int64_t depth, DType dtype = DType::f32);
// numpy take: table.shape[:axis] + indices.shape + table.shape[axis+1:]; an index outside
// [0, table.shape[axis]) is an error when the program runs.
Tensor gather(Tensor table, Tensor indices, int64_t axis = 0);
// The adjoint of gather: a zero tensor updates.shape[:axis] + [depth] + (the dims after the
// indices' dims), to which every updates[..., j, ...] is added at row indices[j]. The
// gradient of embedding(table, ids) is scatter_add(grad, ids, rows, 0).
Tensor scatter_add(Tensor updates, Tensor indices, int64_t depth, int64_t axis = 0);
// dst with one position along `axis` written per leading index: out = dst, then
// out[i..., indices[i...], j...] = values[i..., j...], where indices has dst's dims before
// `axis` and values dst's dims without `axis`. A KV cache's update at each sequence's
// position (infer/generate.hpp's decode), or with axis 0 (no leading dims, a scalar index) a
// whole slot. `axis` may be split over devices (each writes the rows of its block); an index
// outside [0, dst.shape[axis]) is an error when the program runs. When dst's buffer is
// donated to the result, only the written rows are stored.
// One token per row of logits [..., V] (float), drawn on the devices: each row's
// keys (i32), temperature (f32), top_k (i32) and top_p (f32) are [...] (the logits' dims
// without the last). Temperature <= 0: the most likely token (the lowest id on a tie); else
// softmax(logits / temperature) cut to the tokens at or above the top_k-th largest logit (0:
// all) and then to the most likely ones whose probability reaches top_p (>= 1: all), drawn by
// the row's key. i32 [...]; a row without a finite logit gives V. docs/ir.md gives the exact
// rule; the vocabulary dim is never split (the partitioner gathers it).
Tensor sample_tokens(Tensor logits, Tensor keys, Tensor temperature, Tensor top_k, Tensor top_p);
Tensor write_at(Tensor dst, Tensor indices, Tensor values, int64_t axis = 1);
// x with every position whose index along `axis` is >= `valid` set to `value`: how padded
// (uneven) shardings keep padding out of reductions (uneven.hpp). Reads global positions.
Tensor mask_padding(Tensor x, int64_t axis, int64_t valid, double value);
// JAX's with_sharding_constraint: identity whose result must have `s`.
Tensor shard(Tensor x, Sharding s, int priority = 0);

}  // namespace tessel
