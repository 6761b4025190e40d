mesh model=2
%x = input f32[4,8] global=f32[4,16] sharding=[{}, {model}]
%lab = input f32[4,8] global=f32[4,16] sharding=[{}, {model}]
%e = exp(%x) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%s = reduce_sum(%e) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%t = mul(%x, %lab) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%l = reduce_sum(%t) dims=[1] : f32[4] global=f32[4] sharding=[{}] partial{model} @compute
%g = reduce_sum(%t) dims=[0,1] : f32[] global=f32[] sharding=[] partial{model} @compute
%s.flat = view(%s) offset=0 : f32[4] global=f32[4] sharding=[{}] @compute
%g.flat = view(%g) offset=0 : f32[1] global=f32[1] sharding=[{}] @compute
%combined.in = concat(%s.flat, %l, %g.flat) axis=0 : f32[9] global=f32[9] sharding=[{}] @compute
%combined.out = all_reduce(%combined.in) axes={model} bytes=36 : f32[9] global=f32[9] sharding=[{}] @compute
%sr = view(%combined.out) offset=0 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%la = log(%sr) : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%gr = view(%combined.out) offset=32 : f32[] global=f32[] sharding=[] @compute
%y = neg(%gr) : f32[] global=f32[] sharding=[] @compute
%lr.unpacked = view(%combined.out) offset=16 : f32[4] global=f32[4] sharding=[{}] @compute
%lr = copy(%lr.unpacked) block=[4] copies=[[0]->[0]] : f32[4] global=f32[4] sharding=[{}] @compute
output %la, %lr, %y
