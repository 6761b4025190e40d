# passes: combine-collectives
# %br's operand depends on %ar's result (through %c and %b): they may not be combined, so %br
# opens a new group; %cr is independent of %br and joins it. The first group stays a single,
# unchanged all-reduce.
mesh model=2
%x = input f32[4,8] global=f32[4,16] sharding=[{}, {model}]
%a = reduce_sum(%x) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%ar = all_reduce(%a) axes={model} bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%c = sub(%x, %ar) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%b = reduce_sum(%c) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%br = all_reduce(%b) axes={model} bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%e = exp(%x) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%f = reduce_sum(%e) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%cr = all_reduce(%f) axes={model} bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%y = add(%br, %cr) : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
output %y
