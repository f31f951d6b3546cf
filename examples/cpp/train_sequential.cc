// Data-parallel training from C++ (LibTorch) through Quicksilver: a small MLP on a
// synthetic classification task, each worker on its own share of every batch.
//
//   ./build/quicksilver run --workers 2 --script ./build/examples/train_sequential [--policy P]
//   [--iterations K]
//
// Every rank builds the model from the same seed (the LibTorch API has no broadcast). With
// --check, rank 0 also trains a copy alone on the concatenated batches and prints the
// largest difference between the two (float rounding: about 1e-8).
#include <cstdio>
#include <cstring>
#include <string>

#include "quicksilver/torch/libtorch.h"

namespace {

torch::nn::Sequential make_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 10));
}

// Batch `it` of the whole job: `per_worker` samples for each of `workers`; a class is a
// direction in input space.
std::pair<torch::Tensor, torch::Tensor> global_batch(int it, int workers, int per_worker) {
  torch::manual_seed(1000 + it);
  auto y = torch::randint(0, 10, {workers * per_worker}, torch::kLong);
  auto centers = torch::eye(10, 32) * 3;
  auto x = centers.index_select(0, y) + torch::randn({workers * per_worker, 32});
  return {x, y};
}

}  // namespace

int main(int argc, char** argv) {
  std::string policy = "mercury";
  int iterations = 20;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--policy") && i + 1 < argc)
      policy = argv[++i];
    else if (!std::strcmp(argv[i], "--iterations") && i + 1 < argc)
      iterations = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--check"))
      check = true;
  }
  try {
    torch::set_num_threads(1);
    auto options = qs::pytorch::TrainerOptions::from_environment();
    options.policy = policy;
    const int per_worker = 16;
    auto model = make_model();
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    qs::pytorch::DistributedTrainer trainer(model, optimizer, options);
    for (int it = 0; it < iterations; ++it) {
      auto [x, y] = global_batch(it, options.size, per_worker);
      auto xb = x.narrow(0, options.rank * per_worker, per_worker);
      auto yb = y.narrow(0, options.rank * per_worker, per_worker);
      // No optimizer.zero_grad(): the trainer zeroes each .grad right after its update; the
      // optimizer's would also clear sums that arrived but are not yet applied.
      auto loss = torch::nn::functional::cross_entropy(trainer.forward(xb), yb);
      loss.backward();
      trainer.step();
      if (options.rank == 0 && (it % 5 == 4 || it + 1 == iterations)) {
        std::printf("iteration %d loss %.4f\n", it, loss.item<float>());
      }
    }
    auto report = trainer.finish();
    if (options.rank == 0) {
      std::printf("%s: %d workers, median iteration %.3f ms\n", policy.c_str(), options.size,
                  static_cast<double>(report.median_iteration) / 1e6);
    }
    if (check && options.rank == 0) {
      auto alone = make_model();
      torch::optim::SGD opt(alone->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      for (int it = 0; it < iterations; ++it) {
        auto [x, y] = global_batch(it, options.size, per_worker);
        opt.zero_grad();
        torch::nn::functional::cross_entropy(alone->forward(x), y).backward();
        opt.step();
      }
      double worst = 0;
      auto a = model->parameters(), b = alone->parameters();
      for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
      std::printf("largest difference from one process on the concatenated batches: %.3g\n", worst);
      if (!(worst <= 1e-5)) return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
