// MG-WFBP (Shi, Chu, Li, INFOCOM 2019): which layers' gradients to merge.
//
// The model (section III): layer l's gradient is ready at mu_b^(l) = tau_b^(l) + t_b^(l)
// (eq. 6); one all-reduce at a time, in backward order, each starting when its gradient
// is ready and the previous one ended (eq. 7 / 20); merging layer l into l-1 (Definition
// 1) removes its own all-reduce and adds its bytes to l-1's (Conditions 14-16). The next
// forward starts after the last all-reduce (Algorithm 2), so the objective (eq. 23) is
// the end of the last all-reduce.
#include <algorithm>
#include <limits>

#include "allreduce_plans.h"
#include "quicksilver/core/check.h"

namespace qs {

TimeNs MergeProblem::ready(int l) const {
  // tau_b^(L) = t_f; tau_b^(l) = tau_b^(l+1) + t_b^(l+1) (eq. 6), so
  // mu_b^(l) = t_f + sum_{j >= l} t_b^(j).
  TimeNs t = tf;
  for (int j = layers(); j >= l; --j) t += tb[static_cast<std::size_t>(j - 1)];
  return t;
}

TimeNs merge_finish_time(const MergeProblem& p, const MergeSet& merged) {
  const int n = p.layers();
  QS_CHECK(static_cast<int>(merged.size()) == n);
  TimeNs ready = p.tf, link_free = std::numeric_limits<TimeNs>::min();
  Bytes carry = 0;
  for (int l = n; l >= 1; --l) {
    ready += p.tb[static_cast<std::size_t>(l - 1)];
    carry += p.bytes[static_cast<std::size_t>(l - 1)];
    if (l > 1 && merged[static_cast<std::size_t>(l - 1)]) continue;  // (l) (+) (l-1)
    link_free = std::max(link_free, ready) + p.cost.time(carry);
    carry = 0;
  }
  return link_free;
}

// Algorithm 1, "as printed". Two gaps in the printed text are filled with the only values
// the surrounding equations allow, and nothing else is changed:
//  - line 9's loop (l = L-1 .. 2) leaves tau_b[1] unset although line 13 reads it (l = 3):
//    we continue eq. 19 down to l = 1;
//  - line 13 reads tau_b[l-2] = tau_b[0] for l = 2: "the time layer 0 starts its backward",
//    i.e. the time layer 1's backward ends, tau_b[1] + t_b[1] (eq. 26 uses tau_b^(1) in
//    exactly this role for l = 3).
// Line 13 compares with a, as Theorem 1 (eq. 27) states; the proof's "< b" is a typo.
MergeSet mgwfbp_algorithm1(const MergeProblem& p) {
  const int L = p.layers();
  MergeSet merged(static_cast<std::size_t>(L), false);
  if (L <= 1) return merged;
  auto at = [](auto& v, int i) -> auto& { return v[static_cast<std::size_t>(i)]; };
  std::vector<TimeNs> tc(static_cast<std::size_t>(L + 1)), tb(static_cast<std::size_t>(L + 1)),
      taub(static_cast<std::size_t>(L + 1));
  std::vector<Bytes> pb(static_cast<std::size_t>(L + 1));
  for (int l = 1; l <= L; ++l) {  // lines 5-7
    at(pb, l) = p.bytes[static_cast<std::size_t>(l - 1)];
    at(tc, l) = p.cost.time(at(pb, l));
    at(tb, l) = p.tb[static_cast<std::size_t>(l - 1)];
  }
  at(taub, L) = p.tf;                                                              // eq. 19, l = L
  for (int l = L - 1; l >= 1; --l) at(taub, l) = at(taub, l + 1) + at(tb, l + 1);  // line 9-10
  at(taub, 0) = at(taub, 1) + at(tb, 1);                                           // see above
  auto comm_start = [&]() {                                                        // lines 21-26
    std::vector<TimeNs> tauc(static_cast<std::size_t>(L + 1));
    at(tauc, L) = at(taub, L) + at(tb, L);
    for (int l = L - 1; l >= 1; --l) {
      at(tauc, l) = std::max(at(tauc, l + 1) + at(tc, l + 1), at(taub, l) + at(tb, l));
    }
    return tauc;
  };
  std::vector<TimeNs> tauc = comm_start();  // line 11
  for (int l = L; l >= 2; --l) {            // lines 12-16
    if (at(taub, l - 2) - at(tauc, l) < p.cost.a) {
      at(tc, l) = 0;                               // MERGE, line 18
      at(pb, l - 1) = at(pb, l - 1) + at(pb, l);   // line 19
      at(tc, l - 1) = p.cost.time(at(pb, l - 1));  // line 20
      tauc = comm_start();
      merged[static_cast<std::size_t>(l - 1)] = true;
    }
  }
  return merged;
}

// Dynamic programme: F[j] = the earliest end of the all-reduces of layers j..L when layer
// j is the lowest layer of its group (so j is not merged):
//   F[j] = min_{i >= j} max(F[i+1], mu_b^(j)) + T_ar(p^(j) + ... + p^(i)),  F[L+1] = -inf.
// The end of a group is non-decreasing in the end of the previous one, so an optimal plan
// for layers j..L extends an optimal plan for i+1..L: F[1] is the optimum of eq. 23.
// Ties go to the smallest group (the fewest merges).
MergeSet optimal_merge(const MergeProblem& p) {
  const int L = p.layers();
  MergeSet merged(static_cast<std::size_t>(L), false);
  if (L <= 1) return merged;
  std::vector<TimeNs> ready(static_cast<std::size_t>(L + 2));
  std::vector<Bytes> prefix(static_cast<std::size_t>(L + 2), 0);  // prefix[j] = sum_{l >= j} p
  ready[static_cast<std::size_t>(L + 1)] = p.tf;
  for (int l = L; l >= 1; --l) {
    ready[static_cast<std::size_t>(l)] =
        ready[static_cast<std::size_t>(l + 1)] + p.tb[static_cast<std::size_t>(l - 1)];
    prefix[static_cast<std::size_t>(l)] =
        prefix[static_cast<std::size_t>(l + 1)] + p.bytes[static_cast<std::size_t>(l - 1)];
  }
  constexpr TimeNs kNone = std::numeric_limits<TimeNs>::min();
  std::vector<TimeNs> f(static_cast<std::size_t>(L + 2), kNone);
  std::vector<int> top(static_cast<std::size_t>(L + 2), 0);  // the group's highest layer
  for (int j = L; j >= 1; --j) {
    TimeNs best = std::numeric_limits<TimeNs>::max();
    int best_i = j;
    for (int i = j; i <= L; ++i) {
      const TimeNs prev = f[static_cast<std::size_t>(i + 1)];
      const Bytes bytes =
          prefix[static_cast<std::size_t>(j)] - prefix[static_cast<std::size_t>(i + 1)];
      const TimeNs end = std::max(prev, ready[static_cast<std::size_t>(j)]) + p.cost.time(bytes);
      if (end < best) {
        best = end;
        best_i = i;
      }
    }
    f[static_cast<std::size_t>(j)] = best;
    top[static_cast<std::size_t>(j)] = best_i;
  }
  for (int j = 1; j <= L;) {
    const int i = top[static_cast<std::size_t>(j)];
    for (int l = j + 1; l <= i; ++l) merged[static_cast<std::size_t>(l - 1)] = true;
    j = i + 1;
  }
  return merged;
}

MergeSet exhaustive_merge(const MergeProblem& p) {
  const int L = p.layers();
  QS_CHECK(L >= 1 && L <= 24);
  MergeSet best(static_cast<std::size_t>(L), false), cur(static_cast<std::size_t>(L), false);
  TimeNs best_t = merge_finish_time(p, best);
  for (std::uint32_t mask = 1; mask < (1u << (L - 1)); ++mask) {
    for (int l = 2; l <= L; ++l) cur[static_cast<std::size_t>(l - 1)] = (mask >> (l - 2)) & 1u;
    const TimeNs t = merge_finish_time(p, cur);
    if (t < best_t) {
      best_t = t;
      best = cur;
    }
  }
  return best;
}

}  // namespace qs
