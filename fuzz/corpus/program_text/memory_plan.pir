# passes: memory-plan
# Greedy by size over live ranges: the 512-byte values are placed first; %c reuses %a's
# bytes (dead after %b), %d reuses %b's; outputs and inputs are not in the arena.
mesh {}
%x = input f32[8,16] global=f32[8,16] sharding=[{}, {}]
%a = exp(%x) : f32[8,16] global=f32[8,16] sharding=[{}, {}] @compute
%b = tanh(%a) : f32[8,16] global=f32[8,16] sharding=[{}, {}] @compute
%s = reduce_sum(%b) dims=[1] keepdims=true : f32[8,1] global=f32[8,1] sharding=[{}, {}] @compute
%c = gelu(%b) : f32[8,16] global=f32[8,16] sharding=[{}, {}] @compute
%d = neg(%c) : f32[8,16] global=f32[8,16] sharding=[{}, {}] @compute
%y = add(%d, %s) : f32[8,16] global=f32[8,16] sharding=[{}, {}] @compute
output %y
