#include "comm/internal/gloo_store.h"

#include <gloo/common/error.h>

#include "absl/strings/str_cat.h"

namespace baton::comm::internal {

GlooStore::GlooStore(store::Store& store, std::string prefix, absl::Duration timeout)
    : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

std::string GlooStore::Key(const std::string& key) const {
  return absl::StrCat(prefix_, "/gloo/", key);
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_.Set(Key(key), absl::string_view(data.data(), data.size()));
  if (!s.ok()) throw ::gloo::IoException(s.ToString());
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> v = store_.Get(Key(key), timeout_);
  if (!v.ok()) throw ::gloo::IoException(v.status().ToString());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(Key(k));
  // gloo passes its own default (30s) here; the group's timeout governs.
  (void)timeout;
  absl::Status s = store_.Wait(full, timeout_);
  if (!s.ok()) throw ::gloo::IoException(s.ToString());
}

}  // namespace baton::comm::internal
