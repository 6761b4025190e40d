mesh model=2
%x = input f32[4,8] global=f32[4,8] sharding=[{}, {}]
%w = input f32[8,8] global=f32[8,16] sharding=[{}, {model}]
%h = einsum(%x, %w) eq="bd,df->bf" : f32[4,8] global=f32[4,16] sharding=[{}, {model}] @compute
%p = einsum(%h, %x) eq="bf,bd->fd" : f32[8,8] global=f32[16,8] sharding=[{model}, {}] @compute
wait compute @comm
%g = all_gather_start(%h) axes={model} dim=1 bytes=256 : f32[4,16] global=f32[4,16] sharding=[{}, {}] @comm
%e = exp(%x) : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute
done %g @comm
wait comm @compute
%y = tanh(%g) : f32[4,16] global=f32[4,16] sharding=[{}, {}] @compute
wait compute @comm
%q = all_gather_start(%p) axes={model} dim=0 bytes=512 : f32[16,8] global=f32[16,8] sharding=[{}, {}] @comm
done %q @comm
output %y, %e, %q
