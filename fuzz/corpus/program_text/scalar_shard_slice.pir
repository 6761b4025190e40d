mesh x=2
%a = input f32[] global=f32[] sharding=[]
%b = shard_slice(%a) dim=0 axes={x} : f32[] global=f32[] sharding=[] @compute
output %b
