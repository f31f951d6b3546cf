#include "quicksilver/transport/sender.h"

#include <algorithm>
#include <cmath>

#include "quicksilver/core/check.h"

namespace qs::transport {

Sender::Sender(SendOrder order, int num_priorities, EventLoop& loop)
    : order_(order),
      loop_(loop),
      clock_(loop.clock()),
      queue_(order == SendOrder::kPriority ? num_priorities : 1) {
  QS_CHECK(num_priorities >= 1);
}

void Sender::enqueue(int conn, const Header& h, const std::byte* payload, std::uint64_t tag) {
  const int p = order_ == SendOrder::kPriority ? h.priority : 0;
  QS_CHECK(p < queue_.num_priorities());
  queue_.push(p, Item{conn, h, payload, tag, clock_.now()});
  update_busy();
}

void Sender::collect(Connection& c) {
  for (std::uint64_t tag : c.take_completed()) {
    if (sent_) sent_(c.index(), tag);
  }
}

Status Sender::pump() {
  if (pumping_) {
    repump_ = true;
    return Status::ok();
  }
  pumping_ = true;
  Status result;
  std::uint64_t budget = kPumpBudget;
  do {
    repump_ = false;
    while (!queue_.empty()) {
      const Item& top = queue_.top();
      QS_CHECK(top.conn >= 0 && static_cast<std::size_t>(top.conn) < conns_.size());
      Connection* c = conns_[static_cast<std::size_t>(top.conn)];
      if (c == nullptr || c->closed()) {
        result = unavailable("cannot send a " + std::string(frame_kind_name(top.header.kind)) +
                             " of tensor " + std::to_string(top.header.tensor) + ": connection " +
                             (c ? c->peer() : std::to_string(top.conn)) + " is closed");
        break;
      }
      if (c->data_busy()) break;  // strict order: the head waits for its connection
      if (c->data_bytes_pending() >= batch_bytes_ && c->data_frames() > 0) {
        // This connection's batch is full: write it, then look again.
        Status s = c->flush();
        collect(*c);
        if (!s.is_ok()) {
          result = s;
          break;
        }
        if (c->data_busy()) break;
      }
      if (budget == 0) {
        if (!continuation_) {
          continuation_ = true;
          loop_.defer([this] {
            continuation_ = false;
            Status s = pump();
            if (!s.is_ok()) loop_.fail(s);
          });
        }
        break;
      }
      Item it = queue_.pop();
      const TimeNs now = clock_.now();
      if (sample_) sample_(QueueSample{it.header.priority, now - it.enqueued});
      ++units_sent_;
      c->send_data(it.header, it.payload, it.tag);
      budget -= std::min<std::uint64_t>(budget, kHeaderSize + it.header.length);
      if (batch_bytes_ == 0 || c->data_bytes_pending() >= batch_bytes_) {
        Status s = c->flush();
        collect(*c);
        if (!s.is_ok()) {
          result = s;
          break;
        }
      }
    }
    // Write every batch still open. A SentCallback may queue new units meanwhile: look
    // at the queue again then.
    const std::size_t queued_before = queue_.size();
    for (Connection* c : conns_) {
      if (c == nullptr || c->closed() || c->data_frames() == 0 || c->data_busy()) continue;
      Status s = c->flush();
      collect(*c);
      if (!s.is_ok() && result.is_ok()) result = s;
    }
    if (queue_.size() > queued_before) repump_ = true;
  } while (repump_ && result.is_ok());
  pumping_ = false;
  update_busy();
  return result;
}

Status Sender::on_writable(int conn) {
  if (conn >= 0 && static_cast<std::size_t>(conn) < conns_.size() &&
      conns_[static_cast<std::size_t>(conn)]) {
    collect(*conns_[static_cast<std::size_t>(conn)]);
  }
  return pump();
}

bool Sender::idle() const {
  if (!queue_.empty()) return false;
  for (const Connection* c : conns_) {
    if (c != nullptr && !c->closed() && c->data_frames() > 0) return false;
  }
  return true;
}

void Sender::update_busy() {
  const bool b = !idle();
  if (b == busy_) return;
  const TimeNs now = clock_.now();
  if (b) {
    busy_since_ = now;
  } else {
    busy_total_ += now - busy_since_;
  }
  busy_ = b;
}

TimeNs Sender::busy_ns() const { return busy_total_ + (busy_ ? clock_.now() - busy_since_ : 0); }

TimeNs percentile(std::vector<TimeNs> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(v.size()));
  const auto idx =
      static_cast<std::size_t>(std::clamp(rank, 1.0, static_cast<double>(v.size()))) - 1;
  return v[idx];
}

}  // namespace qs::transport
