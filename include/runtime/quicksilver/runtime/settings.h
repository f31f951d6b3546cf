// The runtime's own settings: how every node's transport behaves (congestion control,
// commit window, timeouts, checksums). Not a policy's knobs (policy/registry.h) and not the
// job's shape (model, workers, servers). Each front end (the role commands' flags, `run`'s
// flags, the launcher, the job message its children read, the Python session) carries the
// one struct whole into runtime::JobOptions, and the table below is the one place that
// names each setting: its flag, its message field, its check and its help. A new setting
// is one struct field and one table row.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"

namespace qs::runtime {

// The defaults are the command line's (docs/cli.md). A front end that wants others says so
// where it builds its struct, with its reason (the Python session: long timeouts, since
// the user's loop may pause for evaluation or a checkpoint).
struct RuntimeSettings {
  // TCP congestion control of every data socket (TCP_CONGESTION). MACHINE-NOTES: the
  // machines' default (bbr) is 2-4x slower than cubic on loopback and veth.
  std::string congestion = "cubic";
  // How long an urgent unit may wait, at the job's bandwidth, behind bytes a connection
  // already committed past the sending buffer, where preemption cannot reach them: each
  // socket's TCP_NOTSENT_LOWAT is the bytes the NIC sends in this time (at least 8 KiB),
  // and the Sender commits at most twice that to one connection per write. A time, not a
  // byte count, so that a scaled-down emulated cluster keeps the real one's behaviour
  // (128 KiB at 10 Gbit/s is 6.5 KiB at 500 Mbit/s). 0: the socket options' own
  // notsent_lowat and a 256 KiB batch. >= 0.
  TimeNs commit_window = 100 * kNsPerUs;
  // Rendezvous deadline: every connection of the job made and greeted. > 0.
  TimeNs connect_timeout = 20 * kNsPerSec;
  // Longest silence of a connection (no byte, heartbeats included) before its peer is
  // taken as lost. Twice this without a push reaching a server whose sums wait (three
  // times without a pull or ack reaching a worker that waits) fails the job too, naming
  // who is waited for: a peer alive but stuck. > 0.
  TimeNs peer_timeout = 20 * kNsPerSec;
  // Every frame's payload carries its CRC32C and every received one is checked
  // (transport::Connection::set_payload_checksums). Must be the same on every node.
  bool payload_checksums = true;

  friend bool operator==(const RuntimeSettings&, const RuntimeSettings&) = default;
};

enum class SettingKind {
  kText,    // a word ("cubic")
  kTime,    // a time as parse_time reads it ("20s"); in a job message, integer "<name>_ns"
  kSwitch,  // on or off; its flag turns it off ("--no-checksum")
};

struct RuntimeSetting {
  std::string_view name;  // "peer_timeout": the Python keyword, the message field's stem
  std::string_view flag;  // "--peer-timeout"
  SettingKind kind;
  std::string_view help;  // the flag's help line
  // The field, by kind (the others null).
  std::string RuntimeSettings::*text = nullptr;
  TimeNs RuntimeSettings::*time = nullptr;
  bool RuntimeSettings::*on = nullptr;
  bool positive = false;  // a time: must be > 0 (else >= 0)
};

// Every setting, in the order of the struct.
std::span<const RuntimeSetting> runtime_settings();

// The setting named `name` ("peer_timeout"; "peer-timeout" and "--peer-timeout" too).
// Error: "unknown runtime setting 'x' (settings: congestion, ...)".
Result<const RuntimeSetting*> find_setting(std::string_view name);

// Sets `s` from `text` as the setting's flag spells it: "bbr", "20s", "true"/"false" for a
// switch. Errors name the flag ("--peer-timeout: ..."), and a value out of range says so.
Status set_setting(RuntimeSettings& settings, const RuntimeSetting& s, std::string_view text);
// The setting's value as set_setting reads it ("20s", "cubic", "true").
std::string format_setting(const RuntimeSettings& settings, const RuntimeSetting& s);

// The one setting in range ("--peer-timeout must be > 0").
Status check_setting(const RuntimeSettings& settings, const RuntimeSetting& s);
// Every setting in range, errors naming the flag ("--peer-timeout must be > 0"); the
// congestion control one this kernel has (transport::check_congestion_available).
Status check_settings(const RuntimeSettings& settings);

}  // namespace qs::runtime
