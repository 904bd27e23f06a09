// Fashion-MNIST: the 70,000 28x28 grey-scale clothing images (60,000 train,
// 10,000 test) with labels 0-9, read from the four gzipped IDX files that
// Debian's dataset-fashion-mnist installs.
//
// Contract: LoadFashionMnist() reads one split into freshly allocated tensors
// that the caller owns. Images are float32 [N, 784], scaled to [0, 1] and
// then normalized with the training set's mean 0.2860 and std 0.3530;
// labels are int64 [N]. Both files are validated completely (see data/idx.h
// for the file format errors); in addition the images must be 28x28, the
// labels in 0..9, and the two files must hold the same number of examples.
// Every error message names the file(s) concerned.
//
// Thread-safety: stateless; safe for concurrent use.
#ifndef BATON_DATA_FASHION_MNIST_H_
#define BATON_DATA_FASHION_MNIST_H_

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/status/statusor.h"

namespace baton::data {

inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// Per-pixel statistics of the training images scaled to [0, 1].
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;

inline constexpr int kFashionMnistRows = 28;
inline constexpr int kFashionMnistCols = 28;
inline constexpr int kFashionMnistClasses = 10;

struct Split {
  at::Tensor images;  // float32 [N, 784], (x / 255 - 0.2860) / 0.3530
  at::Tensor labels;  // int64 [N], values in 0..9
};

// Loads the training split (train-images-idx3-ubyte.gz,
// train-labels-idx1-ubyte.gz) if `train`, else the test split
// (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) from `dir`.
// REQUIRES: !dir.empty().
absl::StatusOr<Split> LoadFashionMnist(const std::string& dir, bool train);

// $BATON_FASHION_MNIST_DIR if set and non-empty, else kDefaultFashionMnistDir.
std::string FashionMnistDir();

}  // namespace baton::data

#endif  // BATON_DATA_FASHION_MNIST_H_
