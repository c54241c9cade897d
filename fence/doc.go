// Package fence is the resource side of distlock's fencing tokens: it
// refuses a write that carries a token below one the resource has
// accepted, atomically with the write.
//
// A lock with a TTL can expire while its holder is paused (a GC pause, a
// page fault, a slow network): the holder wakes up believing it holds the
// lock and writes, while a newer holder writes too. distlock.Lock.Token
// strictly increases with every new holder of a key; a resource that
// remembers the highest token it accepted and refuses lower ones turns
// the late holder's write into an error, [ErrStale] (a [*StaleError],
// carrying both tokens):
//
//	lk, err := d.TryLock(ctx, "invoice:42", time.Second)
//	...
//	tx, err := db.BeginTx(ctx, nil)
//	...
//	defer tx.Rollback()
//	if err := invoices.Check(ctx, tx, "invoice:42", lk.Token()); err != nil {
//		return err // errors.Is(err, fence.ErrStale): a newer holder wrote
//	}
//	_, err = tx.ExecContext(ctx, "UPDATE invoices SET total = $1 WHERE id = 42", total)
//	...
//	return tx.Commit()
//
// An equal token passes (the same holder writing again). Tokens of
// different locks do not compare: fence one resource with one lock key,
// and name the resource the same way in every writer.
//
// # Stores
//
//   - [SQL], for PostgreSQL ([Postgres]) and MySQL/MariaDB ([MySQL]) through
//     database/sql: a fence table, checked inside the caller's
//     transaction by one upsert, so the transaction's other writes commit
//     only with an accepted token. sqldb.PostgresFence is the same
//     table through pgx.
//   - The Redis store's Fence (package github.com/distlock/distlock/redis):
//     guarded SET, DEL and HSET, and scripts of your own, each one Lua
//     script that checks and writes, keeping the highest token beside
//     the key, in its Redis Cluster hash slot.
//   - [Local]: in this process's memory, for a service that is itself the
//     resource, through [Middleware].
//
// # HTTP
//
// A service that is itself the resource takes the token in the request
// header [Header], and [Middleware] checks it against a [Guard] before
// the handler runs, refusing a stale one with 409 Conflict and both
// tokens; [CheckResponse] turns that answer back into a [*StaleError] on
// the client.
//
// # Errors
//
// A stale token: a [*StaleError], errors.Is(err, ErrStale). Bad input (an
// empty resource, token 0, a nil transaction, a bad table name) is an
// error wrapping distlock.ErrInvalid, returned before any I/O. Any other
// error is the store's, wrapped with the resource.
package fence
