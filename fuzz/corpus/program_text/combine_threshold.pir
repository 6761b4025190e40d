# passes: combine-collectives(threshold=40)
# Combined buffers grow to at most 40 bytes: %a and %b (16 + 16) combine; %c would make 48,
# so it opens the next group, which %d joins; %big (64 bytes) is over the threshold and is
# never a candidate.
mesh model=2
%x = input f32[4,8] global=f32[4,8] sharding=[{}, {}]
%p = input f32[4] global=f32[4] sharding=[{}]
%a = all_reduce(%p) axes={model} bytes=16 : f32[4] global=f32[4] sharding=[{}] @compute
%q = exp(%p) : f32[4] global=f32[4] sharding=[{}] @compute
%b = all_reduce(%q) axes={model} bytes=16 : f32[4] global=f32[4] sharding=[{}] @compute
%r = tanh(%p) : f32[4] global=f32[4] sharding=[{}] @compute
%c = all_reduce(%r) axes={model} bytes=16 : f32[4] global=f32[4] sharding=[{}] @compute
%big = all_reduce(%x) axes={model} bytes=128 : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
%d = all_reduce(%p) axes={model} bytes=16 : f32[4] global=f32[4] sharding=[{}] @compute
%s1 = add(%a, %b) : f32[4] global=f32[4] sharding=[{}] @compute
%s2 = add(%c, %d) : f32[4] global=f32[4] sharding=[{}] @compute
%s = add(%s1, %s2) : f32[4] global=f32[4] sharding=[{}] @compute
output %s, %big
