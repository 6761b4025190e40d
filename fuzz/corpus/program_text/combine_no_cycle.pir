# passes: combine-collectives
# Two kinds interleaved: %bm (max) depends on %as (sum), %ds (sum) on %cm (max). %bm and %cm
# combine; %ds may then not join %as, since {%bm, %cm} would both follow %as and precede %ds
# (a cycle): the reachability kept between groups sees the path %as -> %bm ~ %cm -> %ds.
mesh model=2
%x = input f32[4,8] global=f32[4,16] sharding=[{}, {model}]
%a = reduce_sum(%x) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%as = all_reduce(%a) axes={model} bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%s = sub(%x, %as) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%b = reduce_max(%s) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%bm = all_reduce(%b) axes={model} op=max bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%c = reduce_max(%x) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%cm = all_reduce(%c) axes={model} op=max bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%t = sub(%x, %cm) : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%d = reduce_sum(%t) dims=[1] keepdims=true : f32[4,1] global=f32[4,1] sharding=[{}, {}] partial{model} @compute
%ds = all_reduce(%d) axes={model} bytes=16 : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
%y = add(%bm, %ds) : f32[4,1] global=f32[4,1] sharding=[{}, {}] @compute
output %y
