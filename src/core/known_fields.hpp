// src/core/known_fields.hpp (private) — the one check that an object tessel reads from a file
// the user writes or tessel wrote (a job or pool file, a link figures entry, a checkpoint's
// manifest) holds only the keys tessel knows. An unknown key is always an error: a misspelt
// field ("devices_count") silently ignored would plan, price or restore something other than
// what the file says. The message names the key, a close match and every known key, so the
// caller only has to prefix the file and the object, e.g.
//   jobs.json: job 3 'gpt-a': unknown field "devices_count" (did you mean "device_counts"?
//   known: name, steps, gpt, device_counts, seed, lr, may_span_nodes, requested_devices)
// Files other tools write into (zarr's own zarr.json fields, zarr attributes) are not checked
// with it: there extension fields are allowed (docs/checkpoints.md).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessel {

// The name of `known` closest to `word` by edit distance (insertions, deletions, substitutions),
// when it is within 2 edits and those edits are at most half the longer name (so "lr" is not
// offered for "xy"); ties go to the first. "" when none is that close.
std::string closest_name(std::string_view word, const std::vector<std::string>& known);

// `unknown field "devices_count" (did you mean "device_counts"? known: name, steps, ...)`:
// `noun` replaces "field" (e.g. "pool field"), `quote` the quotes around the names.
std::string unknown_key_message(std::string_view key, const std::vector<std::string>& known,
                                std::string_view noun = "field", char quote = '"');

// The first key of `object` (in nlohmann's sorted order) that is not in `known`, said by
// unknown_key_message; "" when every key is known or `object` is not a JSON object (the caller
// reports the wrong type itself).
std::string unknown_field(const nlohmann::json& object, const std::vector<std::string>& known,
                          std::string_view noun = "field");

}  // namespace tessel
