// Tests of data/idx.h and data/fashion_mnist.h. Small IDX files are written
// (gzipped with zlib) under $TEST_TMPDIR; the real Fashion-MNIST test runs
// only where the data set is installed.
#include "data/idx.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/fashion_mnist.h"

namespace baton::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using Bytes = std::vector<uint8_t>;

// A fresh directory for the running test under $TEST_TMPDIR.
std::string TestDir() {
  const char* root = std::getenv("TEST_TMPDIR");
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = std::string(root != nullptr ? root : "/tmp") + "/" + info->test_suite_name() +
                    "." + info->name();
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// The IDX encoding: magic 00 00 <type> <rank>, big-endian dims, then data.
Bytes Idx(const std::vector<uint32_t>& dims, const Bytes& data, uint8_t type = kIdxTypeUint8) {
  Bytes out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    out.push_back(static_cast<uint8_t>(d >> 24));
    out.push_back(static_cast<uint8_t>(d >> 16));
    out.push_back(static_cast<uint8_t>(d >> 8));
    out.push_back(static_cast<uint8_t>(d));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Bytes Iota(size_t n, int step = 1) {
  Bytes out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * step);
  return out;
}

void WriteGz(const std::string& path, const Bytes& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(gz), Z_OK);
}

void WritePlain(const std::string& path, const Bytes& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  ASSERT_EQ(std::fclose(f), 0);
}

// Expects `status` to have `code` and a message naming `path` and `what`.
void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& path,
                 const std::string& what) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), AllOf(HasSubstr(path), HasSubstr(what)));
}

// Peak resident memory of this process, in bytes.
int64_t PeakRssBytes() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return int64_t{usage.ru_maxrss} * 1024;
}

// ---- IdxReader: good files ----

TEST(IdxReader, ReadsImagesExactly) {
  const std::string path = TestDir() + "/images.gz";
  const Bytes data = Iota(2 * 3 * 4, 7);
  WriteGz(path, Idx({2, 3, 4}, data));
  absl::StatusOr<IdxArray> array = ReadIdxUint8(path, 3);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<uint32_t>{2, 3, 4}));
  EXPECT_EQ(array->values, data);
}

TEST(IdxReader, ReadsLabelsExactly) {
  const std::string path = TestDir() + "/labels.gz";
  const Bytes data = {3, 1, 4, 1, 5, 9, 2, 6, 5, 255, 0};
  WriteGz(path, Idx({11}, data));
  absl::StatusOr<IdxArray> array = ReadIdxUint8(path, 1);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<uint32_t>{11}));
  EXPECT_EQ(array->values, data);
}

TEST(IdxReader, ReadsLargeArrayAcrossBufferGrowth) {
  const std::string path = TestDir() + "/big.gz";
  const Bytes data = Iota(3 * 1000 * 1000, 13);  // crosses several doublings
  WriteGz(path, Idx({3000, 1000}, data));
  absl::StatusOr<IdxArray> array = ReadIdxUint8(path, 2);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->values, data);
}

TEST(IdxReader, ReadsUncompressedFile) {
  const std::string path = TestDir() + "/labels";
  const Bytes data = {7, 8, 9};
  WritePlain(path, Idx({3}, data));
  absl::StatusOr<IdxArray> array = ReadIdxUint8(path, 1);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->values, data);
}

TEST(IdxReader, EmptyArrayIsValid) {
  const std::string path = TestDir() + "/empty.gz";
  WriteGz(path, Idx({0, 28, 28}, {}));
  absl::StatusOr<IdxArray> array = ReadIdxUint8(path, 3);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<uint32_t>{0, 28, 28}));
  EXPECT_TRUE(array->values.empty());
}

// ---- IdxReader: errors ----

TEST(IdxReader, MissingFileIsNotFound) {
  const std::string path = TestDir() + "/no-such-file.gz";
  ExpectError(ReadIdxUint8(path, 1).status(), absl::StatusCode::kNotFound, path, "cannot open");
}

TEST(IdxReader, DirectoryIsInvalidArgument) {
  const std::string dir = TestDir();
  ExpectError(ReadIdxUint8(dir, 1).status(), absl::StatusCode::kInvalidArgument, dir,
              "is a directory");
}

