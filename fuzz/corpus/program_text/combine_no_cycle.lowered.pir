mesh model=2
%x = input f32[4,8] global=f32[4,16] sharding=[{}, {model}]
%a = reduce_sum(%x) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%as = all_reduce(%a) axes={model} bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%s = sub(%x, %as) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%b = reduce_max(%s) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%c = reduce_max(%x) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%b.flat = view(%b) offset=0 : f32[4] global=f32[4] sharding=[{}] @compute
%c.flat = view(%c) offset=0 : f32[4] global=f32[4] sharding=[{}] @compute
%combined.in = concat(%b.flat, %c.flat) axis=0 : f32[8] global=f32[8] sharding=[{}] @compute
%combined.out = all_reduce(%combined.in) axes={model} op=max bytes=32 : f32[8] global=f32[8] sharding=[{}] @compute
%cm = view(%combined.out) offset=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%t = sub(%x, %cm) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%d = reduce_sum(%t) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%ds = all_reduce(%d) axes={model} bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%bm = view(%combined.out) offset=0 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%y = add(%bm, %ds) : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
output %y
