#include "quicksilver/runtime/settings.h"

#include <array>

#include "quicksilver/transport/socket.h"

namespace qs::runtime {
namespace {

using S = RuntimeSettings;

constexpr std::array kSettings{
    RuntimeSetting{.name = "congestion",
                   .flag = "--congestion",
                   .kind = SettingKind::kText,
                   .help = "TCP congestion control of every data socket (TCP_CONGESTION)",
                   .text = &S::congestion},
    RuntimeSetting{.name = "commit_window",
                   .flag = "--commit-window",
                   .kind = SettingKind::kTime,
                   .help = "Bytes a connection may commit past the sending buffer, as a time at "
                           "--bandwidth (TCP_NOTSENT_LOWAT; 0 = 128 KiB fixed)",
                   .time = &S::commit_window},
    RuntimeSetting{.name = "connect_timeout",
                   .flag = "--connect-timeout",
                   .kind = SettingKind::kTime,
                   .help = "Rendezvous deadline: every connection of the job made and greeted",
                   .time = &S::connect_timeout,
                   .positive = true},
    RuntimeSetting{.name = "peer_timeout",
                   .flag = "--peer-timeout",
                   .kind = SettingKind::kTime,
                   .help = "Longest silence of a connection (idle ones carry heartbeats) before "
                           "its peer is lost",
                   .time = &S::peer_timeout,
                   .positive = true},
    RuntimeSetting{.name = "payload_checksums",
                   .flag = "--no-checksum",
                   .kind = SettingKind::kSwitch,
                   .help = "Frames without payload checksums (CRC32C; docs/reliability.md): "
                           "every node of the job or none",
                   .on = &S::payload_checksums},
};

}  // namespace

Status check_setting(const RuntimeSettings& settings, const RuntimeSetting& s) {
  switch (s.kind) {
    case SettingKind::kText:
      if ((settings.*s.text).empty()) return invalid_argument(std::string(s.flag) + " is empty");
      return Status::ok();
    case SettingKind::kTime: {
      const TimeNs t = settings.*s.time;
      if (s.positive && t <= 0) return invalid_argument(std::string(s.flag) + " must be > 0");
      if (t < 0) return invalid_argument(std::string(s.flag) + " must be >= 0");
      return Status::ok();
    }
    case SettingKind::kSwitch:
      return Status::ok();
  }
  return Status::ok();
}

std::span<const RuntimeSetting> runtime_settings() { return kSettings; }

Result<const RuntimeSetting*> find_setting(std::string_view name) {
  std::string key(name);
  while (!key.empty() && key.front() == '-') key.erase(0, 1);
  for (char& c : key) c = c == '-' ? '_' : c;
  std::string known;
  for (const RuntimeSetting& s : kSettings) {
    if (s.name == key) return &s;
    known += (known.empty() ? "" : ", ") + std::string(s.name);
  }
  return invalid_argument("unknown runtime setting '" + std::string(name) +
                          "' (settings: " + known + ")");
}

Status set_setting(RuntimeSettings& settings, const RuntimeSetting& s, std::string_view text) {
  switch (s.kind) {
    case SettingKind::kText:
      settings.*s.text = std::string(text);
      break;
    case SettingKind::kTime: {
      auto t = parse_time(text);  // refuses < 0
      if (!t) return t.status().with_context(std::string(s.flag));
      settings.*s.time = *t;
      break;
    }
    case SettingKind::kSwitch:
      if (text != "true" && text != "false") {
        return invalid_argument(std::string(s.flag) + ": '" + std::string(text) +
                                "' is not true or false");
      }
      settings.*s.on = text == "true";
      break;
  }
  return check_setting(settings, s);
}

std::string format_setting(const RuntimeSettings& settings, const RuntimeSetting& s) {
  switch (s.kind) {
    case SettingKind::kText:
      return settings.*s.text;
    case SettingKind::kTime:
      return format_time(settings.*s.time);
    case SettingKind::kSwitch:
      return settings.*s.on ? "true" : "false";
  }
  return "";
}

Status check_settings(const RuntimeSettings& settings) {
  for (const RuntimeSetting& s : kSettings) QS_RETURN_IF_ERROR(check_setting(settings, s));
  return transport::check_congestion_available(settings.congestion).with_context("--congestion");
}

}  // namespace qs::runtime