TEST(IdxReader, BadArgumentsAreInvalidArgument) {
  const std::string path = TestDir() + "/labels.gz";
  WriteGz(path, Idx({1}, {0}));
  EXPECT_EQ(ReadIdxUint8("", 1).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectError(ReadIdxUint8(path, 0).status(), absl::StatusCode::kInvalidArgument, path, "rank");
  ExpectError(ReadIdxUint8(path, 256).status(), absl::StatusCode::kInvalidArgument, path, "rank");
  IdxReadOptions options;
  options.max_bytes = 0;
  ExpectError(ReadIdxUint8(path, 1, options).status(), absl::StatusCode::kInvalidArgument, path,
              "max_bytes");
}

TEST(IdxReader, EmptyFileIsTruncatedHeader) {
  const std::string path = TestDir() + "/empty.gz";
  WriteGz(path, {});
  ExpectError(ReadIdxUint8(path, 1).status(), absl::StatusCode::kDataLoss, path,
              "truncated header: the file holds 0 bytes");
}

TEST(IdxReader, TruncatedMagic) {
  const std::string path = TestDir() + "/short.gz";
  WriteGz(path, {0, 0});
  ExpectError(ReadIdxUint8(path, 1).status(), absl::StatusCode::kDataLoss, path,
              "truncated header: the file holds 2 bytes");
}

TEST(IdxReader, TruncatedDims) {
  const std::string path = TestDir() + "/short.gz";
  Bytes bytes = Idx({60000, 28, 28}, {});
  bytes.resize(10);  // magic and one and a half dims
  WriteGz(path, bytes);
  ExpectError(ReadIdxUint8(path, 3).status(), absl::StatusCode::kDataLoss, path,
              "truncated header: 3 dimension(s) need a 16-byte header but "
              "the file holds 10 bytes");
}

TEST(IdxReader, TruncatedData) {
  const std::string path = TestDir() + "/short.gz";
  WriteGz(path, Idx({60000, 28, 28}, Iota(1200)));
  IdxReadOptions options;
  options.noun = "images";
  ExpectError(ReadIdxUint8(path, 3, options).status(), absl::StatusCode::kDataLoss, path,
              "truncated: header declares 60000x28x28 images (47040000 "
              "bytes) but the file holds only 1200 bytes");
}

TEST(IdxReader, BadMagic) {
  const std::string path = TestDir() + "/bad.gz";
  Bytes bytes = Idx({2}, {1, 2});
  bytes[0] = 0x12;
  bytes[1] = 0x34;
  WriteGz(path, bytes);
  ExpectError(ReadIdxUint8(path, 1).status(), absl::StatusCode::kDataLoss, path,
              "bad magic 0x12340801");
}

TEST(IdxReader, WrongNumberOfDimensions) {
  const std::string path = TestDir() + "/labels.gz";
  WriteGz(path, Idx({2}, {1, 2}));
  ExpectError(ReadIdxUint8(path, 3).status(), absl::StatusCode::kDataLoss, path,
              "bad magic 0x00000801: the header declares 1 dimension(s), "
              "expected 3 (0x00000803)");
}

TEST(IdxReader, UnsupportedTypeCode) {
  const std::string path = TestDir() + "/floats.gz";
  WriteGz(path, Idx({1}, {0, 0, 0, 0}, /*type=*/0x0D));
  ExpectError(ReadIdxUint8(path, 1).status(), absl::StatusCode::kDataLoss, path,
              "unsupported type code 0x0d (float32)");
}

TEST(IdxReader, TrailingBytes) {
  const std::string path = TestDir() + "/long.gz";
  Bytes bytes = Idx({2, 2, 2}, Iota(8));
  bytes.insert(bytes.end(), {1, 2, 3});
  WriteGz(path, bytes);
  ExpectError(ReadIdxUint8(path, 3).status(), absl::StatusCode::kDataLoss, path,
              "3 trailing bytes after the 8 data bytes");
}

TEST(IdxReader, CorruptGzipStream) {
  const std::string path = TestDir() + "/corrupt.gz";
  // A gzip header (magic, deflate, no flags) followed by garbage.
  Bytes bytes = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  for (int i = 0; i < 64; ++i) bytes.push_back(0xff);
  WritePlain(path, bytes);
  ExpectError(ReadIdxUint8(path, 1).status(), absl::StatusCode::kDataLoss, path,
              "corrupt gzip stream");
}

TEST(IdxReader, CutGzipStream) {
  const std::string dir = TestDir();
  const std::string whole = dir + "/whole.gz";
  const std::string cut = dir + "/cut.gz";
  WriteGz(whole, Idx({100, 28, 28}, Iota(100 * 28 * 28, 31)));
  FILE* f = std::fopen(whole.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  Bytes gz(1 << 20);
  gz.resize(std::fread(gz.data(), 1, gz.size(), f));
  std::fclose(f);
  ASSERT_GT(gz.size(), 100u);
  gz.resize(gz.size() / 2);
  WritePlain(cut, gz);
  ExpectError(ReadIdxUint8(cut, 3).status(), absl::StatusCode::kDataLoss, cut,
              "corrupt gzip stream: it ends early");
}

TEST(IdxReader, EnormousDeclaredSizeIsRejectedWithoutAllocating) {
  const std::string dir = TestDir();
  const int64_t peak_before = PeakRssBytes();

  // Far past 2^64 bytes: rejected from the header alone.
  const std::string huge = dir + "/huge.gz";
  WriteGz(huge, Idx({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, Iota(16)));
  ExpectError(ReadIdxUint8(huge, 3).status(), absl::StatusCode::kDataLoss, huge,
              "header declares 4294967295x4294967295x4294967295 values "
              "(more than 2^64 bytes), above the limit of 1073741824 bytes");

  // Just over the default 1 GiB limit.
  const std::string over = dir + "/over.gz";
  WriteGz(over, Idx({1025, 1024, 1024}, Iota(16)));
  ExpectError(ReadIdxUint8(over, 3).status(), absl::StatusCode::kDataLoss, over,
              "(1074790400 bytes), above the limit of 1073741824");

  // Under the limit but a lie: the reader allocates what the file holds,
  // not the 1e9 bytes declared, and reports the truncation.
  const std::string liar = dir + "/liar.gz";
  WriteGz(liar, Idx({1000, 1000, 1000}, Iota(16)));
  ExpectError(ReadIdxUint8(liar, 3).status(), absl::StatusCode::kDataLoss, liar,
              "(1000000000 bytes) but the file holds only 16 bytes");

  // A caller's lower limit applies too.
  IdxReadOptions options;
  options.max_bytes = 8;
  const std::string small = dir + "/small.gz";
  WriteGz(small, Idx({3, 3}, Iota(9)));
  ExpectError(ReadIdxUint8(small, 2, options).status(), absl::StatusCode::kDataLoss, small,
              "(9 bytes), above the limit of 8 bytes");

  EXPECT_LT(PeakRssBytes() - peak_before, int64_t{64} << 20);
}

// ---- FashionMnist ----

// Writes one split's two files into `dir` (`prefix` is "train" or "t10k").
void WriteSplit(const std::string& dir, const std::string& prefix,
                const std::vector<uint32_t>& image_dims, const Bytes& pixels, const Bytes& labels) {
  WriteGz(dir + "/" + prefix + "-images-idx3-ubyte.gz", Idx(image_dims, pixels));
  WriteGz(dir + "/" + prefix + "-labels-idx1-ubyte.gz",
          Idx({static_cast<uint32_t>(labels.size())}, labels));
}

TEST(FashionMnist, LoadsSmallSplitNormalized) {
  const std::string dir = TestDir();
  const Bytes pixels = Iota(3 * 784, 5);
  WriteSplit(dir, "train", {3, 28, 28}, pixels, {9, 0, 4});
  absl::StatusOr<Split> split = LoadFashionMnist(dir, /*train=*/true);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->images.sizes(), (std::vector<int64_t>{3, 784}));
  ASSERT_EQ(split->images.scalar_type(), at::kFloat);
  ASSERT_EQ(split->labels.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(split->labels, at::tensor({9, 0, 4}, at::kLong)));
  auto images = split->images.accessor<float, 2>();
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 784; ++j) {
      const double expected = (pixels[i * 784 + j] / 255.0 - kFashionMnistMean) / kFashionMnistStd;
      ASSERT_NEAR(images[i][j], expected, 1e-5) << i << "," << j;
    }
  }
}

