mesh x=2, y=2
%a = input f32[4,8] global=f32[4,16] sharding=[{}, {x}]
%g.packed = all_gather(%a) axes={x} dim=0 bytes=256 : f32[8,8] global=f32[8,8] sharding=[{}, {}] @compute
%g = copy(%g.packed) block=[4,8] copies=[[0,0]->[0,0], [4,0]->[0,8]] : f32[4,16] global=f32[4,16] sharding=[{}, {}] @compute
%g.packed.1 = copy(%g) block=[4,8] copies=[[0,0]->[0,0], [0,8]->[4,0]] : f32[8,8] global=f32[8,8] sharding=[{}, {}] @compute
%r = reduce_scatter(%g.packed.1) axes={y} dim=0 bytes=256 : f32[4,8] global=f32[4,16] sharding=[{}, {y}] @compute
%g.packed.2 = copy(%g) block=[4,8] copies=[[0,0]->[0,0], [0,8]->[4,0]] : f32[8,8] global=f32[8,8] sharding=[{}, {}] @compute
%t = all_to_all(%g.packed.2) axes={x} split_dim=0 concat_dim=0 bytes=256 : f32[8,8] global=f32[8,8] sharding=[{}, {}] @compute
%s = copy(%g) block=[4,8] copies=[[0,8*{y}]->[0,0]] : f32[4,8] global=f32[4,16] sharding=[{}, {y}] @compute
%v = view(%s) offset=0 : f32[4,8] global=f32[4,16] sharding=[{}, {y}] @compute
%w = add(%v, %r) : f32[4,8] global=f32[4,16] sharding=[{}, {y}] @compute
%o = copy(%w) block=[4,8] copies=[[0,0]->[0,0]] : f32[4,8] global=f32[4,16] sharding=[{}, {y}] @compute
output %o, %t
