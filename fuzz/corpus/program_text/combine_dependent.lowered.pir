mesh model=2
%x = input f32[4,8] global=f32[4,16] sharding=[{}, {model}]
%a = reduce_sum(%x) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%ar = all_reduce(%a) axes={model} bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%c = sub(%x, %ar) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%b = reduce_sum(%c) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%e = exp(%x) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%f = reduce_sum(%e) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%b.flat = view(%b) offset=0 : f32[4] global=f32[4] sharding=[{}] @compute
%f.flat = view(%f) offset=0 : f32[4] global=f32[4] sharding=[{}] @compute
%combined.in = concat(%b.flat, %f.flat) axis=0 : f32[8] global=f32[8] sharding=[{}] @compute
%combined.out = all_reduce(%combined.in) axes={model} bytes=32 : f32[8] global=f32[8] sharding=[{}] @compute
%br = view(%combined.out) offset=0 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%cr = view(%combined.out) offset=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%y = add(%br, %cr) : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
output %y