TEST(FashionMnist, TestSplitReadsT10kFiles) {
  const std::string dir = TestDir();
  WriteSplit(dir, "t10k", {2, 28, 28}, Iota(2 * 784), {1, 2});
  absl::StatusOr<Split> split = LoadFashionMnist(dir, /*train=*/false);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->images.size(0), 2);
  // No train files were written.
  ExpectError(LoadFashionMnist(dir, /*train=*/true).status(), absl::StatusCode::kNotFound,
              dir + "/train-images-idx3-ubyte.gz", "cannot open");
}

TEST(FashionMnist, CountMismatchNamesBothFiles) {
  const std::string dir = TestDir();
  WriteSplit(dir, "train", {3, 28, 28}, Iota(3 * 784), {1, 2});
  const absl::Status status = LoadFashionMnist(dir, true).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr(dir + "/train-images-idx3-ubyte.gz holds 3 images"),
                    HasSubstr(dir + "/train-labels-idx1-ubyte.gz holds 2 labels")));
}

TEST(FashionMnist, WrongImageSizeIsDataLoss) {
  const std::string dir = TestDir();
  WriteSplit(dir, "train", {2, 27, 28}, Iota(2 * 27 * 28), {1, 2});
  ExpectError(LoadFashionMnist(dir, true).status(), absl::StatusCode::kDataLoss,
              dir + "/train-images-idx3-ubyte.gz", "images are 27x28 pixels, expected 28x28");
}

