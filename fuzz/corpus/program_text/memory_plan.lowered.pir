mesh {}
%x = input f32[8,16] global=f32[8,16] sharding=[{}, {}]
%a = exp(%x) : f32[8,16] global=f32[8,16] sharding=[{}, {}] @compute at=0
%b = tanh(%a) : f32[8,16] global=f32[8,16] sharding=[{}, {}] @compute at=512
%s = reduce_sum(%b) dims=[1] keepdims=true : f32[8,1] global=f32[8,1] sharding=[{}, {}] @compute at=1024
%c = gelu(%b) : f32[8,16] global=f32[8,16] sharding=[{}, {}] @compute at=0
%d = neg(%c) : f32[8,16] global=f32[8,16] sharding=[{}, {}] @compute at=512
%y = add(%d, %s) : f32[8,16] global=f32[8,16] sharding=[{}, {}] @compute
output %y
memory arena=1088  # peak 2112 bytes per device: arena + inputs 512 + outputs 512
