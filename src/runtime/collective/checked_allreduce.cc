// checked_allreduce.h: gloo's ring and bcube all-reduce (gloo/allreduce.cc, whose structure
// and offsets these follow), each data message followed by its CRC32C on a slot of its
// own, every received message checked before a byte of it is reduced or forwarded, every
// wait naming the peer it waits on.
#include "checked_allreduce.h"

#include <gloo/transport/unbound_buffer.h>
#include <signal.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "quicksilver/core/units.h"
#include "quicksilver/transport/crc32c.h"

namespace qs::runtime {

namespace {

// The slots of this module's messages (gloo's own collectives use slots with a prefix in
// the top byte, gloo/types.h; the worker's control messages 1..17).
constexpr std::uint64_t kDataSlot = 0x51'5343'5200ull;
constexpr std::uint64_t kCrcSlot = kDataSlot + 1;

using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;

// Declared after a collective's buffers: when the collective ends by an exception, closes
// every pair of the context before the buffers go. Receives and sends may still be pending
// on them, and gloo's I/O thread would complete them into buffers being destroyed (a race
// ThreadSanitizer finds); a closed pair's descriptor is out of gloo's loop once close()
// returns. The context is unusable after a failed collective anyway (gloo closes every
// pair on a timeout), and the peers learn at once that this rank is gone.
class CloseOnFailure {
 public:
  explicit CloseOnFailure(gloo::Context& ctx) : ctx_(ctx), pending_(std::uncaught_exceptions()) {}
  ~CloseOnFailure() {
    if (std::uncaught_exceptions() <= pending_) return;
    try {
      ctx_.closeConnections();
    } catch (...) {  // already closed, or failing: nothing more to do
    }
  }
  CloseOnFailure(const CloseOnFailure&) = delete;
  CloseOnFailure& operator=(const CloseOnFailure&) = delete;

 private:
  gloo::Context& ctx_;
  int pending_;
};

std::string hex32(std::uint32_t v) {
  char s[11];
  std::snprintf(s, sizeof s, "0x%08x", v);
  return s;
}

// One collective's state: its options, and the waits and checks that name peers.
class Run {
 public:
  Run(const CheckedAllreduceOptions& o, std::uint8_t* data, std::size_t elements,
      std::size_t element_size, ReduceFn reduce)
      : o_(o),
        ctx_(*o.context),
        out_(data),
        total_(elements * element_size),
        es_(element_size),
        reduce_(reduce),
        timeout_(o.timeout.count() > 0
                     ? o.timeout
                     : std::chrono::duration_cast<std::chrono::milliseconds>(ctx_.getTimeout())) {}

  void ring();
  void bcube();

 private:
  // Posts a receive into (a send from) `b` of n bytes at `offset` from (to) `peer`; a
  // pair already closed names that peer.
  void post(gloo::transport::UnboundBuffer& b, bool recv, int peer, std::uint64_t slot,
            std::size_t offset, std::size_t n, const char* phase) {
    try {
      if (recv) {
        b.recv(peer, slot, offset, n);
      } else {
        b.send(peer, slot, offset, n);
      }
    } catch (const std::exception& e) {
      throw lost({peer}, recv, phase, e.what());
    }
  }

  // Waits for one receive (recv) or send completion of `b` from or to `peer`.
  void wait(gloo::transport::UnboundBuffer& b, bool recv, int peer, const char* phase) {
    wait_all(b, recv, {peer}, phase);
  }
  // Waits for one completion of `b` per rank of `peers` (their receives or sends are
  // pending on it). A timeout or an error names the peers still waited on.
  void wait_all(gloo::transport::UnboundBuffer& b, bool recv, std::vector<int> peers,
                const char* phase) {
    while (!peers.empty()) {
      int rank = -1;
      bool done = false;
      try {
        done = recv ? b.waitRecv(&rank, timeout_) : b.waitSend(&rank, timeout_);
      } catch (const std::exception& e) {
        throw lost(peers, recv, phase, e.what());
      }
      if (!done) throw std::runtime_error("all-reduce aborted");
      auto at = std::find(peers.begin(), peers.end(), rank);
      peers.erase(at != peers.end() ? at : peers.begin());
    }
  }

