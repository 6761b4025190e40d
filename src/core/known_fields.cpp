// Unknown keys in the files tessel reads are errors naming the known ones (known_fields.hpp).
#include "known_fields.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace tessel {

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string closest_name(std::string_view word, const std::vector<std::string>& known) {
  if (word.size() > 64) return "";  // a pasted value, not a misspelt name: no quadratic work on it
  std::string best;
  std::size_t best_d = 3;  // within 2 edits
  for (const std::string& k : known) {
    const std::size_t d = edit_distance(word, k);
    if (d < best_d && 2 * d <= std::max(word.size(), k.size())) {
      best_d = d;
      best = k;
    }
  }
  return best;
}

std::string unknown_key_message(std::string_view key, const std::vector<std::string>& known, std::string_view noun,
                                char quote) {
  const std::string near = closest_name(key, known);
  return fmt::format("unknown {} {}{}{} ({}known: {})", noun, quote, key, quote,
                     near.empty() ? std::string() : fmt::format("did you mean {}{}{}? ", quote, near, quote),
                     fmt::join(known, ", "));
}

std::string unknown_field(const nlohmann::json& object, const std::vector<std::string>& known, std::string_view noun) {
  if (!object.is_object()) return "";
  for (auto it = object.begin(); it != object.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      return unknown_key_message(it.key(), known, noun);
  return "";
}

}  // namespace tessel
