# passes: collective-matmul(on bi), pack, fuse-elementwise, async-collectives
# The same MLP with bidirectional rings, lowered to start/done: compute waits for each received chunk before the next permutes start, and they start before the step's einsums; the reduce-scatter ring's adds stay kernels of their own (not einsum epilogues).
mesh model=4
%x = input f32[2,6] global=f32[8,6] sharding=[{model}, {}]
%w1 = input f32[6,2] global=f32[6,8] sharding=[{}, {model}]
%w2 = input f32[2,6] global=f32[8,6] sharding=[{model}, {}]
%x.1 = all_gather(%x) axes={model} dim=0 bytes=192 : f32[8,6] global=f32[8,6] sharding=[{}, {}] @compute
%u = einsum(%x.1, %w1) eq="td,df->tf" : f32[8,2] global=f32[8,8] sharding=[{}, {model}] @compute
%a = gelu(%u) : f32[8,2] global=f32[8,8] sharding=[{}, {model}] @compute
%y = einsum(%a, %w2) eq="tf,fd->td" : f32[8,6] global=f32[8,6] sharding=[{}, {}] partial{model} @compute
%y.1 = reduce_scatter(%y) axes={model} dim=0 bytes=192 : f32[2,6] global=f32[8,6] sharding=[{model}, {}] @compute
output %y.1
