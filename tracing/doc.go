// Package tracing is a [distlock.Handler] that makes OpenTelemetry spans:
// one for every acquisition (its wait) and one for every hold, so that a
// trace shows which request waited for which key, behind how many
// attempts, and how long it then held it.
//
//	tr := tracing.New(tracing.WithStore("redis"))
//	res, err := redis.New(client)
//	d, err := distlock.New(res, distlock.WithHandlers(tr, met, hot))
//
// The spans are made with the standard API (go.opentelemetry.io/otel/trace)
// on the TracerProvider given with [WithTracerProvider], or else on the
// global one (otel.SetTracerProvider), looked up at every acquisition, so
// that a provider set after [New] is used from then on. While no global
// provider is set, the handler makes no span and adds no allocation: an
// application that does not configure tracing pays nothing for it. (That
// includes OpenTelemetry Go's eBPF auto-instrumentation, which works by
// giving the unset global provider spans: it sees none of ours.)
//
// Put the handler outermost, so that its acquisition span covers the
// other handlers' waits (the hotspot handler's local queue) and its hold
// span is not started for an acquisition an outer handler then refuses.
//
// # Spans
//
// [SpanAcquire] ("distlock.acquire") is a child of the span in the
// caller's context, from the start of the acquisition through the handler
// chain to its outcome. The context passed inward carries it, so a store
// client's own instrumentation (redisotel, otelpgx, otelsql, otelgrpc)
// makes its spans under it: one per attempt, beneath the wait they make up.
// Its attributes:
//
//	distlock.key              the lock's key
//	distlock.store            the store's name, from WithStore (absent without it)
//	distlock.mode             mutex, semaphore, read, write (a side of a read/write lock) or election
//	distlock.limit            a semaphore's limit (absent for the other modes)
//	distlock.wait             the wait TryLock was given, in seconds (0: one attempt)
//	distlock.ttl              the lease time, in seconds
//	distlock.remote_attempts  calls that reached the store's acquire
//	distlock.outcome          held, not_acquired, context_ended, error
//	distlock.token            the fencing token, when held (absent if the store has none)
//	error.type                when the outcome is context_ended or error
//
// [SpanHold] ("distlock.hold") is a child of the same caller's span, linked
// to the acquisition span that granted it. It starts when the lock's TTL
// starts counting (the start of the attempt that acquired it, as
// [distlock.Lock.Deadline] counts it), so it may overlap the end of the
// acquisition span by that attempt's round trip, and it ends when the lock
// ends: when the store confirmed the release, or when the lock was known
// lost. Its attributes are distlock.key, distlock.store, distlock.mode,
// distlock.limit, distlock.ttl, distlock.token, and at the end distlock.outcome (released, not_held,
// lost) and error.type. A release that failed with a store error leaves
// the lock held (Unlock may be retried): the span stays open and records
// the error as an "exception" event. Renewals make neither spans nor
// events: the handler chain does not see them.
//
// Release passes its context on unchanged: the store's release call
// nests under the span of the context given to Unlock, not under the hold
// span.
//
// Reentrant acquisitions ([distlock.ContextWithLock]) make no span: they
// do no I/O and do not pass through the handler chain.
//
// # Outcomes and errors
//
// Contention is not failure: an acquisition that found the key held for
// its whole wait ends with outcome not_acquired and the status left unset,
// as for held. The others set the span's status to Error, with the
// error's message as its description, and error.type, following the
// semantic conventions' "Recording errors" (no exception event: the error
// is the span's outcome, not an event during it):
//
//   - context_ended: the acquisition's context ended before the wait did
//     (the caller's context, or Close). error.type is "context.Canceled"
//     or "context.DeadlineExceeded". A single attempt (wait 0) stopped by
//     the facade's own bound on it (a second) on a store
//     that does not answer is reported so too.
//   - error: any other error, a store's. error.type is
//     "context.DeadlineExceeded" when the store did not answer within the
//     wait, "distlock.ErrClosed" or "distlock.ErrNotHeld" for those errors
//     (from a handler inside this one), otherwise the type of the error
//     under its fmt.Errorf and errors.Join wrappers (the first joined
//     error: a store joins a clean-up's error to the one that caused it),
//     or its ErrorType method's value (semconv.ErrorType), for example
//     "*net.OpError" when Redis cannot be reached.
//
// A wait that its own end cut short (the facade's bound: an attempt or a
// sleep between attempts ran past it) is not_acquired once the store had
// answered, as TryLock reports it, and error when it never had. The
// handler infers which from the remote attempts and the error (TryLock
// counts the answers, a handler cannot see them); a caller's deadline
// falling within the bound's few milliseconds of grace after the wait's
// end is taken for the wait's end (TryLock calls it the caller's).
//
// A hold span ends with status unset when released; with status Error and
// error.type "distlock.ErrNotHeld" when the release found the lock expired
// or taken (not_held) or the lock was known lost first (lost: its validity
// ran out, a renewal found it gone or failed until it ran out, the store
// reported its session or lease gone, or Close could not release it), the
// cause as the description.
//
// # Modes and limits
//
// The lock's mode and limit (read/write locks and semaphores) are not yet
// part of [distlock.Request]; when they are, the spans will carry them as
// distlock.mode and distlock.limit.
package tracing
