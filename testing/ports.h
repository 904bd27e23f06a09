// FreePort: a TCP port for a test or benchmark to listen on.
//
// Contract: returns a port that was free on every interface when asked
// (bound, then released), and never one this process was given before (the
// kernel may hand the same free port out twice in a row, so a test that asks
// for two ports could get one for both). -1 if none was found.
//
// Thread-safety: safe to call from any thread.
#ifndef BATON_TESTING_PORTS_H_
#define BATON_TESTING_PORTS_H_

namespace baton::testing {

int FreePort();

}  // namespace baton::testing

#endif  // BATON_TESTING_PORTS_H_
