mesh data=4
%x = input f32[8,64] global=f32[32,64] sharding=[{data}, {}]
%gamma = input f32[64] global=f32[64] sharding=[{}]
%dy = input f32[8,64] global=f32[32,64] sharding=[{data}, {}]
%dx, %dgamma, %dbeta = layer_norm_grad(%x, %gamma, %dy) eps=1e-05 : f32[8,64] global=f32[32,64] sharding=[{data}, {}] @compute, : f32[64] global=f32[64] sharding=[{}] partial{data} at=512, : f32[64] global=f32[64] sharding=[{}] partial{data} at=768
%combined.in = concat(%dgamma, %dbeta) axis=0 : f32[128] global=f32[128] sharding=[{}] @compute at=0
wait compute @comm
%combined.out = all_reduce_start(%combined.in) axes={data} bytes=512 : f32[128] global=f32[128] sharding=[{}] @comm at=512
done %combined.out @comm
wait comm @compute
%dgamma.1.unpacked = view(%combined.out) offset=0 : f32[64] global=f32[64] sharding=[{}] @compute
%dgamma.1 = copy(%dgamma.1.unpacked) block=[64] copies=[[0]->[0]] : f32[64] global=f32[64] sharding=[{}] @compute
%dbeta.1.unpacked = view(%combined.out) offset=256 : f32[64] global=f32[64] sharding=[{}] @compute
%dbeta.1 = copy(%dbeta.1.unpacked) block=[64] copies=[[0]->[0]] : f32[64] global=f32[64] sharding=[{}] @compute
output %dx, %dgamma.1, %dbeta.1
memory arena=1024  # peak 7936 bytes per device: arena + inputs 4352 + outputs 2560
