# passes: combine-collectives
# Two independent sum all-reduces over {model} (a cross-entropy's sum of exponentials and its
# label logit) become one: flat views of the operands, one concat, one all-reduce of 48
# bytes, and a view per result just before its first reader. %la reads the first result, so
# it moves after the combined all-reduce; %e does not, so it stays where it was. %lr is an
# output: it gets a view and a copy (an output is a buffer of its own, never a view).
mesh model=2
%x = input f32[4,8] global=f32[4,16] sharding=[{}, {model}]
%lab = input f32[4,8] global=f32[4,16] sharding=[{}, {model}]
%e = exp(%x) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%s = reduce_sum(%e) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%sr = all_reduce(%s) axes={model} bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%la = log(%sr) : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%t = mul(%x, %lab) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%l = reduce_sum(%t) dims=[1] keepdims=false : f32[4] global=f32[4] sharding=[{}] partial{model} @compute
%g = reduce_sum(%t) dims=[0,1] keepdims=false : f32[] global=f32[] sharding=[] partial{model} @compute
%lr = all_reduce(%l) axes={model} bytes=16 : f32[4] global=f32[4] sharding=[{}] @compute
%gr = all_reduce(%g) axes={model} bytes=4 : f32[] global=f32[] sharding=[] @compute
%y = neg(%gr) : f32[] global=f32[] sharding=[] @compute
output %la, %lr, %y
