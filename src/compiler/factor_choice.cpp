// The one factor-choice policy (compiler/factor_choice.hpp).
#include "tessel/compiler/factor_choice.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "tessel/compiler/propagate.hpp"

namespace tessel {

namespace {

bool is_prefix(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

int reach_order(FactorWish::Reach r) {
  switch (r) {
    case FactorWish::Reach::Exact: return 0;
    case FactorWish::Reach::Extend: return 1;
    case FactorWish::Reach::FillEmpty: return 2;
  }
  return 1;
}

}  // namespace

bool factor_may_split(const Op& op, const OpRule& rule, int f) {
  switch (rule.factors.at(static_cast<std::size_t>(f)).kind) {
    case FactorKind::Pass:
    case FactorKind::Reduction: return true;
    case FactorKind::Replicated: return false;
    case FactorKind::Combined: return op_def(op.kind).distribute != nullptr && op.num_results() == 1;
  }
  return false;
}

namespace {

// factor_axes_problem's check; the text only when `why` is given (the automatic search calls it
// for every assignment it enumerates).
bool check_factor_axes(const Mesh& mesh, const Op& op, const OpRule& rule, const FactorAxes& fs, std::string* why) {
  auto fail = [&](auto&& text) {
    if (why) *why = text();
    return false;
  };
  if (fs.size() != rule.factors.size())
    return fail([&] { return fmt::format("{} entries for the {} factors of {}", fs.size(), rule.factors.size(), rule.to_string()); });
  std::set<std::string> used;
  for (std::size_t f = 0; f < fs.size(); ++f) {
    for (const std::string& a : fs[f]) {
      if (!mesh.has_axis(a)) return fail([&] { return fmt::format("factor '{}': no axis '{}' in mesh {}", rule.factors[f].name, a, mesh.to_string()); });
      if (!used.insert(a).second) return fail([&] { return fmt::format("factor '{}': axis '{}' is used twice", rule.factors[f].name, a); });
    }
    if (fs[f].empty()) continue;
    if (!factor_may_split(op, rule, static_cast<int>(f)))
      return fail([&] { return fmt::format("factor '{}' may not be split (the op needs it whole)", rule.factors[f].name); });
    if (rule.factors[f].size % mesh.axes_size(fs[f]) != 0)
      return fail([&] { return fmt::format("factor '{}' of size {} does not divide over {{{}}} ({} devices)", rule.factors[f].name,
                  rule.factors[f].size, join(fs[f], ","), mesh.axes_size(fs[f])); });
  }
  auto whole = [&](const std::vector<DimFactors>& dims, const char* what, int index) {
    for (std::size_t d = 0; d < dims.size(); ++d) {
      std::size_t want = 0;
      for (int f : dims[d]) want += fs[static_cast<std::size_t>(f)].size();
      if (compose_dim(mesh, dims[d], rule.factors, fs).size() != want)
        return fail([&] { return fmt::format("dim {} of {} {}: a minor factor is split under a major one that is not split whole", d, what,
                    index); });
    }
    return true;
  };
  for (std::size_t i = 0; i < rule.operands.size(); ++i)
    if (!whole(rule.operands[i], "operand", static_cast<int>(i))) return false;
  for (int r = 0; r < rule.num_results(); ++r)
    if (!whole(rule.result_dims(r), "result", r)) return false;
  return true;
}

}  // namespace

std::string factor_axes_problem(const Mesh& mesh, const Op& op, const OpRule& rule, const FactorAxes& fs) {
  std::string why;
  check_factor_axes(mesh, op, rule, fs, &why);
  return why;
}

bool factor_axes_valid(const Mesh& mesh, const Op& op, const OpRule& rule, const FactorAxes& fs) {
  return check_factor_axes(mesh, op, rule, fs, nullptr);
}

bool stronger_wish(const FactorWish& a, const FactorWish& b) {
  if (reach_order(a.reach) != reach_order(b.reach)) return reach_order(a.reach) < reach_order(b.reach);
  if (a.priority != b.priority) return a.priority < b.priority;
  if (a.bytes != b.bytes) return a.bytes > b.bytes;
  return a.value < b.value;
}

FactorChoice choose_factor_axes(const OpRule& rule, const std::vector<FactorWish>& wishes,
                                const std::function<void(const FactorConflict&)>& on_conflict, const Op* op) {
  const std::size_t nf = rule.factors.size();
  FactorChoice c;
  c.axes.assign(nf, {});
  c.by.assign(nf, {});
  c.source.assign(nf, -1);
  c.rank.assign(nf, -1);
  std::vector<bool> exact(nf, false);
  std::vector<int> order(wishes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return stronger_wish(wishes[static_cast<std::size_t>(a)], wishes[static_cast<std::size_t>(b)]);
  });
  for (int w : order) {
    const FactorWish& wish = wishes[static_cast<std::size_t>(w)];
    for (std::size_t f = 0; f < nf && f < wish.axes.size(); ++f) {
      const auto& want = wish.axes[f];
      if (want.empty() || rule.factors[f].kind == FactorKind::Replicated) continue;
      if (op && !factor_may_split(*op, rule, static_cast<int>(f))) continue;
      auto& have = c.axes[f];
      const bool take = have.empty() || (wish.reach != FactorWish::Reach::FillEmpty && !exact[f] &&
                                         is_prefix(have, want) && want.size() > have.size());
      if (take) {
        c.by[f].resize(want.size(), w);  // the axes it adds are this wish's
        have = want;
        exact[f] = exact[f] || wish.reach == FactorWish::Reach::Exact;
      } else if (!is_prefix(want, have) && on_conflict) {
        on_conflict(FactorConflict{static_cast<int>(f), c.by[f].back(), w, {}, -1});
      }
    }
  }
  // An axis wanted by two factors goes to the factor whose wish for that axis is stronger (each
  // axis of a factor counts with the wish that added it); the other factor keeps the axes before
  // it. A factor's later axes come from weaker wishes, so the claims are settled in that order.
  struct Claim {
    int factor;
    std::size_t pos;
    int wish;
  };
  std::vector<Claim> claims;
  for (std::size_t f = 0; f < nf; ++f)
    for (std::size_t i = 0; i < c.axes[f].size(); ++i) claims.push_back({static_cast<int>(f), i, c.by[f][i]});
  std::stable_sort(claims.begin(), claims.end(), [&](const Claim& a, const Claim& b) {
    if (a.wish != b.wish) {
      const FactorWish& wa = wishes[static_cast<std::size_t>(a.wish)];
      const FactorWish& wb = wishes[static_cast<std::size_t>(b.wish)];
      if (stronger_wish(wa, wb)) return true;
      if (stronger_wish(wb, wa)) return false;
    }
    return a.pos < b.pos;
  });
  std::vector<std::size_t> keep(nf);
  for (std::size_t f = 0; f < nf; ++f) keep[f] = c.axes[f].size();
  std::map<std::string, int> taken;  // axis -> factor holding it
  for (const Claim& k : claims) {
    const auto f = static_cast<std::size_t>(k.factor);
    if (k.pos >= keep[f]) continue;  // cut off before
    const std::string& axis = c.axes[f][k.pos];
    auto it = taken.find(axis);
    if (it == taken.end()) {
      taken.emplace(axis, k.factor);
      continue;
    }
    if (on_conflict) {
      const auto h = static_cast<std::size_t>(it->second);
      const auto at = static_cast<std::size_t>(std::find(c.axes[h].begin(), c.axes[h].end(), axis) - c.axes[h].begin());
      on_conflict(FactorConflict{k.factor, c.by[h][at], k.wish, axis, it->second});
    }
    keep[f] = k.pos;
  }
  for (std::size_t f = 0; f < nf; ++f) {
    c.axes[f].resize(keep[f]);
    c.by[f].resize(keep[f]);
    if (!c.by[f].empty()) {
      c.rank[f] = c.by[f].front();
      c.source[f] = c.by[f].back();
    }
  }
  return c;
}

void make_realizable(const Mesh& mesh, const OpRule& rule, FactorAxes& fs) {
  // Clearing a factor can break a dim that an earlier dim's pass already checked: repeat until
  // nothing changes (each pass clears at least one factor or stops).
  for (bool changed = true; changed;) {
    changed = false;
    auto fix = [&](const std::vector<DimFactors>& dims) {
      for (const auto& d : dims) {
        bool full = true;
        for (int f : d) {
          auto& a = fs[static_cast<std::size_t>(f)];
          if (!full && !a.empty()) {
            a.clear();
            changed = true;
          }
          if (mesh.axes_size(a) != rule.factors[static_cast<std::size_t>(f)].size) full = false;
        }
      }
    };
    for (const auto& o : rule.operands) fix(o);
    for (int r = 0; r < rule.num_results(); ++r) fix(rule.result_dims(r));
  }
}

}  // namespace tessel
