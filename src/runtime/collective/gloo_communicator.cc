// gloo over TCP as the all-reduce runtime's engine (gloo_communicator.h).
#include "gloo_communicator.h"

#include <arpa/inet.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>

#include "../runtime_internal.h"
#include "checked_allreduce.h"
#include "quicksilver/core/thread_name.h"
#include "quicksilver/runtime/store.h"

namespace qs::runtime {

namespace {

std::chrono::milliseconds to_ms_duration(TimeNs t) {
  return std::chrono::milliseconds(std::max<TimeNs>(1, t / kNsPerMs));
}

// gloo's rendezvous store over the coordinator's (store.h). gloo reports a store failure
// by exception; ours carry the coordinator's message. `rewrite`: applied to every value
// read (CollectiveOptions::via_rank).
class CoordinatorStore final : public gloo::rendezvous::Store {
 public:
  CoordinatorStore(StoreClient& client, TimeNs timeout,
                   std::function<void(const std::string&, std::vector<char>&)> rewrite = {},
                   std::function<void(const std::string&, const std::vector<char>&)> on_set = {})
      : client_(client),
        timeout_(timeout),
        rewrite_(std::move(rewrite)),
        on_set_(std::move(on_set)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    if (on_set_) on_set_(key, data);
    Status s = client_.set(key, std::string_view(data.data(), data.size()));
    if (!s.is_ok()) throw std::runtime_error(s.message());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = client_.get(key, timeout_);
    if (!v) throw std::runtime_error(v.status().message());
    std::vector<char> out(v->begin(), v->end());
    if (rewrite_) rewrite_(key, out);
    return out;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, to_ms_duration(timeout_)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& k : keys) {
      auto v = client_.get(k, static_cast<TimeNs>(timeout.count()) * kNsPerMs);
      if (!v) throw std::runtime_error(v.status().message());
    }
  }

 private:
  StoreClient& client_;
  TimeNs timeout_;
  std::function<void(const std::string&, std::vector<char>&)> rewrite_;
  std::function<void(const std::string&, const std::vector<char>&)> on_set_;
};

// The addresses a rank published for its pairs (gloo/rendezvous/context.cc: one
// gloo::transport::tcp::Address per peer, back to back) with `to`'s IPv4 address and port
// in place of each one's, their sequence numbers kept (they name the pair at the device).
// The addresses of such a value, in order ("[127.0.0.1]:41234").
std::vector<std::string> addresses(const std::vector<char>& value) {
  std::vector<std::string> out;
  const std::size_t one = gloo::transport::tcp::Address().bytes().size();
  for (std::size_t at = 0; one > 0 && at + one <= value.size(); at += one) {
    const gloo::transport::tcp::Address a(
        std::vector<char>(value.begin() + static_cast<std::ptrdiff_t>(at),
                          value.begin() + static_cast<std::ptrdiff_t>(at + one)));
    // Not a.str(): this gloo prints the port in network byte order.
    const sockaddr_storage& ss = a.getSockaddr();
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
      inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
      port = ntohs(in->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
      inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
      port = ntohs(in6->sin6_port);
    }
    out.push_back("[" + std::string(host) + "]:" + std::to_string(port));
  }
  return out;
}

void redirect_addresses(std::vector<char>& value, const Endpoint& to) {
  const std::size_t one = gloo::transport::tcp::Address().bytes().size();
  for (std::size_t at = 0; one > 0 && at + one <= value.size(); at += one) {
    const gloo::transport::tcp::Address a(
        std::vector<char>(value.begin() + static_cast<std::ptrdiff_t>(at),
                          value.begin() + static_cast<std::ptrdiff_t>(at + one)));
    sockaddr_storage ss = a.getSockaddr();
    if (ss.ss_family != AF_INET) throw std::runtime_error("via: the peer's address is not IPv4");
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    if (inet_pton(AF_INET, to.host.c_str(), &in->sin_addr) != 1)
      throw std::runtime_error("via: bad host " + to.host);
    in->sin_port = htons(static_cast<std::uint16_t>(to.port));
    const std::vector<char> b = gloo::transport::tcp::Address(ss, a.getSeq()).bytes();
    std::copy(b.begin(), b.end(), value.begin() + static_cast<std::ptrdiff_t>(at));
  }
}

// A control-channel buffer: one of gloo's unbound buffers on the control context.
class GlooControlBuffer final : public ControlBuffer {
 public:
  explicit GlooControlBuffer(std::unique_ptr<gloo::transport::UnboundBuffer> b)
      : buf_(std::move(b)) {}
  // gloo delivers a message shorter than the receive posted (tcp/pair.cc checks length <=
  // the receive's bytes).
  void send(int to, std::uint64_t slot, std::size_t bytes) override {
    buf_->send(to, slot, 0, bytes);
  }
  bool wait_send(TimeNs timeout) override { return buf_->waitSend(to_ms_duration(timeout)); }
  void recv(const std::vector<int>& from, std::uint64_t slot) override {
    if (from.size() == 1) {
      buf_->recv(from[0], slot);
    } else {
      buf_->recv(from, slot);
    }
  }
  bool wait_recv(int* from, TimeNs timeout) override {
    return buf_->waitRecv(from, to_ms_duration(timeout));
  }
  void abort_send() override { buf_->abortWaitSend(); }
  void abort_recv() override { buf_->abortWaitRecv(); }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
};

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(GlooSettings s) : s_(std::move(s)) {}

