// FreePort: a TCP port for a test or benchmark to listen on.
//
// Contract: returns a port that was free on every interface when asked
// (bound, then released), and never one this process was given before (the
// kernel may hand the same free port out twice in a row, so a test that asks
// for two ports could get one for both). -1 if none was found.
//
// The port is drawn at random from below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), never from it: between the
// release and the listen, any process's outgoing connection may be given an
// ephemeral port, and tests running beside this one connect all the time
// (a worker's store server once failed with "address in use" so). Only a
// test that drew the same port in the same moment can take it now.
//
// Thread-safety: safe to call from any thread.
#ifndef BATON_TESTING_PORTS_H_
#define BATON_TESTING_PORTS_H_

namespace baton::testing {

int FreePort();

// Whether `port` can be bound on every interface now.
bool PortIsFree(int port);

}  // namespace baton::testing

#endif  // BATON_TESTING_PORTS_H_
