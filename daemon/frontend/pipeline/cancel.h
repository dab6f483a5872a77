// A run's cancellation: set once (the client went away, the daemon stops),
// it runs every hook registered on it. A backend hooks its own way of
// stopping the run to it: killing a local sandbox, aborting a transfer,
// leaving a queue. Single-threaded: used on the daemon's event loop only.
#pragma once

#include <functional>
#include <map>
#include <vector>

namespace tsb::core {

class CancelSignal {
 public:
  bool requested() const noexcept { return requested_; }
  void request() {
    if (requested_) return;
    requested_ = true;
    // A hook may remove itself (or others) while running: iterate over the
    // ids, and call only hooks that are still registered.
    std::vector<int> ids;
    for (const auto& [id, fn] : hooks_) ids.push_back(id);
    for (int id : ids)
      if (auto it = hooks_.find(id); it != hooks_.end() && it->second) {
        auto fn = it->second;  // a hook that removes itself stays alive while it runs
        fn();
      }
  }
  // The hook runs at request(), or at once when it was already requested.
  int add_hook(std::function<void()> fn) {
    int id = next_++;
    if (requested_) {
      fn();
      return id;
    }
    hooks_[id] = std::move(fn);
    return id;
  }
  void remove_hook(int id) { hooks_.erase(id); }

 private:
  bool requested_ = false;
  int next_ = 0;
  std::map<int, std::function<void()>> hooks_;
};

// Removes its hook when it goes out of scope.
class CancelHook {
 public:
  CancelHook(CancelSignal& s, std::function<void()> fn) : s_(s), id_(s.add_hook(std::move(fn))) {}
  ~CancelHook() { s_.remove_hook(id_); }
  CancelHook(const CancelHook&) = delete;
  CancelHook& operator=(const CancelHook&) = delete;

 private:
  CancelSignal& s_;
  int id_;
};

}  // namespace tsb::core
