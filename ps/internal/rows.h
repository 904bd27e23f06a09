// Embedding rows on one server: storage (eager or lazily created), the
// built-in row initializers and the row-wise optimizer updates. Internal to
// //ps; ServerShard guards every object here with its mutex.
//
// Thread-safety: not thread-safe.
#ifndef BATON_PS_INTERNAL_ROWS_H_
#define BATON_PS_INTERNAL_ROWS_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "ps/spec.h"

namespace baton::ps::internal {

// Fills out ([ids.size(), dim], spec.dtype) with the initial rows of ids.
void InitRows(const TableSpec& spec, absl::Span<const int64_t> ids, at::Tensor& out);

class RowStore {
 public:
  // Eager stores create and initialize every local row now.
  RowStore(const TableSpec& spec, int server, int num_servers);

  int64_t dim() const { return dim_; }
  int64_t state_width() const { return state_width_; }
  size_t element_size() const { return element_size_; }
  // Rows that exist (eager: all local rows).
  int64_t size() const { return lazy_ ? static_cast<int64_t>(slots_.size()) : local_rows_; }
  bool lazy() const { return lazy_; }

  // The slot of global id `id`, or -1 if the row does not exist (lazy only).
  // REQUIRES: id is owned by this server and in range.
  int64_t Find(int64_t id) const;
  // Creates the missing rows among `ids` (lazy only; no-op when eager).
  void Create(absl::Span<const int64_t> ids);

  char* Row(int64_t slot);
  const char* Row(int64_t slot) const;
  char* State(int64_t slot);
  const char* State(int64_t slot) const;

  // Eager stores: all local rows as one [local rows, dim] tensor (local row
  // = id / num_servers). Lazy stores: an undefined tensor.
  at::Tensor EagerValues() const { return lazy_ ? at::Tensor() : value_blocks_[0]; }

  // Every existing row's id, in slot order (checkpoints).
  std::vector<int64_t> Ids() const;
  // Lazy: removes every row. Eager: no-op. Used before a restore.
  void Clear();

 private:
  static constexpr int64_t kBlockRows = 4096;
  int64_t AllocateSlot();

  const TableSpec& spec_;
  const int server_;
  const int num_servers_;
  const int64_t dim_;
  const int64_t state_width_;
  const size_t element_size_;
  const bool lazy_;
  const int64_t local_rows_;
  // Eager: one block holding every row; lazy: blocks of kBlockRows rows.
  std::vector<at::Tensor> value_blocks_;
  std::vector<at::Tensor> state_blocks_;
  absl::flat_hash_map<int64_t, int64_t> slots_;  // lazy: id -> slot
  std::vector<int64_t> slot_ids_;                // lazy: slot -> id
};

// Applies one merged row gradient `g` (dim elements, the table's dtype) to
// `row` and its optimizer `state` in place, per RowOptimizer's rule.
void ApplyRowUpdate(const RowOptimizer& opt, c10::ScalarType dtype, int64_t dim, char* row,
                    char* state, const char* g);

// Initial optimizer state of one row (Adagrad's accumulator start value).
void InitRowState(const RowOptimizer& opt, c10::ScalarType dtype, int64_t width, char* state);

}  // namespace baton::ps::internal

#endif  // BATON_PS_INTERNAL_ROWS_H_