  PeerError lost(const std::vector<int>& peers, bool recv, const char* phase,
                 const std::string& what) const {
    std::string who = o_.rank_name(peers[0]);
    for (std::size_t i = 1; i < peers.size(); ++i)
      who += (i + 1 == peers.size() ? " or " : ", ") + o_.rank_name(peers[i]);
    const bool timed_out =
        what.find("Timed out") != std::string::npos || what.find("timeout") != std::string::npos;
    std::string how = timed_out
                          ? (recv ? "nothing from it" : "it took no message of ours") +
                                std::string(" for ") +
                                format_time(static_cast<TimeNs>(timeout_.count()) * kNsPerMs) + ", "
                          : std::string();
    return PeerError(peers[0], "lost " + who + " (" + how + "in the " + phase + "): " + what);
  }

  std::uint32_t crc(const std::uint8_t* p, std::size_t n) const {
    return transport::crc32c(0, p, n);
  }

  // dst += got (n bytes) in blocks that stay in the L1 cache, each block's CRC32C taken
  // from the cache right after it is read (of `got`, to check it) and after it is written
  // (of `dst`, the checksum it will be sent on with): one pass over memory, not three.
  // Returns the CRC32C of got; *made (if not null) gets dst's.
  std::uint32_t reduce_with_crc(std::uint8_t* dst, const std::uint8_t* got, std::size_t n,
                                std::uint32_t* made) const {
    constexpr std::size_t kBlock = 8 * 1024;
    std::uint32_t in = 0, out = 0;
    for (std::size_t at = 0; at < n; at += kBlock) {
      const std::size_t len = std::min(kBlock, n - at);
      if (o_.checksums) in = transport::crc32c(in, got + at, len);
      reduce_(dst + at, dst + at, got + at, len / es_);
      if (o_.checksums && made != nullptr) out = transport::crc32c(out, dst + at, len);
    }
    if (made != nullptr) *made = out;
    return in;
  }

  // A received message of `n` bytes at `got` from `from`, checked against the checksum it
  // came with while it is added to `dst` (the reduce-scatter); *made as reduce_with_crc.
  // On a mismatch the collective fails: its result is never handed over or forwarded.
  void check_and_reduce(int from, std::uint8_t* dst, std::uint8_t* got, std::size_t n,
                        std::uint32_t carried, std::uint32_t* made) const {
    if (o_.tamper) o_.tamper(from, reinterpret_cast<std::byte*>(got), n);
    const std::uint32_t computed = reduce_with_crc(dst, got, n, made);
    if (o_.checksums && computed != carried)
      corrupted(from, "reduce-scatter", n, computed, carried);
  }

  [[noreturn]] void corrupted(int from, const char* phase, std::size_t n, std::uint32_t got,
                              std::uint32_t carried) const {
    const std::string what =
        "corrupted data from " + o_.rank_name(from) + ": a " + phase + " message of " +
        std::to_string(n) + " bytes failed its CRC32C check (" + hex32(got) + " computed, " +
        hex32(carried) + " carried); nothing of this all-reduce was handed over or passed on";
    if (o_.on_corrupted) o_.on_corrupted(from, what);
    throw PeerError(from, what);
  }

  // A received message of `n` bytes at `p` from `from`, against the checksum it came with.
  void check(int from, std::uint8_t* p, std::size_t n, std::uint32_t carried,
             const char* phase) const {
    if (o_.tamper) o_.tamper(from, reinterpret_cast<std::byte*>(p), n);
    if (!o_.checksums) return;
    const std::uint32_t got = crc(p, n);
    if (got != carried) corrupted(from, phase, n, got, carried);
  }

