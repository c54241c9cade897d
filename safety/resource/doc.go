// Package resource is the protected resource of the fault-injection tests:
// what a lock guards, shared by the worker processes over a Unix socket.
// (On the Redis and PostgreSQL targets the fenced writes go instead to a
// real store through distlock's public helpers, harness.Fence; the
// counter stays here.)
//
// A [Server] holds two things:
//   - a fenced register: a write carries the writer's fencing token and is
//     accepted only if the token is larger than that of the last accepted
//     write, or equal to it from the same owner (a token names one holder,
//     so the same token from another owner is refused: that catches the
//     duplicate tokens a Redis failover can hand out);
//   - an unfenced counter, incremented by read-modify-write (Get, then Set
//     of the value read plus one), which loses increments whenever two
//     holders overlap.
//
// The server records every write it handles as a history.StoreWrite or
// history.StoreIncr event with its own sequence number: the store's order
// is the order the checkers trust.
package resource