TEST(FashionMnist, LabelOutOfRangeIsDataLoss) {
  const std::string dir = TestDir();
  WriteSplit(dir, "train", {2, 28, 28}, Iota(2 * 784), {1, 10});
  ExpectError(LoadFashionMnist(dir, true).status(), absl::StatusCode::kDataLoss,
              dir + "/train-labels-idx1-ubyte.gz", "label 1 is 10, outside 0..9");
}

TEST(FashionMnist, EmptyDirIsInvalidArgument) {
  EXPECT_EQ(LoadFashionMnist("", true).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FashionMnist, DirComesFromEnvironment) {
  // Restores the caller's setting, which RealDataSetLoads uses.
  const char* original = std::getenv("BATON_FASHION_MNIST_DIR");
  const std::string saved = original != nullptr ? original : "";
  ASSERT_EQ(::unsetenv("BATON_FASHION_MNIST_DIR"), 0);
  EXPECT_EQ(FashionMnistDir(), kDefaultFashionMnistDir);
  ASSERT_EQ(::setenv("BATON_FASHION_MNIST_DIR", "/some/where", 1), 0);
  EXPECT_EQ(FashionMnistDir(), "/some/where");
  ASSERT_EQ(::setenv("BATON_FASHION_MNIST_DIR", "", 1), 0);
  EXPECT_EQ(FashionMnistDir(), kDefaultFashionMnistDir);
  if (original != nullptr) {
    ASSERT_EQ(::setenv("BATON_FASHION_MNIST_DIR", saved.c_str(), 1), 0);
  } else {
    ASSERT_EQ(::unsetenv("BATON_FASHION_MNIST_DIR"), 0);
  }
}

TEST(FashionMnist, RealDataSetLoads) {
  const std::string dir = FashionMnistDir();
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    GTEST_SKIP() << dir << " is absent; install dataset-fashion-mnist or set "
                 << "BATON_FASHION_MNIST_DIR to run this test";
  }
  for (bool train : {true, false}) {
    SCOPED_TRACE(train ? "train" : "test");
    absl::StatusOr<Split> split = LoadFashionMnist(dir, train);
    ASSERT_TRUE(split.ok()) << split.status();
    const int64_t n = train ? 60000 : 10000;
    EXPECT_EQ(split->images.sizes(), (std::vector<int64_t>{n, 784}));
    EXPECT_EQ(split->labels.sizes(), (std::vector<int64_t>{n}));
    EXPECT_GE(split->labels.min().item<int64_t>(), 0);
    EXPECT_LE(split->labels.max().item<int64_t>(), 9);
    const at::Tensor counts = at::bincount(split->labels, {}, 10);
    EXPECT_GT(counts.min().item<int64_t>(), 0) << counts;
    if (train) {
      const at::Tensor images = split->images.to(at::kDouble);
      EXPECT_NEAR(images.mean().item<double>(), 0.0, 0.01);
      EXPECT_NEAR(images.std().item<double>(), 1.0, 0.01);
    }
  }
}

}  // namespace
}  // namespace baton::data
