mesh x=2, y=2
%f = input f32[4,8] global=f32[4,8] sharding=[{}, {}]
%i = input i32[4,8] global=i32[4,8] sharding=[{}, {}]
%b = all_reduce(%f) axes={y} bytes=128 : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%c = all_reduce(%f) axes={x} op=max bytes=128 : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%d = all_reduce(%i) axes={x} bytes=128 : i32[4,8] global=i32[4,8] sharding=[{}, {}] @compute
%f.flat = view(%f) offset=0 : f32[32] global=f32[32] sharding=[{}] @compute
%combined.in = concat(%f.flat, %f.flat) axis=0 : f32[64] global=f32[64] sharding=[{}] @compute
%combined.out = all_reduce(%combined.in) axes={x} bytes=256 : f32[64] global=f32[64] sharding=[{}] @compute
%a = view(%combined.out) offset=0 : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%e = view(%combined.out) offset=128 : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%s = add(%a, %e) : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
output %s, %b, %c, %d
