# passes: async-collectives
# Each collective starts on comm after the compute work before it; its done sits just before
# the first reader, so the independent kernel in between overlaps it.
mesh model=2
%x = input f32[4,8] global=f32[4,8] sharding=[{}, {}]
%w = input f32[8,8] global=f32[8,16] sharding=[{}, {model}]
%h = einsum(%x, %w) eq="bd,df->bf" : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%p = einsum(%h, %x) eq="bf,bd->fd" : f32[8,8] global=f32[16,8] sharding=[{model}, {}] @compute
%g = all_gather(%h) axes={model} dim=1 bytes=256 : f32[4,16] global=f32[4,16] sharding=[{}, {}] @compute
%e = exp(%x) : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%y = tanh(%g) : f32[4,16] global=f32[4,16] sharding=[{}, {}] @compute
%q = all_gather(%p) axes={model} dim=0 bytes=512 : f32[16,8] global=f32[16,8] sharding=[{}, {}] @compute
output %y, %e, %q
