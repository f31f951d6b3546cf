#include "delayed_updates.h"

#include "quicksilver/core/check.h"

namespace qs::runtime {

void DelayedUpdates::issued(const CollectiveBucket& b) {
  buckets_.emplace(b.id, b);
  Progress& p = progress_of({b.first_iteration, b.last_iteration});
  for (const Chunk& c : b.chunks)
    p.issued[static_cast<std::size_t>(layout_.tensor(c.tensor).layer)] += c.length;
}

void DelayedUpdates::track(const PolicyRecord& r) {
  switch (r.kind) {
    case kCollectiveDone: {
      auto b = buckets_.find(r.id);
      QS_CHECK(b != buckets_.end());
      const Range range{b->second.first_iteration, b->second.last_iteration};
      Progress& p = progress_of(range);
      for (const Chunk& c : b->second.chunks) {
        const int l = layout_.tensor(c.tensor).layer;
        const auto li = static_cast<std::size_t>(l);
        p.reduced[li] += c.length;
        if (p.reduced[li] != layout_.layer_bytes(l)) continue;
        ++p.layers_reduced;
        const LayerUpdate u{l, range.first, range.second, true};
        if (!p.handed[li]) {
          due_.push_back(u);
        } else if (Status s = target_.on_update_ready(u); !s.is_ok()) {
          fail_(s);
        }
      }
      if (p.layers_reduced == layout_.num_layers()) progress_.erase(range);
      buckets_.erase(b);
      if (training_over_) hand_over(kAfterTraining);
      break;
    }
    case kForwardStart:
      if (r.layer == 0) {
        // The layers of the iteration just computed whose every byte is on its way.
        for (auto& [range, p] : progress_) {
          if (range.second != r.iteration) continue;
          for (int l = 0; l < layout_.num_layers(); ++l) {
            const auto li = static_cast<std::size_t>(l);
            if (p.issued[li] == layout_.layer_bytes(l) && p.reduced[li] < p.issued[li]) {
              p.handed[li] = 1;
              due_.push_back(LayerUpdate{l, range.first, range.second, false});
            }
          }
        }
        hand_over(r.iteration + 1);
      }
      break;
    case kTrainingEnd:
      training_over_ = true;
      hand_over(kAfterTraining);
      break;
    default:
      break;
  }
}

DelayedUpdates::Progress& DelayedUpdates::progress_of(Range range) {
  Progress& p = progress_[range];
  if (p.issued.empty()) {
    const auto n = static_cast<std::size_t>(layout_.num_layers());
    p.issued.assign(n, 0);
    p.reduced.assign(n, 0);
    p.handed.assign(n, 0);
  }
  return p;
}

void DelayedUpdates::hand_over(std::int64_t before) {
  Status s = target_.on_updates(before, due_);
  due_.clear();
  if (!s.is_ok()) fail_(s);
}

}  // namespace qs::runtime
