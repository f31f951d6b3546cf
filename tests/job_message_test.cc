// The job message (quicksilver/launch/job_message.h): what the launcher encodes, its
// child decodes to the same message; another version and a malformed field are refused,
// naming them; the message maps to the runtime's job as the flags do.
#include "quicksilver/launch/job_message.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace qs {
namespace {

// Every field away from its default, the knobs of both architectures included.
JobMessage populated() {
  JobMessage m;
  m.role = ChildRole::kServer;
  m.model = "/tmp/qs-run-1-abcdef/profile.json";
  m.device = "a100";
  m.batch_size = 16;
  m.policy = "bytescheduler";
  m.knobs.packet_size = 12 * kKiB;
  m.knobs.partition_size = 123'457;
  m.knobs.startup_time = 7 * kNsPerUs;
  m.knobs.mercury_server_fifo = true;
  m.knobs.prophet_allow_overrun = true;
  m.knobs.deft_mu = 1.23456789;
  m.knobs.deft_epsilon = 1.0 / 3.0;
  m.knobs.deft_exact_max_items = 5;
  m.architecture = Architecture::kAllReduce;
  m.workers = 7;
  m.servers = 3;
  m.iterations = 11;
  m.warmup = 2;
  m.bandwidth = Rate{123'456'789};
  m.seed = 18'446'744'073'709'551'615ULL;  // the largest: a JSON unsigned integer
  m.knobs.seed = m.seed;
  m.allreduce = AllReduceAlgorithm::kRecursiveHalvingDoubling;
  m.gloo_algorithm = "bcube";
  m.second_link = 2.0 / 3.0 + 1;
  m.compression = transport::WireDType::kBFloat16;
  m.settings.congestion = "reno";
  m.settings.commit_window = 0;
  m.settings.connect_timeout = 3 * kNsPerSec + 1;
  m.settings.peer_timeout = 5 * kNsPerMs;
  m.settings.payload_checksums = false;
  m.secret_file = "/tmp/qs-run-1-abcdef/secret";
  m.insecure = true;
  m.id = 6;
  m.listen = "10.0.0.1:7100";
  m.coordinator = "10.0.0.2:7000";
  m.connect = {"10.0.0.3:7100", "[::1]:7101"};
  m.links = {"10.1.0.7", "10.2.0.7"};
  m.pacing_rate = Rate{2'000'000'001};
  m.nic_rate = Rate{5'000'000'000};
  m.slowdown = 1.2345678901234;
  m.die_at_iteration = 3;
  m.announce_start = true;
  m.verify = false;
  m.gloo_via = "1=127.0.0.1:9";
  m.trace = "/tmp/qs-run-1-abcdef/worker6.trace.json";
  m.trace_detail = "coarse";
  m.json = true;
  m.timeout = 42 * kNsPerSec;
  return m;
}

// The populated message's JSON with `field` set to `value` (a JSON text).
std::string with_field(const std::string& field, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(encode(populated()));
  j[field] = nlohmann::json::parse(value);
  return j.dump();
}

// decode(text) fails, and its message holds every one of `needles`.
void expect_refused(const std::string& text, std::initializer_list<std::string> needles) {
  auto m = decode(text);
  ASSERT_FALSE(m.is_ok()) << text;
  for (const std::string& n : needles) {
    EXPECT_NE(m.status().message().find(n), std::string::npos)
        << "'" << m.status().message() << "' lacks '" << n << "'";
  }
}

TEST(JobMessage, RoundTripsAPopulatedMessage) {
  const JobMessage m = populated();
  ASSERT_NE(m, JobMessage{});
  auto back = decode(encode(m));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, m);
  EXPECT_EQ(back->knobs, m.knobs);
  EXPECT_EQ(back->knobs.deft_mu, 1.23456789);  // exact, not printed to 6 digits
  EXPECT_EQ(back->slowdown, m.slowdown);
}

TEST(JobMessage, RoundTripsTheDefaultsAndEveryRole) {
  for (ChildRole r : {ChildRole::kCoordinator, ChildRole::kServer, ChildRole::kWorker}) {
    JobMessage m;
    m.role = r;
    auto back = decode(encode(m));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(*back, m) << child_role_name(r);
  }
}

TEST(JobMessage, EncodesUnitsInTheFieldNames) {
  const nlohmann::json j = nlohmann::json::parse(encode(populated()));
  EXPECT_EQ(j.at("version"), kJobMessageVersion);
  EXPECT_EQ(j.at("role"), "server");
  EXPECT_EQ(j.at("peer_timeout_ns"), 5 * kNsPerMs);
  EXPECT_EQ(j.at("bandwidth_bps"), 123'456'789);
  EXPECT_EQ(j.at("architecture"), "allreduce");
  EXPECT_EQ(j.at("knobs").at("packet_size"), "12288B");
}

TEST(JobMessage, AFieldLeftOutKeepsItsDefault) {
  auto m = decode(R"({"version": 1, "role": "server", "workers": 2})");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  JobMessage want;
  want.role = ChildRole::kServer;
  want.workers = 2;
  EXPECT_EQ(*m, want);
}

TEST(JobMessage, RefusesAnotherVersion) {
  const std::string build = "the launcher and its children must be the same quicksilver build";
  expect_refused(with_field("version", "2"), {"version 2", build});
  expect_refused(with_field("version", "\"1\""), {"version \"1\"", build});
  nlohmann::json j = nlohmann::json::parse(encode(populated()));
  j.erase("version");
  expect_refused(j.dump(), {"'version'", build});
}

TEST(JobMessage, RefusesAMalformedFieldNamingIt) {
  expect_refused(with_field("peer_timeout_ns", "\"20s\""),
                 {"field 'peer_timeout_ns'", "nanoseconds"});
  expect_refused(with_field("commit_window_ns", "-1"), {"field 'commit_window_ns'"});
  expect_refused(with_field("workers", "2.5"), {"field 'workers'", "integer"});
  expect_refused(with_field("workers", "4294967296"), {"field 'workers'"});
  expect_refused(with_field("role", "\"scheduler\""), {"field 'role'", "scheduler"});
  expect_refused(with_field("architecture", "\"mesh\""), {"field 'architecture'"});
  expect_refused(with_field("compression", "\"fp8\""), {"field 'compression'"});
  expect_refused(with_field("connect", "\"10.0.0.3:7100\""), {"field 'connect'", "array"});
  expect_refused(with_field("json", "1"), {"field 'json'"});
  expect_refused(with_field("knobs", R"({"packet_size": "0B"})"),
                 {"field 'knobs'", "'packet_size'", "--packet-size"});
  expect_refused(with_field("knobs", R"({"packet_size": 32768})"), {"'packet_size'", "string"});
  expect_refused(with_field("knobs", R"({"packet_sise": "1KiB"})"), {"'packet_sise'", "no knob"});
  expect_refused(with_field("listen_address", "\"127.0.0.1:0\""),
                 {"field 'listen_address'", "no such field"});
  expect_refused("{\"version\": 1, \"workers\": ", {"not JSON"});
  expect_refused("[1, 2]", {"not a JSON object"});
}

TEST(JobMessage, FilesRoundTripAndErrorsNameThem) {
  const std::string dir = testing::TempDir() + "qs-job-message-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/worker0.job.json";
  ASSERT_TRUE(write_job_message(populated(), path).is_ok());
  auto back = read_job_message(path);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, populated());
  std::ofstream(path) << with_field("warmup", "\"one\"");
  auto bad = read_job_message(path);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find(path), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("'warmup'"), std::string::npos) << bad.status().message();
  auto missing = read_job_message(dir + "/none.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("none.json"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(JobMessage, MapsToTheRuntimeJob) {
  JobMessage m;
  m.model = "resnet50";
  m.policy = "mercury";
  m.workers = 2;
  m.servers = 1;
  m.iterations = 3;
  m.seed = 9;
  m.knobs.packet_size = 64 * kKiB;
  m.pacing_rate = Rate::gbps(8);
  m.settings.peer_timeout = 7 * kNsPerSec;
  m.compression = transport::WireDType::kFloat16;
  auto o = job_options(m);
  ASSERT_TRUE(o.is_ok()) << o.status().to_string();
  EXPECT_EQ(o->profile.name, "resnet50");
  EXPECT_EQ(o->policy, "mercury");
  EXPECT_EQ(o->workers, 2);
  EXPECT_EQ(o->servers, 1);
  EXPECT_EQ(o->iterations, 3);
  EXPECT_EQ(o->policy_options.packet_size, 64 * kKiB);
  EXPECT_EQ(o->policy_options.seed, 9u);
  EXPECT_EQ(o->socket.max_pacing_rate, 1'000'000'000);  // bytes per second
  EXPECT_EQ(o->peer_timeout, 7 * kNsPerSec);
  EXPECT_EQ(o->wire_dtype, transport::WireDType::kFloat16);

  m.policy = "all";
  auto all = job_options(m);
  ASSERT_FALSE(all.is_ok());
  EXPECT_NE(all.status().message().find("exactly one policy"), std::string::npos);
  m.policy = "mercury";
  m.settings.peer_timeout = 0;
  auto zero = job_options(m);
  ASSERT_FALSE(zero.is_ok());
  EXPECT_NE(zero.status().message().find("--peer-timeout must be > 0"), std::string::npos);
}

}  // namespace
}  // namespace qs
