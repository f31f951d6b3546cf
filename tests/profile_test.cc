#include "quicksilver/model/profile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace qs {
namespace {

const char* kGood = R"({"name": "tiny", "batch_size": 16, "layers": [
  {"name": "a", "forward_ms": 1.0, "backward_ms": 2.0, "tensors": [{"name": "a.w", "elements": 1000}]},
  {"name": "b", "forward_ms": 2.0, "backward_ms": 4.0, "update_ms": 0.5, "extra": "ignored",
   "tensors": [{"name": "b.w", "elements": 250000}, {"name": "b.b", "elements": 500, "bytes_per_element": 2}]}
]})";

// Expects `json` to be rejected with a message containing every string of `needles`.
void expect_error(const std::string& json, std::vector<std::string> needles) {
  auto r = profile_from_json(json, "p.json");
  ASSERT_FALSE(r.is_ok()) << "accepted: " << json;
  for (const auto& n : needles) {
    EXPECT_NE(r.status().message().find(n), std::string::npos)
        << "message '" << r.status().message() << "' lacks '" << n << "'";
  }
}

std::string with_layer(const std::string& layer) {
  return R"({"name": "x", "layers": [{"name": "ok", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "t", "elements": 1}]}, )" +
         layer + "]}";
}

TEST(Profile, LoadsTheDesignFormat) {
  auto r = profile_from_json(kGood);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->name, "tiny");
  EXPECT_EQ(r->batch_size, 16);
  ASSERT_EQ(r->num_layers(), 2);
  EXPECT_EQ(r->layers[1].update, 500'000);
  EXPECT_EQ(r->layers[0].update, 0);  // optional, default 0
  EXPECT_EQ(r->layers[1].tensors[1].bytes_per_element, 2);
  EXPECT_EQ(r->total_bytes(), 4000 + 1'000'000 + 1000);
  EXPECT_EQ(r->total_parameters(), 251'500);
  EXPECT_EQ(r->compute_time(), from_ms(9.5));
  EXPECT_EQ(r->num_tensors(), 3);
}

TEST(Profile, SaveThenLoadRoundTrips) {
  auto p = profile_from_json(kGood);
  ASSERT_TRUE(p.is_ok());
  auto path = std::filesystem::temp_directory_path() / "qs_profile_roundtrip.json";
  ASSERT_TRUE(save_profile(*p, path.string()).is_ok());
  auto q = load_profile(path.string());
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_EQ(profile_to_json(*p), profile_to_json(*q));
  EXPECT_EQ(q->layers[1].backward, p->layers[1].backward);
  std::filesystem::remove(path);
}

TEST(Profile, RejectsInvalidJson) { expect_error("{\"layers\": [", {"p.json", "not valid JSON"}); }

TEST(Profile, NumbersBeyondDoubleAreBadInputNotExceptions) {
  expect_error(R"({"layers": [{"name": "a", "forward_ms": 1e400, "backward_ms": 1,
                  "tensors": [{"name": "w", "elements": 3}]}]})",
               {"p.json", "not valid JSON", "1e400"});
}

TEST(Profile, NamesMustBeUtf8AndFileNamesAreSanitised) {
  auto p = profile_from_json(R"({"layers": [{"name": "a", "forward_ms": 1, "backward_ms": 1,
                                "tensors": [{"name": "w", "elements": 3}]}]})",
                             "caf\xe9.json", "caf\xe9");
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->name, "caf?");
  p->layers[0].name = "\xff";
  EXPECT_NE(validate_profile(*p).message().find(": name must be UTF-8"), std::string::npos);
}

TEST(Profile, RejectsNonObject) { expect_error("[1, 2]", {"JSON object"}); }

TEST(Profile, RejectsZeroLayers) { expect_error(R"({"layers": []})", {"at least one layer"}); }

TEST(Profile, RejectsMissingLayers) { expect_error(R"({"name": "x"})", {"missing field layers"}); }

TEST(Profile, RejectsMissingForwardNamingTheLayer) {
  expect_error(
      with_layer(
          R"({"name": "conv2", "backward_ms": 1, "tensors": [{"name": "t", "elements": 1}]})"),
      {"layer 2 'conv2'", "forward_ms"});
}

TEST(Profile, RejectsNegativeTime) {
  expect_error(
      with_layer(
          R"({"name": "fc", "forward_ms": -1, "backward_ms": 1, "tensors": [{"name": "t", "elements": 1}]})"),
      {"layer 2 'fc'", "forward_ms", ">= 0"});
}

TEST(Profile, RejectsNonNumericTime) {
  expect_error(
      with_layer(
          R"({"name": "fc", "forward_ms": "1ms", "backward_ms": 1, "tensors": [{"name": "t", "elements": 1}]})"),
      {"forward_ms must be a number"});
}

TEST(Profile, RejectsLayerWithoutTensors) {
  expect_error(with_layer(R"({"name": "relu", "forward_ms": 1, "backward_ms": 1, "tensors": []})"),
               {"layer 2 'relu'", "tensors"});
  expect_error(with_layer(R"({"name": "relu", "forward_ms": 1, "backward_ms": 1})"),
               {"layer 2 'relu'", "missing field tensors"});
}

TEST(Profile, RejectsZeroOrNegativeOrFractionalElements) {
  expect_error(
      with_layer(
          R"({"name": "fc", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "w", "elements": 0}]})"),
      {"layer 2 'fc'", "tensors[0].elements", "> 0"});
  expect_error(
      with_layer(
          R"({"name": "fc", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "w", "elements": -4}]})"),
      {"tensors[0].elements"});
  expect_error(
      with_layer(
          R"({"name": "fc", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "w", "elements": 1.5}]})"),
      {"elements must be an integer"});
}

TEST(Profile, RejectsAbsurdSizes) {
  expect_error(
      with_layer(
          R"({"name": "huge", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "w", "elements": 99999999999999}]})"),
      {"layer 2 'huge'", "absurdly large"});
  expect_error(
      with_layer(
          R"({"name": "slow", "forward_ms": 1e12, "backward_ms": 1, "tensors": [{"name": "w", "elements": 1}]})"),
      {"layer 2 'slow'", "forward_ms", "absurdly large"});
  expect_error(
      with_layer(
          R"({"name": "w", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "w", "elements": 1, "bytes_per_element": 3}]})"),
      {"bytes_per_element"});
  expect_error(
      with_layer(
          R"({"name": "w", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "w", "elements": 18446744073709551615}]})"),
      {"absurdly large"});
}

TEST(Profile, RejectsBadBatchSize) {
  expect_error(
      R"({"batch_size": 0, "layers": [{"name": "a", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "t", "elements": 1}]}]})",
      {"batch_size"});
}

TEST(Profile, RejectsMissingTensorName) {
  expect_error(
      with_layer(
          R"({"name": "fc", "forward_ms": 1, "backward_ms": 1, "tensors": [{"elements": 3}]})"),
      {"layer 2 'fc'", "tensors[0]", "name"});
}

TEST(Profile, MissingFileIsNotFound) {
  auto r = load_profile("/nonexistent/dir/profile.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/dir/profile.json"), std::string::npos);
}

TEST(Profile, NameDefaultsToFileStem) {
  auto path = std::filesystem::temp_directory_path() / "qs_stem_test.json";
  {
    std::ofstream out(path);
    out << R"({"layers": [{"name": "a", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "t", "elements": 1}]}]})";
  }
  auto r = load_profile(path.string());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->name, "qs_stem_test");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace qs
