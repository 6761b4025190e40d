# passes: pack
# Collectives over non-leading dims get explicit rank-major packing; a shard slice becomes a
# copy of the device's block; a relabel becomes a view (a copy when it is an output).
mesh x=2, y=2
%a = input f32[4,8] global=f32[4,16] sharding=[{}, {x}]
%g = all_gather(%a) axes={x} dim=1 bytes=256 : f32[4,16] global=f32[4,16] sharding=[{}, {}] @compute
%r = reduce_scatter(%g) axes={y} dim=1 bytes=256 : f32[4,8] global=f32[4,16] sharding=[{}, {y}] @compute
%t = all_to_all(%g) axes={x} split_dim=1 concat_dim=0 bytes=256 : f32[8,8] global=f32[8,8] sharding=[{}, {}] @compute
%s = shard_slice(%g) axes={y} dim=1 : f32[4,8] global=f32[4,16] sharding=[{}, {y}] @compute
%v = shard_slice(%s) axes={} dim=0 : f32[4,8] global=f32[4,16] sharding=[{}, {y}] @compute
%w = add(%v, %r) : f32[4,8] global=f32[4,16] sharding=[{}, {y}] @compute
%o = shard_slice(%w) axes={} dim=0 : f32[4,8] global=f32[4,16] sharding=[{}, {y}] @compute
output %o, %t
