#include "rpc/function.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace baton::rpc {

absl::Status FunctionRegistry::RegisterRaw(std::string name, std::string signature,
                                           RawHandler handler, ValueHandler value_handler) {
  if (name.empty()) return absl::InvalidArgumentError("function name is empty");
  auto entry = std::make_shared<Entry>();
  entry->signature = std::move(signature);
  entry->handler = std::move(handler);
  entry->value_handler = std::move(value_handler);
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = entries_.emplace(name, std::move(entry));
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat("function '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

absl::Status FunctionRegistry::RegisterInternalInline(std::string name, RawHandler handler) {
  auto entry = std::make_shared<Entry>();
  entry->handler = std::move(handler);
  entry->inline_safe = true;
  absl::MutexLock lock(&mu_);
  if (!entries_.emplace(name, std::move(entry)).second) {
    return absl::AlreadyExistsError(absl::StrCat("function '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

absl::Status FunctionRegistry::AddReplyNoteKind(std::string kind, ReplyNoteKind handlers) {
  if (!handlers.on_arrival || !handlers.unsent) {
    return absl::InvalidArgumentError(
        absl::StrCat("reply note kind '", kind, "' needs both on_arrival and unsent"));
  }
  absl::MutexLock lock(&mu_);
  if (!note_kinds_.emplace(kind, std::make_shared<const ReplyNoteKind>(std::move(handlers)))
           .second) {
    return absl::AlreadyExistsError(
        absl::StrCat("reply note kind '", kind, "' is already registered"));
  }
  return absl::OkStatus();
}

std::shared_ptr<const ReplyNoteKind> FunctionRegistry::FindReplyNoteKind(
    absl::string_view kind) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = note_kinds_.find(kind);
  return it == note_kinds_.end() ? nullptr : it->second;
}

namespace {
// The innermost open scope on this thread.
thread_local ReplyNoteScope* t_reply_notes = nullptr;
}  // namespace

ReplyNoteScope::ReplyNoteScope(int caller, uint64_t request_id)
    : caller_(caller), request_id_(request_id), outer_(t_reply_notes) {
  t_reply_notes = this;
}

ReplyNoteScope::~ReplyNoteScope() { t_reply_notes = outer_; }

std::vector<ReplyNoteScope::Note> ReplyNoteScope::TakeForReply(int caller, uint64_t request_id) {
  ReplyNoteScope* s = t_reply_notes;
  if (s == nullptr || s->caller_ != caller || s->request_id_ != request_id || s->closed_) return {};
  s->closed_ = true;
  return std::move(s->notes_);
}

std::vector<ReplyNoteScope::Note> ReplyNoteScope::TakeUnsent() {
  closed_ = true;
  return std::move(notes_);
}

bool AttachToReply(int caller, absl::string_view kind, std::string data) {
  ReplyNoteScope* s = t_reply_notes;
  if (s == nullptr || s->closed_ || s->caller_ != caller || s->notes_.size() >= kMaxReplyNotes) {
    return false;
  }
  s->notes_.push_back(ReplyNoteScope::Note{std::string(kind), std::move(data)});
  return true;
}

void FunctionRegistry::AddCallHook(std::shared_ptr<CallHook> hook) {
  absl::MutexLock lock(&mu_);
  auto next = std::make_shared<Hooks>(*hooks_);
  next->push_back(std::move(hook));
  hooks_ = std::move(next);
  has_hooks_.store(true, std::memory_order_release);
}

absl::Status FunctionRegistry::RunSendHooks(const MessageInfo& m,
                                            const std::vector<at::Tensor>& tensors,
                                            std::map<std::string, std::string>& extensions) const {
  const std::shared_ptr<const Hooks> hooks = this->hooks();
  for (const auto& h : *hooks) {
    RETURN_IF_ERROR(h->OnSend(m, tensors, extensions));
  }
  return absl::OkStatus();
}

absl::Status FunctionRegistry::RunReceiveHooks(
    const MessageInfo& m, const std::vector<at::Tensor*>& tensors,
    const std::map<std::string, std::string>& extensions) const {
  const std::shared_ptr<const Hooks> hooks = this->hooks();
  for (const auto& h : *hooks) {
    RETURN_IF_ERROR(h->OnReceive(m, tensors, extensions));
  }
  return absl::OkStatus();
}

FunctionRegistry::CallScopes FunctionRegistry::EnterCall(const CallContext& ctx) const {
  CallScopes out;
  const std::shared_ptr<const Hooks> hooks = this->hooks();
  const MessageInfo m{ctx.runtime, /*is_request=*/true, ctx.caller != nullptr ? ctx.caller->id : -1,
                      ctx.function};
  for (const auto& h : *hooks) {
    if (auto scope = h->EnterCall(m, ctx.extensions)) out.scopes_.push_back(std::move(scope));
  }
  return out;
}

std::shared_ptr<const FunctionRegistry::Entry> FunctionRegistry::Find(
    absl::string_view name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second;
}

std::vector<std::string> FunctionRegistry::Names() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [k, v] : entries_) names.push_back(k);
  return names;
}

namespace internal {

absl::Status StatusFromCurrentException() {
  try {
    throw;
  } catch (const Error& e) {
    return e.status();
  } catch (const c10::Error& e) {
    return absl::UnknownError(absl::StrCat("remote exception: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::UnknownError(absl::StrCat("remote exception: ", e.what()));
  } catch (...) {
    return absl::UnknownError("remote exception of unknown type");
  }
}

}  // namespace internal
}  // namespace baton::rpc
