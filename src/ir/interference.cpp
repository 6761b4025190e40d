// src/ir/interference.cpp — Liveness::may_share as points and intervals (interference.hpp).
#include "tessel/ir/interference.hpp"

#include <algorithm>
#include <map>
#include <string>

namespace tessel {

Interference::Interference(const Liveness& L, int num_instrs) {
  const std::size_t nv = L.root.size();
  root_ = L.root;
  def_ = L.first;
  std::map<std::string, std::size_t> ids;  // stream -> index
  auto id = [&](const std::string& s) {
    auto it = ids.find(s);
    return it != ids.end() ? it->second : ids.emplace(s, ids.size()).first->second;
  };
  for (std::size_t v = 0; v < nv; ++v) {
    if (!L.def_stream[v].empty()) id(L.def_stream[v]);
    for (const auto& acc : L.access[v]) id(acc.first);
  }
  for (const auto& w : L.waits) {
    id(w.first.first);
    id(w.first.second);
  }
  streams_ = std::max<std::size_t>(ids.size(), 1);
  const int last_instr = std::max(num_instrs - 1, 0);
  while (leaves_ < static_cast<std::size_t>(last_instr) + 1) leaves_ *= 2;
  // waits[S][T]: the indices of `wait T @S`, ascending.
  std::vector<std::vector<const std::vector<int>*>> waits(streams_, std::vector<const std::vector<int>*>(streams_, nullptr));
  for (const auto& [key, at] : L.waits) waits[id(key.first)][id(key.second)] = &at;
  stream_.assign(nv, 0);
  release_.assign(nv * streams_, last_instr);
  for (std::size_t x = 0; x < nv; ++x) {
    if (static_cast<std::size_t>(L.root[x]) != x || L.first[x] < 0) continue;
    stream_[x] = id(L.def_stream[x]);
    for (std::size_t s = 0; s < streams_; ++s) {
      int r = L.last[x];
      for (const auto& [stream, u] : L.access[x]) {
        const std::size_t t = id(stream);
        if (t == s) {
          r = std::max(r, u);
          continue;
        }
        // The first `wait T @S` after the access orders S after it; without one, never.
        const std::vector<int>* w = waits[s][t];
        auto pos = w ? std::upper_bound(w->begin(), w->end(), u) : std::vector<int>::const_iterator{};
        r = !w || pos == w->end() ? last_instr : std::max(r, *pos);
      }
      release_[x * streams_ + s] = std::min(r, last_instr);
    }
  }
  points_.assign(streams_, Tree(2 * leaves_));
  intervals_.assign(streams_, Tree(2 * leaves_));
}

bool Interference::interfere(int a, int b) const {
  int x = root(a), y = root(b);
  if (x == y) return true;
  if (def_[static_cast<std::size_t>(x)] > def_[static_cast<std::size_t>(y)]) std::swap(x, y);
  const int dy = def_[static_cast<std::size_t>(y)];
  return def_[static_cast<std::size_t>(x)] == dy || release(x, stream_[static_cast<std::size_t>(y)]) >= dy;
}

void Interference::insert(Union& u, int64_t begin, int64_t end) {
  // The first range that ends at or after `begin` (touching counts: they merge), and those
  // after it that begin at or before `end`, become one.
  auto first = std::lower_bound(u.begin(), u.end(), begin, [](const auto& r, int64_t b) { return r.second < b; });
  auto last = first;
  while (last != u.end() && last->first <= end) {
    begin = std::min(begin, last->first);
    end = std::max(end, last->second);
    ++last;
  }
  if (first == last) {
    u.insert(first, {begin, end});
    return;
  }
  *first = {begin, end};
  u.erase(first + 1, last);
}

void Interference::add(int v, int64_t begin, int64_t end) {
  const int x = root(v), d = def_[static_cast<std::size_t>(x)];
  Tree& pts = points_[stream_[static_cast<std::size_t>(x)]];
  for (std::size_t node = static_cast<std::size_t>(d) + leaves_; node >= 1; node >>= 1) insert(pts[node], begin, end);
  for (std::size_t s = 0; s < streams_; ++s) {
    Tree& t = intervals_[s];
    std::size_t lo = static_cast<std::size_t>(d) + leaves_, hi = static_cast<std::size_t>(release(x, s)) + leaves_ + 1;
    for (; lo < hi; lo >>= 1, hi >>= 1) {
      if (lo & 1) insert(t[lo++], begin, end);
      if (hi & 1) insert(t[--hi], begin, end);
    }
  }
}

bool Interference::overlaps(int v, int64_t begin, int64_t end) const {
  return visit(v, [&](const Union& u) {
    auto r = std::upper_bound(u.begin(), u.end(), begin, [](int64_t b, const auto& q) { return b < q.second; });
    return r != u.end() && r->first < end;
  });
}

}  // namespace tessel
