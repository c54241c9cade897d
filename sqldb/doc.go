// Package sqldb keeps distlock locks in a SQL table: PostgreSQL through
// github.com/jackc/pgx/v5 ([NewPostgres], [Postgres]) and MySQL or
// MariaDB through database/sql with github.com/go-sql-driver/mysql
// ([NewMySQL], [MySQL]). Both are pull stores: they implement
// backend.Spinner, backend.Refresher, backend.BatchRefresher,
// backend.KindChecker (mutexes, semaphores and read/write locks),
// backend.Withdrawer, backend.Inspector, backend.Relabeler (an election's
// Proclaim) and backend.KeyValidator, and are used through distlock.New.
// Both queue the waiters of semaphores that wait a second or more in
// arrival order, and [Postgres] those of mutexes too, waking the head of
// the line only (backend.Queuer, backend.MinQueueWaiter,
// backend.HeadNotifier; see "Waiting in line"):
//
//	pool, _ := pgxpool.New(ctx, dsn)
//	res, err := sqldb.NewPostgres(ctx, pool)
//	...
//	d, err := distlock.New(res)
//	defer d.Close() // stops the LISTEN connection; the pool stays open
//
// # Schema
//
// The constructors create the table (default [DefaultTable], see
// [WithTable]) and the kinds table beside it (the same name and _kinds)
// when they do not exist. That is their only I/O, bounded by their
// context, or by [DefaultSetupTimeout] (10s) when it has no deadline. A
// nil pool or db or a bad option fails them before any I/O with an error
// wrapping distlock.ErrInvalid.
//
// PostgreSQL:
//
//	CREATE SEQUENCE distlock_locks_token_seq;
//	CREATE TABLE distlock_locks (
//	  lock_key   varchar(255) COLLATE "C" PRIMARY KEY,
//	  owner      text NOT NULL,
//	  token      bigint NOT NULL,
//	  expires_at timestamptz NOT NULL,
//	  waited     boolean NOT NULL DEFAULT false, -- a contender tried: notify on release
//	  label      bytea NOT NULL DEFAULT '',      -- distlock.WithLabel, shown by Inspect
//	  queue      jsonb,                          -- the waiters' intents (see Waiting in line)
//	  gone       jsonb                           -- markers of waiters that left (see Waiting in line)
//	);
//	ALTER SEQUENCE distlock_locks_token_seq OWNED BY distlock_locks.token;
//	CREATE TABLE distlock_locks_kinds (
//	  lock_key   bytea NOT NULL,
//	  kind       smallint NOT NULL,   -- 0 mutex, 1 semaphore, 2 read/write lock
//	  owner      text NOT NULL DEFAULT '',
//	  token      bigint NOT NULL,
//	  expires_at timestamptz NOT NULL, -- a group's: its last entry's
//	  waited     boolean NOT NULL DEFAULT false,
//	  label      bytea NOT NULL DEFAULT '',
//	  lim        integer NOT NULL DEFAULT 0, -- a semaphore's limit
//	  state      jsonb,                 -- a group's holders and intents; a mutex's intents
//	  gone       jsonb,                 -- a mutex's markers (see Waiting in line)
//	  PRIMARY KEY (lock_key, kind)
//	);
//
// MySQL/MariaDB:
//
//	CREATE TABLE distlock_locks (
//	  lock_key   VARBINARY(255) NOT NULL PRIMARY KEY,
//	  owner      VARBINARY(255) NOT NULL,
//	  token      BIGINT UNSIGNED NOT NULL,
//	  expires_at DATETIME(6) NOT NULL,  -- UTC
//	  label      VARBINARY(256) NOT NULL DEFAULT ''
//	) ENGINE=InnoDB;
//	CREATE TABLE distlock_locks_kinds (
//	  lock_key   VARBINARY(255) NOT NULL,
//	  kind       TINYINT UNSIGNED NOT NULL, -- 0 counter, 1 semaphore, 2 read/write lock
//	  token      BIGINT UNSIGNED NOT NULL,
//	  expires_at DATETIME(6) NOT NULL,
//	  lim        INT NOT NULL DEFAULT 0,
//	  state      LONGTEXT,                  -- JSON: holders and intents
//	  PRIMARY KEY (lock_key, kind)
//	) ENGINE=InnoDB;
//
// plus up to 1024 fencing counter rows in each (expiring in year 9999),
// made as keys are first locked: in the main table, keyed by the bytes
// "\x00distlock:token:" and a bucket number; in the kinds table, of kind
// 0, keyed by the bucket number. Keys are compared byte for byte on both
// (collation "C", bytea, VARBINARY), so "a" and "A" are different locks.
//
// Any Go string is a key. On PostgreSQL a key that is text (valid UTF-8
// without NUL) keeps its mutex in the main table, and any other key in
// the kinds table, whose keys are bytes (kind 0): each key has one place,
// always. A key holds at most [MaxKeyLen] characters on PostgreSQL (a byte
// that is not valid UTF-8 counts as one) and [MaxKeyLen] bytes on MySQL,
// where keys starting like a counter's are reserved; the empty key is
// never valid. The facade rejects other keys with a clear error before any
// I/O (ValidateKey). On MySQL the owner value is at most 255 bytes.
//
// Several keys at once (distlock's TryLockAll) are taken one by one by
// the facade: the backends do not implement backend.MultiSpinner.
//
// # Statements and clock
//
// Every operation is one statement, one round trip, in the common case:
//
//   - Acquire inserts the row, or takes over a row whose expires_at is
//     past, and returns the new token. PostgreSQL:
//     INSERT .. ON CONFLICT (lock_key) DO UPDATE .. WHERE expires_at <= now()
//     .. RETURNING token; when the key is held, the first contender marks
//     the row waited and gets the holder's remaining time back (later
//     contenders change nothing). An attempt of a wait in line (see
//     Waiting in line) takes a larger statement of the same form, which
//     also records or renews its intent and returns the time until the
//     holder's expiry or the lapse of the intents ahead of its own. MySQL: a two-row
//     INSERT .. ON DUPLICATE KEY UPDATE whose first row bumps the key's
//     counter into LAST_INSERT_ID() and whose second row takes the lock
//     guarded by expiry; the outcome travels back in the OK packet's insert id, with
//     the holder's remaining time when the lock is held.
//
//   - Release deletes the row where key and owner match. An expired row of
//     ours is deleted too, and Release then returns backend.ErrNotHeld (on
//     MySQL that case takes a second statement). PostgreSQL: a plain
//     DELETE of our live row that nobody waited for, then, if it deleted
//     nothing, one statement that deletes the row and calls pg_notify
//     when waited is set, or, when waiters are queued in it, keeps it for
//     the head of the line and notifies the head (a statement naming
//     pg_notify and returning a row costs about 6% of an uncontended
//     cycle, pinned, even when the function is not called: hence the
//     plain DELETE first). A mutex whose acquisition did not wait in line
//     tries, between the two, a DELETE .. RETURNING that notifies when
//     waited is set and nobody queued in the row, smaller than the last
//     one. A mutex granted while others waited in line behind it
//     releases with the last statement alone.
//
//   - Refresh sets expires_at anew where key and owner match and the lease
//     has not run out.
//
//   - Renewals due together (the facade's scheduler, backend.BatchRefresher)
//     are one statement per batch of mutexes: PostgreSQL, an UPDATE joined
//     with the leases' keys, owners and TTLs as arrays (unnest .. WITH
//     ORDINALITY), which returns the leases it renewed; MySQL, one prepared
//     UPDATE joined with the leases as a JSON document (JSON_TABLE), whose
//     affected rows say whether all were renewed, and a second statement,
//     only when some were not, names them. A semaphore's or read/write
//     lock's grant is renewed by a statement of its own.
//
//   - Inspect reads a lock's row in one statement: the holders' tokens,
//     labels and time left by the database's clock.
//
//   - Relabel (distlock.Election.Proclaim) updates a mutex row's label if
//     the row is live and holds the owner value: one UPDATE (on MySQL, a
//     read after it when it changed no row, since MySQL counts only the
//     rows whose values changed).
//
// An uncontended TryLock+Unlock is two statements, two round trips, the
// same as a bare upsert and delete (see BenchmarkPostgresCycle). On
// PostgreSQL those two go through pgconn, pgx's wire layer, prepared once
// per connection, with binary parameters and results, when the pool has
// no tracer (a QueryTracer: then every statement takes pgx's query path,
// which calls it); the other statements go through pgx's query path.
//
// Expiry is judged by the database's clock only: now() on PostgreSQL,
// UTC_TIMESTAMP(6) on MySQL (independent of the session's time_zone). The
// client sends the TTL as a number of microseconds (rounded up) and never a
// timestamp, so clients with skewed clocks or different time zones agree.
// Each statement uses one time for all its checks (the statement's start).
//
// # Fencing token
//
// Lease.Token strictly increases across successive holders of every key in
// one table. A number drawn before the acquire wins the row must not be
// stored after a later number's holder has come and gone, so the draw is
// serialized with the acquire's commit:
//
//   - PostgreSQL draws from the table's sequence (table_token_seq) while
//     holding a transaction-scoped advisory lock on the key
//     (pg_advisory_xact_lock(int4, int4): the table's oid and
//     hashtext(key)), released when the statement commits. Acquires of one
//     key queue on it for the length of one statement; releases and
//     refreshes do not take it. A hash collision only makes two keys'
//     acquires queue for each other. The lock is keyed by the table's oid,
//     not its name, so processes that spell the table differently ("t",
//     "public.t", "t" under another search_path) still queue on one lock:
//     [NewPostgres] resolves the name once and uses the table it found,
//     schema-qualified, from then on.
//   - MySQL bumps the key's counter row, one of 1024 (the bucket is
//     crc32(key) mod 1024, for ever: a key must always draw from the same
//     counter), whose row lock the acquire holds until it commits. Acquires
//     of one key, and of the keys that share its bucket, queue on it for
//     the length of one statement; acquires of other keys do not wait for
//     them (BenchmarkMariaDBParallelKeys).
//
// Failed attempts consume numbers too: tokens have gaps. A MySQL counter
// row starts, when the first acquire in its bucket makes it, at the
// server's time in microseconds since 1970 (over 1.7e15), above
// any realistic count of acquisitions: so should one be deleted, it comes
// back above every token it gave, and tokens keep increasing (unless the
// server's clock went back too).
//
// # Semaphores and read/write locks
//
// A semaphore or a read/write lock is one row of the kinds table, whose
// state (JSON) lists its holders (owner, grant: s, r or w, token, expiry
// in microseconds by the database's clock, label) and, for a read/write
// lock, the intents of its waiting readers and writers (owner, side,
// arrival number, expiry). A semaphore's limit is kept beside them (lim).
// Every attempt is one statement, an upsert of that row, whose row lock
// serializes the attempts on one lock: PostgreSQL's ON CONFLICT DO UPDATE
// and InnoDB's ON DUPLICATE KEY UPDATE read the row's latest version
// whatever the statement's snapshot, so each attempt decides on the state
// the last one committed, and concurrent acquirers never exceed the
// limit. (Holder rows of their own, counted by the statement, would not
// do: in READ COMMITTED a PostgreSQL statement's snapshot is taken before
// any lock it waits for, and it would count without the rows inserted
// meanwhile.) On the live entries:
//
//   - a permit is granted when fewer than the limit hold, the holders
//     took the semaphore with the same limit, and fewer waiters' intents
//     precede the attempt's own (all of them, without one) than permits
//     are free (see Waiting in line); with other holders' limit the
//     acquire fails with backend.ErrLimitMismatch (no holder: the next
//     acquire sets the limit anew);
//   - a writer holds when nobody holds and no intent precedes its own (or,
//     without one, when there is none); a reader when no writer holds and
//     no writer's intent precedes its own (or none at all);
//   - a read or write attempt that cannot hold records its intent, or
//     renews it (for another TTL from the attempt: the facade's spin
//     makes the next attempt well within it), numbered by the token drawn
//     for the attempt, which orders arrivals; so does a semaphore
//     attempt of an acquisition that waits in line, for the intent's
//     life a mutex's waiter gets (see Waiting in line); a grant drops
//     it; backend.Withdrawer deletes it when the wait ends without the
//     lock;
//   - expired entries are dropped by whichever statement next writes the
//     row (PostgreSQL: all of them; MySQL: one per array, the rules
//     reading live entries only, since rebuilding the arrays took an
//     aggregate over JSON_TABLE, which makes a temporary table on disk
//     per statement; an array then grows only while all its entries are
//     live).
//
// Semaphore waiters that wait in line get freed permits in order of
// arrival, and read and write requests are served in order of arrival,
// as above.
//
// Tokens of a lock's grants (permits; read and write grants) increase,
// ordered by commit as a mutex's are: drawn under the advisory lock of
// (the kinds table's oid, the row's kind and key) on PostgreSQL, from one
// of the kinds table's counter rows (by crc32 of the kind and key) on
// MySQL. A key's mutex, semaphore and read/write lock are distinct rows,
// so distinct locks.
//
// No row is left behind: a release or withdrawal deletes the row when its
// entry was the last live one; when the statement's snapshot still had
// another live entry that left meanwhile (PostgreSQL), or the row was left
// with none (MySQL: the UPDATE's outcome says so), a second statement
// deletes the row if it still has no live entry. A release or withdrawal
// on PostgreSQL notifies the key's waiters, of every kind, when a
// contender marked the row, but for a semaphore with waiters in line (see
// Waiting in line).
//
// # Waiting in line
//
// On PostgreSQL the waiters of a mutex whose wait is a second or more
// queue in the lock's row, in arrival order, as a read/write lock's
// requests do (see backend.Queuer and backend.MinQueueWaiter). A shorter
// wait does not queue: it spins and wakes on the key's notices as on
// MySQL, and takes the lock only while nobody waits in line. The line
// hands the lock on one waiter at a time, each handoff a release with its
// NOTIFY and the head's attempt (a grant every 38ms with 20ms holds,
// 3 processes x 4 goroutines at load 11 on 2 cores: about 18ms a
// handoff), so a wait of 200ms would reach the head past about ten
// waiters, and a line of short waits hands the lock mostly to heads whose
// wait is ending. An attempt of an acquisition that waits in line
// (backend.Lease.Waits) and cannot hold records an intent {owner, arrival
// number, expiry}: the arrival number is the token drawn for the attempt,
// under the key's advisory lock, so numbers follow the order in which the
// attempts committed; the expiry is l.TTL from the attempt, but no later
// than 50ms before the end of the acquisition's context (its wait, plus
// the facade's grace for the last attempt), and each next attempt of the
// acquisition renews it, keeping its number. So a waiter that left holds
// up nobody past the end of its wait, even when its withdrawal comes late
// (its last attempt, abandoned at the wait's end, may commit after it) or
// never (the process died), and the lock is never kept for a head with
// less than 50ms of its wait left: a release's notice and the head's
// attempt take a few milliseconds, tens under load, and a lock kept for a
// head that cannot take it in time waits for that head's withdrawal. A
// mutex is granted when it is free and no live intent precedes the
// attempt's own (or, without an intent of its own, when none waits). A
// single attempt (a wait of 0), or one with less than 50ms of its wait
// left, records nothing.
//
// A release with live intents keeps the row for the head of the queue
// (an empty owner, expiry -infinity) and notifies it: a NOTIFY on the table's
// queue channel (the channel's name and _q) whose payload is the head's
// owner value, which each process's listener passes to that waiter only
// ([Postgres.SubscribeHead]). A newcomer is refused the kept lock and
// queues; a head that never comes (it died, or never heard its notice) is
// passed over when its intent lapses, at most l.TTL after its last
// attempt (and before the end of its wait), and the waiter behind it is
// told, in its refused attempt's reply, to come back then (a waiter
// further back, when every intent ahead of its own will have lapsed). A
// waiter whose wait ends withdraws its intent (Withdraw), and, when the
// lock was kept for it, the next in line is notified. When the waiter's
// last attempt was abandoned with its statement in flight, that statement
// may reach the server after the withdrawal: the withdrawal then leaves a
// marker of the owner value in the row (column gone, for l.TTL at most),
// under which the acquire statements neither queue that value again nor
// take the lock for it; the row stays while a marker lives, and the
// attempt's clean-up, once the statement has settled, removes the marker
// (and the row, when nothing else is left in it). An owner value of 8000
// bytes or more cannot be a NOTIFY's payload: such a head is not woken
// and comes on its own, within backend.HeadPoll.
//
// A semaphore's waiters queue the same way, on both stores, in its row
// of the kinds table (see Semaphores and read/write locks): an attempt
// of an acquisition that waits a second or more and cannot hold records
// or renews an intent, numbered and bounded as a mutex waiter's, and a
// permit is granted only while fewer live intents precede the attempt's
// own than permits are free: the first k waiters in line can take k free
// permits, and a newcomer without an intent only a permit that no waiter
// in line waits for. No permit is kept for anybody: a release frees it,
// and on PostgreSQL it notifies, as a mutex's release notifies its head,
// the first waiters in line, as many as permits are free, and the key's
// waiters only when more permits are free than waiters wait in line (on
// MySQL the waiters find their turn on their next attempt). A waiter in
// line that died holds a permit back from those behind it until its
// intent lapses, at most l.TTL after its last attempt and before the end
// of its wait. Shorter waits do not queue, as for a mutex: a permit waits
// for the first waiters in line, and a line of short waits would hold
// permits mostly for heads whose wait is ending. Order costs throughput
// where holds are short: a freed permit waits for the head's notice and
// attempt instead of going to whichever request comes first (most often
// the releasing goroutine's next one). With the bench's semaphore
// workload on PostgreSQL (limit 3, 3 processes x 4 goroutines, 5ms
// holds, 5s waits) the line granted 170 permits a second at 3.0
// statements per grant, against 314 at 3.9 without it (one run each,
// load 3-5 on 2 cores).
//
// [MySQL]'s mutexes keep no queue (it has no notifications to wake a
// head with): whichever waiter tries first after a release takes the
// lock, in no particular order. Semaphores and read/write locks keep
// their order of arrival on both stores.
//
// # Contention and errors
//
// A serialization failure, deadlock or lock timeout (PostgreSQL SQLSTATE
// 40001, 40P01, 55P03; MySQL errors 1213, 1205) during an acquire is
// contention: TryAcquire reports acquired == false with a nil error and the
// facade's spin loop tries again within the caller's wait, so the caller
// sees distlock.ErrNotAcquired only when the wait runs out. Release and
// Refresh rerun their statement after a serialization failure or deadlock
// (up to 5 times): sessions in REPEATABLE READ or SERIALIZABLE isolation
// work. Any other
// database error is returned wrapped with the operation and key.
//
// # A stalled database
//
// Every call returns when its context ends, whatever the database does
// (a table locked by a migration, a frozen server, a lost reply): the
// facade bounds every acquire attempt by the caller's context and wait.
// Release and Refresh run their statements under the caller's context:
// the drivers drop the connection when it ends, and a statement left
// running on the server deletes or extends only the caller's own row.
//
// An acquire statement runs in a goroutine of its own. When the context
// ends before its reply, TryAcquire returns a backend.AbandonedError at
// once, and the statement runs on: dropping it would not stop the server,
// which could commit the row after a clean-up sent over another
// connection had found nothing. Its Cleanup (the facade runs it in the
// background; Close waits for it within its bound) waits for the
// statement's reply, then deletes the row by key and owner if the
// statement wrote it after all, or if no reply came by a second past the
// statement's server-side bound (the connection is then dropped, best
// effort: a server that answers nothing for that long may still be
// holding the statement).
//
// The server-side bound is the time left until the context's deadline, at
// most 5s, counted from when the statement reached the server: past it an
// acquire writes nothing, so an abandoned attempt takes no key once the
// database answers again. A statement stopped so while its context lives
// (the table was locked for over 5s) fails with a store error wrapping
// context.DeadlineExceeded.
//
//   - PostgreSQL: the statement compares clock_timestamp() with the start
//     of its transaction, after every lock it waited for; past the bound
//     its token is null and the insert fails its NOT NULL constraint (the
//     statement is rolled back), and a conflicting row is left as it was.
//     The statement still waits for the table's lock, so an abandoned one
//     is also cancelled at once with a cancel request (pgconn sends one,
//     over a new connection to the same server, when it closes a
//     connection in mid-statement): its process ends within milliseconds
//     and the clean-up, which waits for it, is over. At most two
//     clean-ups of a store look for their statement's process at once;
//     the others wait for the statement's bound.
//   - MariaDB: SET STATEMENT max_statement_time, which interrupts the
//     statement wherever it waits and rolls it back (ER_STATEMENT_TIMEOUT).
//     The bound is a constant of the prepared statement, so the acquire is
//     prepared with bounds of 250ms, 500ms, 1s, 2s and 5s, and an attempt
//     takes the shortest not below its time left: an abandoned statement
//     runs on until that bound, and should the table be unlocked meanwhile
//     it takes the key, until its clean-up deletes the row on its reply. (A
//     trigger on the lock table cannot be used to watch this: MariaDB loses
//     the acquire's LAST_INSERT_ID when a trigger runs a statement.)
//   - MySQL has no per-statement time limit for an INSERT (its optimizer
//     hints cover SELECT): the acquire runs unbounded, and an abandoned
//     statement that the server runs more than 6s later may leave a row
//     that expires with its TTL.
//
// # Wake-up
//
// [Postgres] implements backend.Notifier and backend.HeadNotifier: while
// this process has waiters it keeps one dedicated connection that LISTENs
// on the table's channel, distlock_ followed by the table's oid (one
// channel however the table is spelled), and on its queue channel (the
// same and _q). A release of a mutex or semaphore with queued waiters
// notifies the head on the queue channel (see Waiting in line). Otherwise
// Release (and Withdraw) notifies when a contender tried the lock while
// it was held, with the key as payload, or, for a key that is not text,
// `\x` and its bytes in hex (a listener wakes the waiters of both
// readings); such a notice wakes the key's waiters of every kind. The
// connection is taken from the pool,
// so the pool's hooks (BeforeConnect with dynamic credentials,
// AfterConnect) ran for it, and then removed from it (it no longer counts
// against MaxConns); it closes about a second after the last waiter
// leaves, and on [Postgres.Close]. Behind a transaction-pooling proxy such
// as PgBouncer it hears nothing. Notices are hints; the spin loop stays
// the fallback.
// [MySQL] has no notifications and spins.
//
// # Running against an existing database
//
// Create the tables ahead of time (the statements above) if the
// application's role may not create tables; the constructors then only
// check that they exist. PostgreSQL privileges: SELECT, INSERT, UPDATE,
// DELETE on the table and the kinds table, USAGE on the sequence; CREATE
// on the schema only if the tables are to be created. Advisory locks need
// no privilege. MySQL privileges: SELECT, INSERT, UPDATE, DELETE on both
// tables; CREATE only to create them. The pool's settings are respected; the backend never closes
// the pool or *sql.DB. With go-sql-driver, statements are prepared once
// per connection, so any DSN works (no parseTime, no multiStatements).
//
// # Cleanup of expired rows
//
// Per lock key the store keeps one row while the lock is held or waited
// for (a mutex's in the main table, a semaphore's or read/write lock's in
// the kinds table), and besides rows per key only a bounded set: on
// PostgreSQL the token sequence, one per table; on MySQL the fencing
// counter rows, at most 1024 in each table (the bucket of a key is a
// hash of it, so a million distinct keys share the same 1024 rows). A
// lock that is released leaves no row, of any kind. A holder that dies
// leaves its row (or its entry in a group's row) until the next acquirer
// takes it over or drops it (it is expired, so that is one statement) —
// no dead end. Rows of keys that are never locked again stay; remove them
// at leisure, which is safe at any time:
//
//	DELETE FROM distlock_locks WHERE expires_at < now();                   -- PostgreSQL
//	DELETE FROM distlock_locks_kinds WHERE expires_at < now();
//	DELETE FROM distlock_locks WHERE expires_at < UTC_TIMESTAMP(6);        -- MySQL
//	DELETE FROM distlock_locks_kinds WHERE expires_at < UTC_TIMESTAMP(6);
//
// (The MySQL counter rows expire in year 9999: the statements keep them.
// A PostgreSQL row kept for the head of its queue is expired too: deleting
// it costs its waiters their places in line, never a lock.)
package sqldb
