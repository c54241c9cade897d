// Package accesslog is a [distlock.Handler] that writes one [log/slog]
// record per acquisition and per release: the access log of the locks.
//
//	d, err := distlock.New(res, distlock.WithHandlers(accesslog.New(slog.Default()), hot))
//
// An acquisition record carries key, owner (the owner value), outcome
// (acquired, not_acquired or failed; contention is not failure), wait (time
// to the outcome), remote_attempts, token, and error when it did not
// acquire. A release record carries key, owner, outcome (released,
// not_held or failed), hold (time since acquired) and error. Records for
// locks known lost carry outcome lost and the cause.
//
// Levels: [slog.LevelInfo] for acquired, released and not_acquired
// ([WithLevel] changes it), [slog.LevelWarn] for not_held and lost,
// [slog.LevelError] for failures. Nothing is formatted when the logger
// does not log the level.
package accesslog
