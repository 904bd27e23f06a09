#include "data/fashion_mnist.h"

#include <ATen/ops/from_blob.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "data/idx.h"

namespace baton::data {

absl::StatusOr<Split> LoadFashionMnist(const std::string& dir, bool train) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("LoadFashionMnist: empty directory");
  }
  const std::string prefix = absl::StrCat(dir, "/", train ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";

  IdxReadOptions image_options;
  image_options.noun = "images";
  ASSIGN_OR_RETURN(IdxArray images, ReadIdxUint8(images_path, 3, image_options));
  if (images.dims[1] != kFashionMnistRows || images.dims[2] != kFashionMnistCols) {
    return absl::DataLossError(absl::StrCat(images_path, ": images are ", images.dims[1], "x",
                                            images.dims[2], " pixels, expected ", kFashionMnistRows,
                                            "x", kFashionMnistCols));
  }

  IdxReadOptions label_options;
  label_options.noun = "labels";
  absl::StatusOr<IdxArray> labels = ReadIdxUint8(labels_path, 1, label_options);
  if (!labels.ok()) return labels.status();

  const int64_t n = images.dims[0];
  if (labels->dims[0] != images.dims[0]) {
    return absl::DataLossError(absl::StrCat("count mismatch: ", images_path, " holds ",
                                            images.dims[0], " images but ", labels_path, " holds ",
                                            labels->dims[0], " labels"));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (labels->values[static_cast<size_t>(i)] >= kFashionMnistClasses) {
      return absl::DataLossError(absl::StrCat(labels_path, ": label ", i, " is ",
                                              int{labels->values[static_cast<size_t>(i)]},
                                              ", outside 0..", kFashionMnistClasses - 1));
    }
  }

  // LibTorch reports allocation failures as exceptions; none may escape.
  try {
    const int64_t pixels = int64_t{kFashionMnistRows} * kFashionMnistCols;
    Split split;
    split.images = at::from_blob(images.values.data(), {n, pixels}, at::kByte)
                       .to(at::kFloat)
                       .div_(255.0)
                       .sub_(kFashionMnistMean)
                       .div_(kFashionMnistStd);
    split.labels = at::from_blob(labels->values.data(), {n}, at::kByte).to(at::kLong);
    return split;
  } catch (const std::bad_alloc& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(images_path, ": out of memory building the tensors: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(images_path, ": cannot build the tensors: ", e.what()));
  }
}

std::string FashionMnistDir() {
  const char* env = std::getenv("BATON_FASHION_MNIST_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  return kDefaultFashionMnistDir;
}

}  // namespace baton::data
