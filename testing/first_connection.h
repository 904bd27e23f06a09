// AcceptAndDropOneConnection: for a test that must see a client try to
// reach a server before the server exists (a client that waits and retries
// for a server started after it).
//
// Contract: listens on 127.0.0.1:`port`, accepts the first connection that
// arrives within `timeout` and closes it at once (the client sees its
// connection fail, as it would with no server there), then releases the
// port for the real server. Returns whether a client connected in time;
// false too if the port could not be bound.
//
// Thread-safety: safe to call from any thread.
#ifndef BATON_TESTING_FIRST_CONNECTION_H_
#define BATON_TESTING_FIRST_CONNECTION_H_

#include "absl/time/time.h"

namespace baton::testing {

bool AcceptAndDropOneConnection(int port, absl::Duration timeout);

}  // namespace baton::testing

#endif  // BATON_TESTING_FIRST_CONNECTION_H_
