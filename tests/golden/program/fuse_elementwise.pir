# passes: pack, combine-collectives, fuse-elementwise, async-collectives, memory-plan
# The partitioned transformer block of tests/golden/transformer_block_2d.tsl lowered by the default
# pipeline: the attention's scale + causal mask + softmax become one fused_softmax kernel, the
# MLP's first einsum takes its bias + GELU as an epilogue (one fused_einsum), and bias + residual
# (after the MLP's all-reduce) become one fused_elementwise kernel.
mesh data=2, model=4
%x = input f32[4,64,256] global=f32[8,64,256] sharding=[{data}, {}, {}]
%ln1_g = input f32[256] global=f32[256] sharding=[{}]
%ln1_b = input f32[256] global=f32[256] sharding=[{}]
%wq = input f32[256,2,32] global=f32[256,8,32] sharding=[{}, {model}, {}]
%wk = input f32[256,2,32] global=f32[256,8,32] sharding=[{}, {model}, {}]
%wv = input f32[256,2,32] global=f32[256,8,32] sharding=[{}, {model}, {}]
%wo = input f32[2,32,256] global=f32[8,32,256] sharding=[{model}, {}, {}]
%ln2_g = input f32[256] global=f32[256] sharding=[{}]
%ln2_b = input f32[256] global=f32[256] sharding=[{}]
%w1 = input f32[256,256] global=f32[256,1024] sharding=[{}, {model}]
%b1 = input f32[256] global=f32[1024] sharding=[{model}]
%w2 = input f32[256,256] global=f32[1024,256] sharding=[{model}, {}]
%b2 = input f32[256] global=f32[256] sharding=[{}]
%h = layer_norm(%x, %ln1_g, %ln1_b) eps=1e-05 : f32[4,64,256] global=f32[8,64,256] sharding=[{data}, {}, {}] @compute
%q = einsum(%h, %wq) eq="bsd,dhk->bshk" : f32[4,64,2,32] global=f32[8,64,8,32] sharding=[{data}, {}, {model}, {}] @compute
%k = einsum(%h, %wk) eq="bsd,dhk->bshk" : f32[4,64,2,32] global=f32[8,64,8,32] sharding=[{data}, {}, {model}, {}] @compute
%v = einsum(%h, %wv) eq="bsd,dhk->bshk" : f32[4,64,2,32] global=f32[8,64,8,32] sharding=[{data}, {}, {model}, {}] @compute
%s = einsum(%q, %k) eq="bqhk,bshk->bhqs" : f32[4,2,64,64] global=f32[8,8,64,64] sharding=[{data}, {model}, {}, {}] @compute
%scale = constant() value=0.17677669529663687 : f32[] global=f32[] sharding=[] @compute
%ss = mul(%s, %scale) : f32[4,2,64,64] global=f32[8,8,64,64] sharding=[{data}, {model}, {}, {}] @compute
%m = causal_mask(%ss) : f32[4,2,64,64] global=f32[8,8,64,64] sharding=[{data}, {model}, {}, {}] @compute
%p = softmax(%m) axis=3 : f32[4,2,64,64] global=f32[8,8,64,64] sharding=[{data}, {model}, {}, {}] @compute
%o = einsum(%p, %v) eq="bhqs,bshk->bqhk" : f32[4,64,2,32] global=f32[8,64,8,32] sharding=[{data}, {}, {model}, {}] @compute
%attn = einsum(%o, %wo) eq="bqhk,hkd->bqd" : f32[4,64,256] global=f32[8,64,256] sharding=[{data}, {}, {}] partial{model} @compute
%attn.1 = all_reduce(%attn) axes={model} bytes=262144 : f32[4,64,256] global=f32[8,64,256] sharding=[{data}, {}, {}] @compute
%x1 = add(%x, %attn.1) : f32[4,64,256] global=f32[8,64,256] sharding=[{data}, {}, {}] @compute
%h2 = layer_norm(%x1, %ln2_g, %ln2_b) eps=1e-05 : f32[4,64,256] global=f32[8,64,256] sharding=[{data}, {}, {}] @compute
%u = einsum(%h2, %w1) eq="bsd,df->bsf" : f32[4,64,256] global=f32[8,64,1024] sharding=[{data}, {}, {model}] @compute
%ub = add(%u, %b1) : f32[4,64,256] global=f32[8,64,1024] sharding=[{data}, {}, {model}] @compute
%a = gelu(%ub) : f32[4,64,256] global=f32[8,64,1024] sharding=[{data}, {}, {model}] @compute
%d = einsum(%a, %w2) eq="bsf,fd->bsd" : f32[4,64,256] global=f32[8,64,256] sharding=[{data}, {}, {}] partial{model} @compute
%d.1 = all_reduce(%d) axes={model} bytes=262144 : f32[4,64,256] global=f32[8,64,256] sharding=[{data}, {}, {}] @compute
%db = add(%d.1, %b2) : f32[4,64,256] global=f32[8,64,256] sharding=[{data}, {}, {}] @compute
%y = add(%x1, %db) : f32[4,64,256] global=f32[8,64,256] sharding=[{data}, {}, {}] @compute
output %y
