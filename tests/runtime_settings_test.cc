// The runtime's settings table (quicksilver/runtime/settings.h): every field of the struct
// has one row, each row reads back what it formats, errors name the flag, and the front
// ends carry the struct whole (the job message's codec, the node's JobOptions). And the
// launcher's automatic scale: its calibration's first candidate.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "quicksilver/launch/job_message.h"
#include "quicksilver/launch/launcher.h"
#include "quicksilver/runtime/netns.h"
#include "quicksilver/runtime/settings.h"

namespace qs::runtime {
namespace {

// Every setting away from its default.
RuntimeSettings changed() {
  RuntimeSettings s;
  s.congestion = "reno";
  s.commit_window = 250 * kNsPerUs;
  s.connect_timeout = 3 * kNsPerSec;
  s.peer_timeout = 1500 * kNsPerMs;
  s.payload_checksums = false;
  return s;
}

TEST(RuntimeSettings, EveryFieldHasOneRowAndEachRowRoundTrips) {
  const RuntimeSettings want = changed();
  RuntimeSettings got;
  std::set<std::string_view> names, flags;
  for (const RuntimeSetting& s : runtime_settings()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    EXPECT_TRUE(flags.insert(s.flag).second) << s.flag;
    EXPECT_EQ(s.flag.substr(0, 2), "--");
    EXPECT_FALSE(s.help.empty()) << s.name;
    const int fields = (s.text != nullptr) + (s.time != nullptr) + (s.on != nullptr);
    EXPECT_EQ(fields, 1) << s.name;
    ASSERT_TRUE(set_setting(got, s, format_setting(want, s)).is_ok()) << s.name;
  }
  // Each row wrote its own field: a field without a row would keep its default here.
  EXPECT_EQ(got, want);
  EXPECT_NE(RuntimeSettings{}, want);
}

TEST(RuntimeSettings, FindsByNameFlagOrDashes) {
  for (const char* name : {"peer_timeout", "peer-timeout", "--peer-timeout"}) {
    auto s = find_setting(name);
    ASSERT_TRUE(s.is_ok()) << name;
    EXPECT_EQ((*s)->name, "peer_timeout");
  }
  auto bad = find_setting("peer_timout");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("unknown runtime setting 'peer_timout'"),
            std::string::npos);
  EXPECT_NE(bad.status().message().find("connect_timeout"), std::string::npos);
}

TEST(RuntimeSettings, ErrorsNameTheFlag) {
  RuntimeSettings s;
  const RuntimeSetting& peer = **find_setting("peer_timeout");
  Status zero = set_setting(s, peer, "0s");
  ASSERT_FALSE(zero.is_ok());
  EXPECT_NE(zero.message().find("--peer-timeout must be > 0"), std::string::npos);
  Status junk = set_setting(s, peer, "soon");
  ASSERT_FALSE(junk.is_ok());
  EXPECT_NE(junk.message().find("--peer-timeout"), std::string::npos);
  EXPECT_TRUE(set_setting(s, **find_setting("commit_window"), "0s").is_ok());  // >= 0 is fine
  Status sw = set_setting(s, **find_setting("payload_checksums"), "maybe");
  ASSERT_FALSE(sw.is_ok());
  EXPECT_NE(sw.message().find("--no-checksum"), std::string::npos);

  RuntimeSettings bad;
  bad.connect_timeout = -1;
  Status c = check_settings(bad);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.message().find("--connect-timeout must be > 0"), std::string::npos);
  bad = RuntimeSettings{};
  bad.congestion = "no_such_congestion_control";
  Status cc = check_settings(bad);
  ASSERT_FALSE(cc.is_ok());
  EXPECT_NE(cc.message().find("--congestion"), std::string::npos);
}

// The launcher's message carries every setting to its child, and the child's job has them.
TEST(RuntimeSettings, ReachTheNodeThroughTheJobMessage) {
  JobMessage m;
  m.model = "resnet18";
  m.policy = "mercury";
  m.settings = changed();
  m.settings.congestion = "cubic";  // one this kernel has (job_options checks it)
  auto back = decode(encode(m));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->settings, m.settings);
  auto job = job_options(*back);
  ASSERT_TRUE(job.is_ok()) << job.status().to_string();
  EXPECT_EQ(static_cast<const RuntimeSettings&>(*job), m.settings);
}

TEST(LinkShaping, WithoutNetnsOnlyTheDefaults) {
  LinkShaping s;
  EXPECT_TRUE(check_link_shaping(s, false).is_ok());
  s.rto_min = 5 * kNsPerMs;
  EXPECT_NE(check_link_shaping(s, false).message().find("--rto-min needs --netns"),
            std::string::npos);
  EXPECT_TRUE(check_link_shaping(s, true).is_ok());
  s = LinkShaping{};
  s.quickack = true;
  EXPECT_NE(check_link_shaping(s, false).message().find("--quickack needs --netns"),
            std::string::npos);
  s = LinkShaping{};
  s.gso_max = 64 * kKiB;
  EXPECT_NE(check_link_shaping(s, false).message().find("--host-gso need --netns"),
            std::string::npos);
  s.host_queue = 10;
  EXPECT_NE(check_link_shaping(s, true).message().find("--host-queue must be in 100us..1s"),
            std::string::npos);
  s = LinkShaping{};
  s.rto_min = 61 * kNsPerSec;
  EXPECT_NE(check_link_shaping(s, true).message().find("--rto-min must be in 0..60s"),
            std::string::npos);
}

}  // namespace
}  // namespace qs::runtime

// `run --netns`'s automatic scale starts at 1 Gbit/s of all the links per core, never below
// the 4 Gbit/s that this project's 2-core machine was calibrated from: a 16-core machine
// emulates 8 + 8 hosts at 1 Gbit/s each, not 250 Mbit/s (docs/benchmarks.md, stage e).
TEST(Calibration, FirstCandidateGrowsWithTheCores) {
  EXPECT_DOUBLE_EQ(qs::calibration_start_rate(1), 4e9);
  EXPECT_DOUBLE_EQ(qs::calibration_start_rate(2), 4e9);
  EXPECT_DOUBLE_EQ(qs::calibration_start_rate(4), 4e9);
  EXPECT_DOUBLE_EQ(qs::calibration_start_rate(16), 16e9);
  EXPECT_DOUBLE_EQ(qs::calibration_start_rate(0), 4e9);  // affinity unreadable
}
