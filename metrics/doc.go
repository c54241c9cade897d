// Package metrics is a [distlock.Handler] that counts acquisitions and
// releases and measures how long locks are waited for and held.
//
//	met := metrics.New(metrics.WithMeterProvider(provider))
//	d, err := distlock.New(res, distlock.WithHandlers(met, hot))
//	s := met.Stats() // s.Acquired, s.NotAcquired, s.RemoteAttempts, ...
//
// [Handler.Stats] reads plain counters kept with sync/atomic; they cost no
// allocation per acquisition. When a MeterProvider is given
// ([WithMeterProvider]), the same events are also recorded on OpenTelemetry
// instruments (package go.opentelemetry.io/otel/metric); without one
// nothing is recorded there.
//
// # Outcomes
//
// Contention is not failure. An acquisition ends in one of three outcomes:
//
//   - acquired;
//   - not_acquired: another owner held the key for the whole wait, or the
//     caller's context ended first ([distlock.IsContention]);
//   - failed: any other error, such as a store that did not answer within
//     the wait.
//
// A release is released (the store deleted our lock), not_held
// ([distlock.ErrNotHeld]: it had expired or was taken over) or failed.
//
// # Instruments
//
// With a MeterProvider, the meter "github.com/distlock/distlock/metrics"
// records:
//
//	distlock.acquisitions        counter    {acquisition}  outcome
//	distlock.releases            counter    {release}      outcome
//	distlock.lost                counter    {lock}         locks known lost before Unlock
//	distlock.remote_attempts     counter    {call}         calls that reached the store's acquire
//	distlock.acquire.attempts    histogram  {call}         remote attempts per acquisition, outcome
//	distlock.wait.duration       histogram  s              time to the outcome, outcome
//	distlock.hold.duration       histogram  s              from acquired to released
//	distlock.held                updowncounter {lock}      held now
//	distlock.waiting             updowncounter {acquisition} waiting now
//
// Every measurement has the attribute mode: mutex, semaphore, read or
// write (the sides of a read/write lock), or election (a campaign and
// its leadership), from the Request's Kind. Keys
// and semaphore limits are not recorded as attributes: they would make the
// cardinality unbounded. Put the handler outermost to include the hotspot handler's
// local wait in the wait time.
package metrics
