mesh model=2
%x = input f32[4,8] global=f32[4,8] sharding=[{}, {}]
%p = input f32[4] global=f32[4] sharding=[{}]
%q = exp(%p) : f32[4] global=f32[4] sharding=[{}] @compute
%combined.in = concat(%p, %q) axis=0 : f32[8] global=f32[8] sharding=[{}] @compute
%combined.out = all_reduce(%combined.in) axes={model} bytes=32 : f32[8] global=f32[8] sharding=[{}] @compute
%r = tanh(%p) : f32[4] global=f32[4] sharding=[{}] @compute
%big = all_reduce(%x) axes={model} bytes=128 : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%combined.in.1 = concat(%r, %p) axis=0 : f32[8] global=f32[8] sharding=[{}] @compute
%combined.out.1 = all_reduce(%combined.in.1) axes={model} bytes=32 : f32[8] global=f32[8] sharding=[{}] @compute
%a = view(%combined.out) offset=0 : f32[4] global=f32[4] sharding=[{}] @compute
%b = view(%combined.out) offset=16 : f32[4] global=f32[4] sharding=[{}] @compute
%s1 = add(%a, %b) : f32[4] global=f32[4] sharding=[{}] @compute
%c = view(%combined.out.1) offset=0 : f32[4] global=f32[4] sharding=[{}] @compute
%d = view(%combined.out.1) offset=16 : f32[4] global=f32[4] sharding=[{}] @compute
%s2 = add(%c, %d) : f32[4] global=f32[4] sharding=[{}] @compute
%s = add(%s1, %s2) : f32[4] global=f32[4] sharding=[{}] @compute
output %s, %big