  std::string name() const { return "worker " + std::to_string(s_.rank); }

  // Every context: the control context and one per link, through the coordinator's store.
  // gloo throws on failure.
  Status connect() {
    QS_ASSIGN_OR_RETURN(store_client_,
                        StoreClient::connect(s_.store, s_.connect_timeout, s_.secret.get()));
    std::function<void(const std::string&, std::vector<char>&)> rewrite;
    if (s_.via_rank >= 0) {
      rewrite = [this](const std::string& key, std::vector<char>& value) {
        if (key == "link0/" + std::to_string(s_.via_rank)) redirect_addresses(value, s_.via);
      };
    }
    // The addresses this worker's pairs listen at, as it publishes them ("link0/1": link
    // 0's context, rank 1; one address per peer, in rank order).
    std::function<void(const std::string&, const std::vector<char>&)> on_set;
    if (s_.log) {
      on_set = [this](const std::string& key, const std::vector<char>& value) {
        const auto slash = key.find('/');
        if (slash == std::string::npos || key.substr(slash + 1) != std::to_string(s_.rank)) return;
        std::string line;
        int peer = 0;
        for (const std::string& a : addresses(value)) {
          if (peer == s_.rank) ++peer;
          line += (line.empty() ? "" : ", ") + a + " (worker " + std::to_string(peer++) + ")";
        }
        s_.log(name() + ": " + key.substr(0, slash) + " pairs listen at " + line);
      };
    }
    CoordinatorStore store(*store_client_, s_.connect_timeout, std::move(rewrite),
                           std::move(on_set));
    ignore_sigpipe();
    auto make = [&](const std::string& prefix, const std::string& host) {
      gloo::transport::tcp::attr attr;
      attr.hostname = host;
      // The device's I/O thread takes its name from this thread's at its start.
      char was[16] = "";
      pthread_getname_np(pthread_self(), was, sizeof was);
      name_this_thread("qs-gloo-" + prefix);
      auto dev = gloo::transport::tcp::CreateDevice(attr);
      name_this_thread(was);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(s_.rank, s_.workers);
      ctx->setTimeout(to_ms_duration(s_.peer_timeout));
      gloo::rendezvous::PrefixStore ps(prefix, store);
      ctx->connectFullMesh(ps, dev);
      devices_.push_back(dev);
      return ctx;
    };
    try {
      control_ = make("control", s_.links[0]);
      for (std::size_t l = 0; l < s_.links.size(); ++l)
        links_.push_back(make("link" + std::to_string(l), s_.links[l]));
    } catch (const std::exception& e) {
      return unavailable(name() + ": gloo rendezvous failed: " + e.what());
    }
    return store_client_->done(s_.rank).with_context(name());
  }

  int rank() const override { return s_.rank; }
  int size() const override { return s_.workers; }
  int links() const override { return static_cast<int>(links_.size()); }

  void all_reduce(int link, void* data, std::size_t count, ReduceOp op,
                  const AllReduceCall& call) override {
    CheckedAllreduceOptions o;
    o.context = link == kControl ? control_ : links_.at(static_cast<std::size_t>(link));
    o.algorithm = s_.algorithm;
    o.checksums = call.checksums;
    o.timeout = to_ms_duration(s_.peer_timeout);
    o.rank_name = [](int r) { return "worker " + std::to_string(r); };
    o.tamper = call.tamper;
    o.on_corrupted = call.on_corrupted;
    checked_allreduce(o, data, count, element_bytes(op), reduce_fn(op));
  }

  std::unique_ptr<ControlBuffer> control_buffer(void* data, std::size_t bytes) override {
    return std::make_unique<GlooControlBuffer>(control_->createUnboundBuffer(data, bytes));
  }

  void barrier() override {
    gloo::BarrierOptions o(control_);
    gloo::barrier(o);
  }

  // Every pair closed with SO_LINGER 0 (gloo/transport/tcp/pair.cc): the peers' reads end
  // with a reset, and their waits on this rank throw.
  void close() override {
    if (control_) control_->closeConnections();
    for (const auto& l : links_) l->closeConnections();
  }

 private:
  static ReduceFn reduce_fn(ReduceOp op) {
    switch (op) {
      case ReduceOp::kSumFloat32:
        return static_cast<ReduceFn>(&gloo::sum<float>);
      case ReduceOp::kSumFloat64:
        return static_cast<ReduceFn>(&gloo::sum<double>);
      case ReduceOp::kMaxFloat64:
        return static_cast<ReduceFn>(&gloo::max<double>);
      case ReduceOp::kSumBFloat16:
        return &reduce_bf16;
      case ReduceOp::kSumFloat16:
        return &reduce_fp16;
    }
    throw std::logic_error("unknown reduce op");
  }

  GlooSettings s_;
  std::unique_ptr<StoreClient> store_client_;
  std::vector<std::shared_ptr<gloo::transport::Device>> devices_;
  std::shared_ptr<gloo::Context> control_;
  std::vector<std::shared_ptr<gloo::Context>> links_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> connect_gloo(const GlooSettings& settings) {
  auto c = std::make_unique<GlooCommunicator>(settings);
  QS_RETURN_IF_ERROR(c->connect());
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace qs::runtime
