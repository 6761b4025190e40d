# passes: combine-collectives
# Only all-reduces that agree on axis group, reduce op and dtype combine: %b (group {y}), %c
# (op=max) and %d (i32) stay alone; %e matches %a and joins it across them.
mesh x=2, y=2
%f = input f32[4,8] global=f32[4,8] sharding=[{}, {}]
%i = input i32[4,8] global=i32[4,8] sharding=[{}, {}]
%a = all_reduce(%f) axes={x} bytes=128 : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%b = all_reduce(%f) axes={y} bytes=128 : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%c = all_reduce(%f) axes={x} op=max bytes=128 : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%d = all_reduce(%i) axes={x} bytes=128 : i32[4,8] global=i32[4,8] sharding=[{}, {}] @compute
%e = all_reduce(%f) axes={x} bytes=128 : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%s = add(%a, %e) : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
output %s, %b, %c, %d
