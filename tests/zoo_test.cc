#include "quicksilver/model/zoo.h"

#include <gtest/gtest.h>

#include <map>

namespace qs {
namespace {

// Published parameter totals of the reference architectures, written here independently
// of the shipped data (torchvision 0.14 for the vision models; the original BERT-Base and
// GPT-2 small configurations).
const std::map<std::string, std::int64_t> kReferenceTotals = {
    {"alexnet", 61'100'840},
    {"vgg16", 138'357'544},
    {"vgg19", 143'667'240},
    {"resnet50", 25'557'032},
    {"resnet101", 44'549'160},
    {"resnet152", 60'192'808},
    {"googlenet", 13'004'888},
    {"inception_v3", 27'161'264},
    {"bert_base", 109'482'240},
    {"gpt2", 124'439'808},
    {"vgg16_cifar10", 33'638'218},
    // Issue 14: the two smaller CNNs the papers also train (Mercury Fig. 3: MobileNet v2).
    {"resnet18", 11'689'512},
    {"mobilenet_v2", 3'504'872},
};

TEST(Zoo, HasEveryModelOfTheIssue) {
  for (const auto& [name, total] : kReferenceTotals) {
    EXPECT_TRUE(find_zoo_model(name).is_ok()) << name;
  }
  EXPECT_EQ(zoo_models().size(), kReferenceTotals.size());
}

TEST(Zoo, ParameterTotalsMatchTheReferenceArchitectures) {
  for (const ZooModel& m : zoo_models()) {
    auto it = kReferenceTotals.find(m.name);
    ASSERT_NE(it, kReferenceTotals.end()) << m.name;
    EXPECT_EQ(m.parameters(), it->second) << m.name;
    EXPECT_EQ(m.reference_parameters, it->second) << m.name;
  }
}

TEST(Zoo, LayersAreInForwardOrder) {
  auto vgg = *find_zoo_model("vgg16");
  EXPECT_EQ(vgg->layers.front().name, "features.0");
  EXPECT_EQ(vgg->layers.back().name, "classifier.6");
  EXPECT_EQ(vgg->layers.back().tensors[0].elements, 4096 * 1000);
  auto bert = *find_zoo_model("bert_base");
  EXPECT_NE(bert->layers.front().name.find("embeddings"), std::string::npos);
  auto resnet = *find_zoo_model("resnet50");
  EXPECT_EQ(resnet->layers.front().name, "conv1");
  EXPECT_EQ(resnet->layers.back().name, "fc");
}

// Layer sizes as torchvision 0.14 builds them (tools/gen_zoo.py checks every tensor's
// count against the module when it generates the data; these are a few written by hand).
TEST(Zoo, ResNet18AndMobileNetV2MatchTorchvision) {
  auto r18 = *find_zoo_model("resnet18");
  EXPECT_EQ(r18->layers.size(), 41u);
  EXPECT_EQ(r18->layers.front().name, "conv1");
  EXPECT_EQ(r18->layers.front().tensors[0].elements, 64 * 3 * 7 * 7);
  EXPECT_EQ(r18->layers.back().name, "fc");
  EXPECT_EQ(r18->layers.back().tensors[0].elements, 512 * 1000);
  auto mb = *find_zoo_model("mobilenet_v2");
  EXPECT_EQ(mb->layers.size(), 105u);
  EXPECT_EQ(mb->layers.front().name, "features.0.0");
  EXPECT_EQ(mb->layers.front().tensors[0].elements, 32 * 3 * 3 * 3);
  // The first block's depthwise 3x3 convolution: one 3x3 filter per channel (groups 32).
  EXPECT_EQ(mb->layers[2].name, "features.1.conv.0.0");
  EXPECT_EQ(mb->layers[2].tensors[0].elements, 32 * 1 * 3 * 3);
  EXPECT_EQ(mb->layers.back().name, "classifier.1");
  EXPECT_EQ(mb->layers.back().tensors[0].elements, 1280 * 1000);
  EXPECT_EQ(mb->default_batch_size, 32);
}

TEST(Zoo, DefaultBatchSizesFollowMercuryTableII) {
  EXPECT_EQ((*find_zoo_model("vgg16"))->default_batch_size, 32);
  EXPECT_EQ((*find_zoo_model("alexnet"))->default_batch_size, 512);
  EXPECT_EQ((*find_zoo_model("vgg16_cifar10"))->default_batch_size, 128);
  EXPECT_EQ((*find_zoo_model("bert_base"))->default_batch_size, 32);
}

TEST(Zoo, EveryProfileIsValidOnEveryDevice) {
  for (const Device& d : devices()) {
    for (const ZooModel& m : zoo_models()) {
      Profile p = make_zoo_profile(m, d);
      EXPECT_TRUE(validate_profile(p).is_ok()) << m.name << " on " << d.name;
      EXPECT_GT(p.compute_time(), 0);
    }
  }
}

TEST(Zoo, DeviceModelScalesWithBatchAndSpeed) {
  auto m = *find_zoo_model("resnet50");
  Profile slow = make_zoo_profile(*m, **find_device("gtx1080ti"), 32);
  Profile fast = make_zoo_profile(*m, **find_device("a100"), 32);
  Profile big = make_zoo_profile(*m, **find_device("gtx1080ti"), 64);
  EXPECT_GT(slow.compute_time(), 2 * fast.compute_time());
  EXPECT_GT(big.compute_time(), slow.compute_time() * 3 / 2);
  // Backward = 2 x forward (up to the fixed per-layer overhead).
  const auto& conv = slow.layers[0];
  EXPECT_NEAR(static_cast<double>(conv.backward - (*find_device("gtx1080ti"))->layer_overhead),
              2.0 * static_cast<double>(conv.forward - (*find_device("gtx1080ti"))->layer_overhead),
              2.0);
  // ResNet-50 on a GTX 1080 Ti: ~150-250 samples/s in FP32 training (calibration basis).
  const double samples_per_s = 32.0 / to_sec(slow.compute_time());
  EXPECT_GT(samples_per_s, 150);
  EXPECT_LT(samples_per_s, 250);
}

TEST(Zoo, UnknownNamesListTheKnownOnes) {
  auto r = find_zoo_model("resnet9000");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("vgg16"), std::string::npos);
  auto d = find_device("tpu");
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("rtx3090"), std::string::npos);
  auto l = load_model("no-such-model-or-file");
  ASSERT_FALSE(l.is_ok());
  EXPECT_NE(l.status().message().find("neither a built-in model"), std::string::npos);
}

}  // namespace
}  // namespace qs