  const CheckedAllreduceOptions& o_;
  gloo::Context& ctx_;
  std::uint8_t* out_;
  std::size_t total_, es_;
  ReduceFn reduce_;
  std::chrono::milliseconds timeout_;
};

struct Span {
  std::size_t send_offset, recv_offset;
  std::ptrdiff_t send_length, recv_length;
};

// gloo's ring (allreduce.cc): a reduce-scatter sending to rank - 1 and receiving from
// rank + 1, then an all-gather the same way, over segments of at most segment_bytes, two
// in flight each way.
void Run::ring() {
  const int n = ctx_.size, rank = ctx_.rank;
  const int recv_rank = (rank + 1) % n, send_rank = (rank + n - 1) % n;
  const auto round_up = [](std::size_t v, std::size_t m) { return (v + m - 1) / m * m; };
  const std::size_t max_segment = es_ * std::max<std::size_t>(1, o_.segment_bytes / es_);
  const std::size_t segments =
      round_up(std::max((total_ + max_segment - 1) / max_segment, static_cast<std::size_t>(n) * 2),
               static_cast<std::size_t>(n));
  const std::size_t per_rank = segments / static_cast<std::size_t>(n);
  const std::size_t segment = round_up((total_ + segments - 1) / segments, es_);
  const std::size_t span = segments * segment;
  const auto length = [&](std::size_t offset) {
    return std::min<std::ptrdiff_t>(
        static_cast<std::ptrdiff_t>(segment),
        static_cast<std::ptrdiff_t>(total_) - static_cast<std::ptrdiff_t>(offset));
  };

  std::vector<std::uint8_t> tmp(segment * 2);
  std::uint32_t send_crc[2] = {0, 0}, recv_crc[2] = {0, 0};
  // Per segment: the checksum of what this rank reduced into it (made), of what it
  // received into it in the all-gather (held): what it is sent on with.
  std::vector<std::uint32_t> made(segments, 0), held(segments, 0);
  // Declared after the memory they point into: destroyed first.
  Buffer out = ctx_.createUnboundBuffer(out_, total_);
  Buffer scratch = ctx_.createUnboundBuffer(tmp.data(), tmp.size());
  Buffer crc_out = ctx_.createUnboundBuffer(send_crc, sizeof send_crc);
  Buffer crc_in = ctx_.createUnboundBuffer(recv_crc, sizeof recv_crc);
  const CloseOnFailure close_on_failure(ctx_);
  const bool cs = o_.checksums;
  const std::size_t steps = segments - per_rank;

  // Reduce-scatter: step i sends segment (rank + 1) * per_rank + i (this rank's own data
  // for the first per_rank steps, then the partial sums it reduced) and receives segment
  // (rank + 2) * per_rank + i, which it adds to its own.
  // Step i of a phase whose sends start at rank + `first` (the receives one rank later).
  const auto step = [&](int first, std::size_t i) {
    Span s{};
    s.send_offset = ((static_cast<std::size_t>(rank + first) * per_rank + i) * segment) % span;
    s.recv_offset = ((static_cast<std::size_t>(rank + first + 1) * per_rank + i) * segment) % span;
    s.send_length = length(s.send_offset);
    s.recv_length = length(s.recv_offset);
    return s;
  };
  const auto rs = [&](std::size_t i) { return step(1, i); };
  for (std::size_t i = 0; i < steps + 2; ++i) {
    if (i >= 2) {
      const Span prev = rs(i - 2);
      if (prev.recv_length > 0) {
        wait(*scratch, true, recv_rank, "reduce-scatter");
        if (cs) wait(*crc_in, true, recv_rank, "reduce-scatter");
        check_and_reduce(recv_rank, out_ + prev.recv_offset, tmp.data() + (i & 1) * segment,
                         static_cast<std::size_t>(prev.recv_length), recv_crc[i & 1],
                         &made[prev.recv_offset / segment]);
      }
      if (prev.send_length > 0) {
        wait(*out, false, send_rank, "reduce-scatter");
        if (cs) wait(*crc_out, false, send_rank, "reduce-scatter");
      }
    }
    if (i < steps) {
      const Span cur = rs(i);
      if (cur.recv_length > 0) {
        post(*scratch, true, recv_rank, kDataSlot, (i & 1) * segment,
             static_cast<std::size_t>(cur.recv_length), "reduce-scatter");
        if (cs) post(*crc_in, true, recv_rank, kCrcSlot, (i & 1) * 4, 4, "reduce-scatter");
      }
      if (cur.send_length > 0) {
        if (cs) {
          // Its own gradients for the first per_rank steps; then a segment it reduced per_rank
          // steps before (2 or more: done).
          send_crc[i & 1] =
              i < per_rank ? crc(out_ + cur.send_offset, static_cast<std::size_t>(cur.send_length))
                           : made[cur.send_offset / segment];
          post(*crc_out, false, send_rank, kCrcSlot, (i & 1) * 4, 4, "reduce-scatter");
        }
        post(*out, false, send_rank, kDataSlot, cur.send_offset,
             static_cast<std::size_t>(cur.send_length), "reduce-scatter");
      }
    }
  }

  // All-gather: step i sends segment rank * per_rank + i (its own reduced segments first,
  // then those it received per_rank steps before, with the checksum they came with) and
  // receives segment (rank + 1) * per_rank + i into place.
  const auto ag = [&](std::size_t i) { return step(0, i); };
  for (std::size_t i = 0; i < steps + 2; ++i) {
    if (i >= 2) {
      const Span prev = ag(i - 2);
      if (prev.recv_length > 0) {
        wait(*out, true, recv_rank, "all-gather");
        if (cs) wait(*crc_in, true, recv_rank, "all-gather");
        check(recv_rank, out_ + prev.recv_offset, static_cast<std::size_t>(prev.recv_length),
              recv_crc[i & 1], "all-gather");
        held[prev.recv_offset / segment] = recv_crc[i & 1];
      }
      if (prev.send_length > 0) {
        wait(*out, false, send_rank, "all-gather");
        if (cs) wait(*crc_out, false, send_rank, "all-gather");
      }
    }
    if (i < steps) {
      const Span cur = ag(i);
      if (cur.recv_length > 0) {
        post(*out, true, recv_rank, kDataSlot, cur.recv_offset,
             static_cast<std::size_t>(cur.recv_length), "all-gather");
        if (cs) post(*crc_in, true, recv_rank, kCrcSlot, (i & 1) * 4, 4, "all-gather");
      }
      if (cur.send_length > 0) {
        if (cs) {
          // Its own chunk, whose every segment it reduced last in the reduce-scatter; then a
          // segment received (and checked) per_rank >= 2 steps before.
          send_crc[i & 1] =
              i < per_rank ? made[cur.send_offset / segment] : held[cur.send_offset / segment];
          post(*crc_out, false, send_rank, kCrcSlot, (i & 1) * 4, 4, "all-gather");
        }
        post(*out, false, send_rank, kDataSlot, cur.send_offset,
             static_cast<std::size_t>(cur.send_length), "all-gather");
      }
    }
  }
}

// gloo's bcube with groups of 2 (allreduce.cc): at each step of the reduce-scatter a rank
// exchanges with the other members of its group the chunks each is responsible for, then
// the all-gather runs the groups in reverse. With 2^k ranks: recursive halving-doubling.
void Run::bcube() {
  const int n = ctx_.size, rank = ctx_.rank;
  const std::size_t elements = total_ / es_;
  std::vector<std::size_t> group_sizes;
  for (std::size_t size = static_cast<std::size_t>(n); size > 1;) {
    if (size % 2 == 0) {
      group_sizes.push_back(2);
      size /= 2;
    } else {
      group_sizes.push_back(size);
      break;
    }
  }
  struct Group {
    std::size_t distance = 1, offset = 0, length = 0;  // elements
    std::vector<int> ranks;
    std::size_t chunk = 0, my_offset = 0, my_length = 0;
    std::size_t length_of(std::size_t i) const {
      return std::min(
          chunk, static_cast<std::size_t>(std::max<std::int64_t>(
                     0, static_cast<std::int64_t>(length) - static_cast<std::int64_t>(i * chunk))));
    }
  };
  std::vector<Group> groups;
  Group g;
  g.length = elements;
  for (std::size_t size : group_sizes) {
    const std::size_t group_rank = (static_cast<std::size_t>(rank) / g.distance) % size;
    const std::size_t base = static_cast<std::size_t>(rank) - group_rank * g.distance;
    g.ranks.clear();
    for (std::size_t i = 0; i < size; ++i)
      g.ranks.push_back(static_cast<int>(base + i * g.distance));
    g.chunk = (g.length + size - 1) / size;
    g.my_offset = g.offset + group_rank * g.chunk;
    g.my_length = g.length_of(group_rank);
    groups.push_back(g);
    Group next;
    next.distance = g.distance * size;
    next.offset = g.my_offset;
    next.length = g.my_length;
    g = next;
  }
  std::size_t scratch_elements = elements;
  for (const Group& gr : groups)
    scratch_elements = std::max(scratch_elements, gr.ranks.size() * gr.chunk);
  std::vector<std::uint8_t> tmp(scratch_elements * es_);
  std::size_t widest = 0;
  for (const Group& gr : groups) widest = std::max(widest, gr.ranks.size());
  std::vector<std::uint32_t> send_crc(widest), recv_crc(widest);
  Buffer out = ctx_.createUnboundBuffer(out_, total_);
  Buffer scratch = ctx_.createUnboundBuffer(tmp.data(), tmp.size());
  Buffer crc_out = ctx_.createUnboundBuffer(send_crc.data(), send_crc.size() * 4);
  Buffer crc_in = ctx_.createUnboundBuffer(recv_crc.data(), recv_crc.size() * 4);
  const CloseOnFailure close_on_failure(ctx_);
  const bool cs = o_.checksums;
  std::uint32_t mine = 0;  // the checksum of this rank's chunk after the last reduce-scatter step

  for (const Group& gr : groups) {
    std::vector<int> peers;
    for (std::size_t i = 0; i < gr.ranks.size(); ++i) {
      const int src = gr.ranks[i];
      if (src == rank) continue;
      peers.push_back(src);
      post(*scratch, true, src, kDataSlot, i * gr.chunk * es_, gr.my_length * es_,
           "reduce-scatter");
      if (cs) post(*crc_in, true, src, kCrcSlot, i * 4, 4, "reduce-scatter");
    }
    for (std::size_t i = 0; i < gr.ranks.size(); ++i) {
      const int dst = gr.ranks[i];
      if (dst == rank) continue;
      const std::size_t at = (gr.offset + i * gr.chunk) * es_, len = gr.length_of(i) * es_;
      if (cs) {
        send_crc[i] = crc(out_ + at, len);
        post(*crc_out, false, dst, kCrcSlot, i * 4, 4, "reduce-scatter");
      }
      post(*out, false, dst, kDataSlot, at, len, "reduce-scatter");
    }
    wait_all(*scratch, true, peers, "reduce-scatter");
    if (cs) wait_all(*crc_in, true, peers, "reduce-scatter");
    wait_all(*out, false, peers, "reduce-scatter");
    if (cs) wait_all(*crc_out, false, peers, "reduce-scatter");
    // Each message checked as it is added; the last addition gives the checksum of this
    // rank's chunk (the all-gather's first message when this is the last step).
    const int last = peers.back();
    for (std::size_t i = 0; i < gr.ranks.size(); ++i) {
      if (gr.ranks[i] == rank) continue;
      check_and_reduce(gr.ranks[i], out_ + gr.my_offset * es_, tmp.data() + i * gr.chunk * es_,
                       gr.my_length * es_, recv_crc[i], gr.ranks[i] == last ? &mine : nullptr);
    }
  }

  for (auto it = groups.rbegin(); it != groups.rend(); ++it) {
    const Group& gr = *it;
    std::vector<int> peers;
    for (std::size_t i = 0; i < gr.ranks.size(); ++i) {
      const int src = gr.ranks[i];
      if (src == rank) continue;
      peers.push_back(src);
      post(*out, true, src, kDataSlot, (gr.offset + i * gr.chunk) * es_, gr.length_of(i) * es_,
           "all-gather");
      if (cs) post(*crc_in, true, src, kCrcSlot, i * 4, 4, "all-gather");
    }
    if (cs)
      send_crc[0] =
          it == groups.rbegin() ? mine : crc(out_ + gr.my_offset * es_, gr.my_length * es_);
    for (int dst : peers) {
      if (cs) post(*crc_out, false, dst, kCrcSlot, 0, 4, "all-gather");
      post(*out, false, dst, kDataSlot, gr.my_offset * es_, gr.my_length * es_, "all-gather");
    }
    wait_all(*out, true, peers, "all-gather");
    if (cs) wait_all(*crc_in, true, peers, "all-gather");
    wait_all(*out, false, peers, "all-gather");
    if (cs) wait_all(*crc_out, false, peers, "all-gather");
    for (std::size_t i = 0; i < gr.ranks.size(); ++i) {
      if (gr.ranks[i] == rank) continue;
      check(gr.ranks[i], out_ + (gr.offset + i * gr.chunk) * es_, gr.length_of(i) * es_,
            recv_crc[i], "all-gather");
    }
  }
}

}  // namespace

void checked_allreduce(const CheckedAllreduceOptions& options, void* data, std::size_t elements,
                       std::size_t element_size, ReduceFn reduce) {
  if (elements == 0 || options.context->size == 1) return;
  Run run(options, static_cast<std::uint8_t*>(data), elements, element_size, reduce);
  switch (options.algorithm) {
    case GlooAlgorithm::kRing:
    case GlooAlgorithm::kRingChunked:
      run.ring();
      return;
    case GlooAlgorithm::kHalvingDoubling:
    case GlooAlgorithm::kBcube:
      run.bcube();
      return;
  }
}

void ignore_sigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
      !(old.sa_flags & SA_SIGINFO)) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace qs::runtime
