// fuzz/fuzz_mesh_sharding.cpp — libFuzzer target for Mesh::parse and Sharding::parse.
// Input: "<mesh spec>\n<sharding text>\n<dims>" (the third line optional, bytes used as small
// dim multipliers). Laws checked:
//   * Mesh: parse(to_string(m)) == m; coords/position are inverse for every device.
//   * Sharding: parse(to_string(s)) == s.
//   * On a valid (mesh, sharding, shape): every device's local shape is the global shape
//     divided by the dim's shard count; local offsets are multiples of the local shape; the
//     shards of a dim tile it exactly (each offset 0, L, 2L, ... appears, equally often).
// Errors (tessel::Error) are fine answers; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_util.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"

using tessel_fuzz::law_broken;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size > 1024) return 0;
  const std::string in(reinterpret_cast<const char*>(data), size);
  const auto nl1 = in.find('\n');
  const std::string mesh_text = in.substr(0, nl1);
  const std::string rest = nl1 == std::string::npos ? "" : in.substr(nl1 + 1);
  const auto nl2 = rest.find('\n');
  const std::string sharding_text = rest.substr(0, nl2);
  const std::string dims_text = nl2 == std::string::npos ? "" : rest.substr(nl2 + 1);

  std::optional<tessel::Mesh> mesh;
  try {
    mesh = tessel::Mesh::parse(mesh_text);
  } catch (const tessel::Error&) {
  }
  if (mesh) {
    const std::string s = mesh->to_string();
    tessel::Mesh again;
    try {
      again = tessel::Mesh::parse(s);
    } catch (const tessel::Error& e) {
      law_broken("Mesh::parse(m.to_string()) parses", s + "\n" + e.what());
    }
    if (again != *mesh) law_broken("Mesh::parse(m.to_string()) == m", s + " vs " + again.to_string());
    if (mesh->num_devices() <= 4096)
      for (int64_t p = 0; p < mesh->num_devices(); ++p)
        if (mesh->position(mesh->coords(p)) != p)
          law_broken("position(coords(p)) == p", s + " p=" + std::to_string(p));
  }

  std::optional<tessel::Sharding> sh;
  try {
    sh = tessel::Sharding::parse(sharding_text);
  } catch (const tessel::Error&) {
  }
  if (!sh) return 0;
  {
    const std::string s = sh->to_string();
    tessel::Sharding again;
    try {
      again = tessel::Sharding::parse(s);
    } catch (const tessel::Error& e) {
      law_broken("Sharding::parse(s.to_string()) parses", s + "\n" + e.what());
    }
    if (again != *sh) law_broken("Sharding::parse(s.to_string()) == s", s + " vs " + again.to_string());
  }
  if (!mesh || mesh->num_devices() > 4096 || sh->rank() > 6) return 0;

  // A shape the sharding can divide: shard count x a small multiplier per dim.
  tessel::Shape shape;
  int64_t total = 1;
  for (int d = 0; d < sh->rank(); ++d) {
    int64_t count = 1;
    try {
      count = sh->shard_count(d, *mesh);
    } catch (const tessel::Error&) {
      return 0;
    }
    if (count <= 0 || count > 4096) return 0;
    const int64_t mult = d < int(dims_text.size()) ? 1 + (static_cast<unsigned char>(dims_text[d]) % 3) : 1;
    shape.push_back(count * mult);
    total *= count * mult;
    if (total > tessel::Mesh::kMaxDevices) return 0;
  }
  try {
    sh->validate(*mesh, shape, "%fuzz");
  } catch (const tessel::Error&) {
    return 0;
  }
  const tessel::Shape local = sh->local_shape(*mesh, shape);
  const std::string what = mesh->to_string() + " " + sh->to_string() + " " + tessel::shape_str(shape);
  if (local.size() != shape.size()) law_broken("local rank == global rank", what);
  for (int d = 0; d < sh->rank(); ++d)
    if (local[d] * sh->shard_count(d, *mesh) != shape[d])
      law_broken("local dim x shard count == global dim", what + " dim " + std::to_string(d));
  std::vector<std::map<int64_t, int64_t>> seen(shape.size());  // per dim: offset -> count
  for (int64_t p = 0; p < mesh->num_devices(); ++p) {
    const std::vector<int64_t> off = sh->local_offset(*mesh, shape, p);
    if (off.size() != shape.size()) law_broken("offset rank == global rank", what);
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (off[d] < 0 || off[d] + local[d] > shape[d] || (local[d] && off[d] % local[d] != 0))
        law_broken("offsets are block-aligned and inside the tensor",
                   what + " device " + std::to_string(p) + " dim " + std::to_string(d));
      if (off[d] != sh->shard_index(int(d), *mesh, p) * local[d])
        law_broken("offset == shard_index x local size", what + " device " + std::to_string(p));
      ++seen[d][off[d]];
    }
  }
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const int64_t count = sh->shard_count(int(d), *mesh);
    if (int64_t(seen[d].size()) != count)
      law_broken("the shards of a dim tile it exactly", what + " dim " + std::to_string(d));
    for (const auto& kv : seen[d])
      if (kv.second != mesh->num_devices() / count)
        law_broken("every shard of a dim is held by as many devices", what);
  }
  return 0;
}
