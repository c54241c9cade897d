package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/crc32"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/distlock/distlock/backend"
)

var (
	_ backend.KindChecker    = (*MySQL)(nil)
	_ backend.Withdrawer     = (*MySQL)(nil)
	_ backend.Inspector      = (*MySQL)(nil)
	_ backend.BatchRefresher = (*MySQL)(nil)
	_ backend.Queuer         = (*MySQL)(nil)
	_ backend.MinQueueWaiter = (*MySQL)(nil)
)

// Queues implements [backend.Queuer]: MySQL queues the waiters of
// semaphores (and the requests of read/write locks) in arrival order, not
// those of mutexes: whichever waiter tries first after a release takes
// the lock. It has no notices: a waiter finds its turn on its next
// attempt.
func (m *MySQL) Queues(k backend.Kind) bool { return k == backend.KindSemaphore }

// MinQueueWait implements [backend.MinQueueWaiter]: a semaphore's line
// serves waits of a second or more (lineMinWait), as on PostgreSQL;
// shorter waits do not queue, and take a permit only while more permits
// are free than waiters wait in line.
func (m *MySQL) MinQueueWait(backend.Kind) time.Duration { return lineMinWait }

// mismatchBit marks the value a kinds acquire leaves in LAST_INSERT_ID()
// when the semaphore's holders took it with another limit, which the low
// bits then give. Tokens never reach 2^62.
const mismatchBit = 1 << 62

// groupCounterKey returns the lock_key of the kinds table's counter row
// (kind 0) that the lock of row kind rk and key draws its tokens from:
// one of tokenBuckets, by crc32 of the kind and the key, for ever.
func groupCounterKey(rk int, key string) string {
	h := crc32.ChecksumIEEE([]byte{byte(rk)})
	h = crc32.Update(h, crc32.IEEETable, []byte(key))
	return strconv.FormatUint(uint64(h%tokenBuckets), 10)
}

// mysqlKindSQL is what the kinds statements on MySQL are made of; see
// kindStmts.
var mysqlKindSQL = strings.NewReplacer(
	// the statement's time, microseconds since 1970 (fixed for the statement)
	"{N}", "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))",
	// a group's holders and intents as rows, n numbering them from 1
	"{JTH}", "JSON_TABLE({T}.state, '$.h[*]' COLUMNS (n FOR ORDINALITY, o VARCHAR(1024) PATH '$.o', k VARCHAR(1) PATH '$.k', e BIGINT PATH '$.e'))",
	"{JTI}", "JSON_TABLE({T}.state, '$.i[*]' COLUMNS (n FOR ORDINALITY, o VARCHAR(1024) PATH '$.o', k VARCHAR(1) PATH '$.k', s BIGINT UNSIGNED PATH '$.s', e BIGINT PATH '$.e'))",
	// the acquiring grant (MariaDB takes no VALUES() in a subquery)
	"{ME}", "JSON_OBJECT('o', HEX(:o), 'k', :k, 't', LAST_INSERT_ID(), 'e', {N} + :ttl, 'l', HEX(:label))",
	"{ME_O}", "HEX(:o)",
	"{ME_K}", ":k",
	"{ME_E}", "{N} + :life",
)

// named turns a statement's :name parameters into ?s, and returns the
// names in order: the arguments to pass.
func named(query string) (string, []string) {
	var names []string
	out := namedParam.ReplaceAllStringFunc(query, func(m string) string {
		names = append(names, m[1:])
		return "?"
	})
	return out, names
}

var namedParam = regexp.MustCompile(`:[a-z][a-z_]*`)

// namedStmt is a prepared statement with named parameters.
type namedStmt struct {
	*sql.Stmt
	names []string
}

// args returns the arguments of st from vals, by name.
func (st namedStmt) args(vals map[string]any) []any {
	out := make([]any, len(st.names))
	for i, n := range st.names {
		v, ok := vals[n]
		if !ok {
			panic("sqldb: no value for parameter :" + n)
		}
		out[i] = v
	}
	return out
}

// kindStmts prepares the statements of semaphores and read/write locks on
// the kinds table kq: one row per lock, whose state holds its holders and
// the intents of its waiting readers and writers (see groupState).
func (m *MySQL) kindStmts(ctx context.Context, kq string, prep func(string) *sql.Stmt) error {
	// {ME} holds {N}; {JTH} and {JTI} {T}: the table, which qualifies
	// the state column (an unqualified column is unknown in JSON_TABLE).
	x := func(q string) string {
		return strings.ReplaceAll(mysqlKindSQL.Replace(mysqlKindSQL.Replace(q)), "{T}", kq)
	}
	nprep := func(q string) namedStmt {
		q, names := named(x(q))
		return namedStmt{prep(q), names}
	}
	// The statements change a row's state in place, never rebuild its
	// arrays: an aggregate over JSON_TABLE (JSON_ARRAYAGG) makes an
	// internal temporary table each time its statement runs, on disk as
	// it holds JSON (MariaDB 10.11: 5 per attempt, refused or not, and 2
	// per release), while EXISTS, COUNT, MIN and MAX over JSON_TABLE make
	// none. An entry is added with JSON_ARRAY_APPEND and changed or
	// dropped by its index, which idx reads with JSON_TABLE. Expired
	// entries therefore stay until dropped, and every rule reads the live
	// ones only (e > {N}). A statement that writes the row drops at most
	// one entry per array: its own, else the last expired one; so an
	// array grows only while all its entries are live, and an acquire
	// that finds no live entry but its own intent writes the state anew.
	// The state keeps its format (groupState): processes of the previous
	// version, which rebuild the arrays, share a table with these. A
	// state written anew is still set on the old one (JSON_SET of both
	// arrays): an expression that reads no column is evaluated once,
	// before the statement draws its token, and {ME} would carry the
	// previous statement's LAST_INSERT_ID (KindsGrantToken).
	//
	// idx is the index (from 0) of the last entry of array arr ("h" or
	// "i") meeting cond, NULL if none; at is the path to the entry of
	// index i, or to an index past any array's end when i is NULL
	// (JSON_REMOVE leaves the document as it is then; a NULL path would
	// make it NULL).
	idx := func(arr, cond string) string {
		return `(SELECT MAX(n) - 1 FROM {JT` + strings.ToUpper(arr) + `} j WHERE ` + cond + `)`
	}
	at := func(arr, i string) string {
		return `CONCAT('$.` + arr + `[', COALESCE(` + i + `, 2147483647), ']')`
	}
	// One statement, two rows, as the mutex's acquire: row 1 bumps the
	// lock's counter (kind 0) into LAST_INSERT_ID(), its row lock held
	// until commit ordering the draws; row 2 is the lock's row: a new
	// one holds us, with the token; an existing one (ON DUPLICATE KEY
	// UPDATE reads and locks its latest version: attempts on one lock are
	// serialized, each deciding on the state the last committed, so the
	// limit is never exceeded) is decided on its live entries:
	//   s: fewer holders than the limit, none took it with another, and
	//      fewer intents precede ours (all of them, with no intent of
	//      ours) than permits are free;
	//   r: no writer holds, and no writer's intent precedes ours (or,
	//      with no intent of ours, no writer's intent at all);
	//   w: nobody holds, and no intent precedes ours (or none at all).
	// A grant adds a holder with the token and drops our intent; an
	// attempt that cannot hold (but a semaphore's refused for another
	// limit) adds an intent for :life from now (0: none, and an intent
	// of ours goes), numbered by the token drawn (arrival order), or
	// renews our live one, keeping its number. An attempt refused
	// without an intent of ours leaves the state as it is.
	// SET is evaluated left to right: state first from the old state,
	// then the others read the new one (and token the old lim). The
	// outcome leaves in LAST_INSERT_ID(): the token; contendedBit | the
	// time until the first other live entry expires (the intents behind
	// ours count too); or mismatchBit | the holders' limit.
	own := `(SELECT s FROM {JTI} j2 WHERE e > {N} AND o = {ME_O} LIMIT 1)`
	liveH := `EXISTS (SELECT 1 FROM {JTH} j WHERE e > {N})`
	ok := `CASE {ME_K}
    WHEN 's' THEN (SELECT COUNT(*) FROM {JTH} j WHERE e > {N}) < :lim
      AND (NOT ` + liveH + ` OR lim = :lim)
      AND (SELECT COUNT(*) FROM {JTI} j WHERE e > {N} AND o <> {ME_O} AND (` + own + ` IS NULL OR s < ` + own + `))
        < :lim - (SELECT COUNT(*) FROM {JTH} j WHERE e > {N})
    WHEN 'r' THEN NOT EXISTS (SELECT 1 FROM {JTH} j WHERE e > {N} AND k = 'w')
      AND NOT EXISTS (SELECT 1 FROM {JTI} j WHERE e > {N} AND o <> {ME_O} AND k = 'w' AND (` + own + ` IS NULL OR s < ` + own + `))
    ELSE NOT ` + liveH + `
      AND NOT EXISTS (SELECT 1 FROM {JTI} j WHERE e > {N} AND o <> {ME_O} AND (` + own + ` IS NULL OR s < ` + own + `))
  END`
	noneLive := `NOT ` + liveH + ` AND NOT EXISTS (SELECT 1 FROM {JTI} j WHERE e > {N} AND o <> {ME_O})`
	deadH := idx("h", `e <= {N}`)
	deadI := idx("i", `e <= {N} AND o <> {ME_O}`)
	mineI := idx("i", `o = {ME_O}`)
	liveMineI := idx("i", `o = {ME_O} AND e > {N}`)
	dropI := `COALESCE(` + mineI + `, ` + deadI + `)`
	newState := `IF(` + ok + `,
    IF(` + noneLive + `, JSON_SET(state, '$.h', JSON_ARRAY({ME}), '$.i', JSON_ARRAY()),
      JSON_ARRAY_APPEND(JSON_REMOVE(state, ` + at("h", deadH) + `, ` + at("i", dropI) + `), '$.h', {ME})),
    IF(:life <= 0 OR {ME_K} = 's' AND lim <> :lim AND ` + liveH + `,
      IF(` + mineI + ` IS NULL, state, JSON_REMOVE(state, ` + at("i", mineI) + `)),
      IF(` + liveMineI + ` IS NULL,
        JSON_ARRAY_APPEND(JSON_REMOVE(state, ` + at("h", deadH) + `, ` + at("i", dropI) + `),
          '$.i', JSON_OBJECT('o', {ME_O}, 'k', {ME_K}, 's', LAST_INSERT_ID(), 'e', {ME_E})),
        JSON_REMOVE(JSON_SET(state, CONCAT('$.i[', ` + liveMineI + `, '].e'), {ME_E}),
          ` + at("h", deadH) + `, ` + at("i", deadI) + `))))`
	// (A live grant only: an expired one of the same owner value may
	// still be in the row.)
	meIn := `EXISTS (SELECT 1 FROM {JTH} j WHERE e > {N} AND o = {ME_O})`
	// (A derived table cannot read the row's column: no UNION of the two.)
	left := `COALESCE(LEAST(COALESCE((SELECT MIN(e) FROM {JTH} j WHERE e > {N} AND o <> {ME_O}), 9223372036854775807),
    COALESCE((SELECT MIN(e) FROM {JTI} j WHERE e > {N} AND o <> {ME_O}), 9223372036854775807)) - {N}, 0)`
	last := `GREATEST(COALESCE((SELECT MAX(e) FROM {JTH} j), 0), COALESCE((SELECT MAX(e) FROM {JTI} j), 0))`
	acq := x(`INSERT INTO ` + kq + ` (lock_key, kind, token, expires_at, lim, state) VALUES
  (:counter, 0, LAST_INSERT_ID({N}), '9999-12-31 23:59:59', 0, NULL),
  (:key, :rk, LAST_INSERT_ID(), UTC_TIMESTAMP(6) + INTERVAL :ttl MICROSECOND, :lim,
   JSON_OBJECT('h', JSON_ARRAY({ME}), 'i', JSON_ARRAY()))
ON DUPLICATE KEY UPDATE
  state = IF(kind = 0, state, ` + newState + `),
  token = IF(kind = 0, LAST_INSERT_ID(token + 1), IF(` + meIn + `, LAST_INSERT_ID(),
    token + 0 * LAST_INSERT_ID(IF({ME_K} = 's' AND lim <> :lim AND ` + liveH + `, 4611686018427387904 | lim, 9223372036854775808 | GREATEST(` + left + `, 0))))),
  lim = IF(kind = 0 OR NOT ` + meIn + `, lim, :lim),
  expires_at = IF(kind = 0, expires_at, '1970-01-01' + INTERVAL ` + last + ` MICROSECOND)`)
	acq, m.kAcqArgs = named(acq)
	m.kAcq = prep(acq)
	var err error
	for i, b := range boundRungs {
		if m.acqBounded[0] == nil || err != nil {
			break
		}
		m.kAcqBounded[i], err = m.db.PrepareContext(ctx, `SET STATEMENT max_statement_time=`+strconv.FormatFloat(b.Seconds(), 'f', -1, 64)+` FOR `+acq)
	}
	// Release, in the common case one statement: delete the row when our
	// grant is live and no other entry is (InnoDB reads and locks the
	// latest version of the rows a DELETE or UPDATE looks at). Otherwise
	// remove our entry (live or expired) and the other array's last
	// expired one; the outcome leaves in LAST_INSERT_ID(): 0 no entry of
	// ours, 1 ours had expired, 2 ours was live, plus 4 when no live entry
	// is left (the row goes then, by a third statement that deletes it
	// only if still so). Withdraw is the same for our intent.
	remove := func(arr, mineCond string) {
		mine := `EXISTS (SELECT 1 FROM {JT` + strings.ToUpper(arr) + `} j WHERE ` + mineCond + `)`
		mineLive := `EXISTS (SELECT 1 FROM {JT` + strings.ToUpper(arr) + `} j WHERE ` + mineCond + ` AND e > {N})`
		othersH, othersI, other := `TRUE`, `TRUE`, "i"
		if arr == "h" {
			othersH = `NOT (` + mineCond + `)`
		} else {
			othersI, other = `NOT (`+mineCond+`)`, "h"
		}
		noOthers := `NOT EXISTS (SELECT 1 FROM {JTH} j WHERE e > {N} AND ` + othersH + `)
    AND NOT EXISTS (SELECT 1 FROM {JTI} j WHERE e > {N} AND ` + othersI + `)`
		del := nprep(`DELETE FROM ` + kq + ` WHERE lock_key = :key AND kind = :rk AND ` + mineLive + ` AND ` + noOthers)
		upd := nprep(`UPDATE ` + kq + `
SET token = token + 0 * LAST_INSERT_ID(1 + IF(` + mineLive + `, 1, 0) + IF(` + noOthers + `, 4, 0)),
  state = JSON_REMOVE(state, ` + at(arr, idx(arr, mineCond)) + `, ` + at(other, idx(other, `e <= {N}`)) + `)
WHERE lock_key = :key AND kind = :rk AND ` + mine)
		if arr == "h" {
			m.kRel, m.kRelAny = del, upd
		} else {
			m.kWdr, m.kWdrAny = del, upd
		}
	}
	remove("h", `o = HEX(:o) AND k = :k`)
	remove("i", `o = HEX(:o) AND k = :k`)
	m.kGone = nprep(`DELETE FROM ` + kq + ` WHERE lock_key = :key AND kind = :rk
  AND NOT EXISTS (SELECT 1 FROM {JTH} j WHERE e > {N}) AND NOT EXISTS (SELECT 1 FROM {JTI} j WHERE e > {N})`)
	mineLive := `o = HEX(:o) AND k = :k AND e > {N}`
	m.kRef = nprep(`UPDATE ` + kq + `
SET state = JSON_SET(state, CONCAT('$.h[', ` + idx("h", mineLive) + `, '].e'), {N} + :ttl),
  expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL :ttl MICROSECOND)
WHERE lock_key = :key AND kind = :rk AND EXISTS (SELECT 1 FROM {JTH} j WHERE ` + mineLive + `)`)
	m.kInspect = prep(x(`SELECT state, lim, {N} FROM ` + kq + ` WHERE lock_key = ? AND kind = ?`))
	return err
}

// CheckKind implements backend.KindChecker: MySQL holds mutexes,
// semaphores and read/write locks.
func (m *MySQL) CheckKind(backend.Kind) error { return nil }

// kindVals are the named arguments of the kinds statements for l; life
// is the life of the intent a refused attempt records (see
// groupIntentLife).
func kindVals(l *backend.Lease, life time.Duration) map[string]any {
	rk := groupRow(l.Kind)
	return map[string]any{"counter": groupCounterKey(rk, l.Key), "key": l.Key, "rk": rk, "ttl": micros(l.TTL),
		"lim": l.Limit, "o": l.Value, "k": mode(l.Kind), "label": l.Label, "life": groupIntentLife(l, life)}
}

// kindArgs are the kinds acquire's arguments for l, whose refused
// attempt records an intent for life (see groupIntentLife).
func (m *MySQL) kindArgs(l *backend.Lease, life time.Duration) []any {
	return namedStmt{names: m.kAcqArgs}.args(kindVals(l, life))
}

// kindStmt returns the kinds acquire statement bounded on the server by
// the shortest rung not below bound, and that rung.
func (m *MySQL) kindStmt(bound time.Duration) (*sql.Stmt, time.Duration) {
	if m.kAcqBounded[0] == nil {
		return m.kAcq, 0
	}
	for i, b := range boundRungs {
		if b >= bound {
			return m.kAcqBounded[i], b
		}
	}
	return m.kAcqBounded[len(boundRungs)-1], boundRungs[len(boundRungs)-1]
}

// groupRemove runs a release (del, upd: kRel, kRelAny) or withdrawal
// (kWdr, kWdrAny) of l's entry, and deletes the row if that left it
// without a live entry. It reports whether the entry was live.
func (m *MySQL) groupRemove(ctx context.Context, del, upd namedStmt, l *backend.Lease) (bool, error) {
	vals := kindVals(l, 0)
	n, err := m.exec(ctx, del.Stmt, del.args(vals)...)
	if err != nil || n > 0 {
		return err == nil, err
	}
	var out int64
	err = retryConflicts(myContention, func() error {
		res, err := upd.ExecContext(ctx, upd.args(vals)...)
		if err == nil {
			out, err = res.LastInsertId()
		}
		return err
	})
	if err == nil && out&4 != 0 {
		_, err = m.exec(ctx, m.kGone.Stmt, m.kGone.args(vals)...)
	}
	return out&2 != 0, err
}

// Withdraw implements backend.Withdrawer: it deletes l.Value's intent in
// l.Key's semaphore or read/write lock, if any, with the row when nothing
// else is left in it. For a mutex, or a semaphore whose acquisition does
// not wait in line (l.Waits unset), it returns nil without I/O: their
// attempts record no intent.
func (m *MySQL) Withdraw(ctx context.Context, l *backend.Lease) error {
	if err := m.validate(l); err != nil {
		return err
	}
	if !recordsIntent(l) {
		return nil
	}
	if _, err := m.groupRemove(ctx, m.kWdr, m.kWdrAny, l); err != nil {
		return fmt.Errorf("sqldb: mysql: withdraw %q: %w", l.Key, err)
	}
	return nil
}

// Inspect implements backend.Inspector: it reads the lock of key and kind
// in one statement, and writes nothing.
func (m *MySQL) Inspect(ctx context.Context, key string, kind backend.Kind) (backend.Inspection, error) {
	if err := m.ValidateKey(key); err != nil {
		return backend.Inspection{}, err
	}
	var in backend.Inspection
	if kind == backend.KindMutex {
		var (
			tok   uint64
			left  int64
			label []byte
		)
		err := m.inspect.QueryRowContext(ctx, key).Scan(&tok, &left, &label)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return in, nil
		case err != nil:
			return in, fmt.Errorf("sqldb: mysql: inspect %q: %w", key, err)
		}
		in.Holders = []backend.Holder{{Kind: kind, Token: tok, TTL: time.Duration(left) * time.Microsecond, Label: string(label)}}
		return in, nil
	}
	var (
		state []byte
		lim   int
		now   int64
	)
	err := m.kInspect.QueryRowContext(ctx, key, groupRow(kind)).Scan(&state, &lim, &now)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return in, nil
	case err != nil:
		return in, fmt.Errorf("sqldb: mysql: inspect %q: %w", key, err)
	}
	st, err := parseState(state)
	if err == nil {
		in, err = st.inspection(now, lim)
	}
	if err != nil {
		return in, fmt.Errorf("sqldb: mysql: inspect %q: %w", key, err)
	}
	return in, nil
}

// RefreshAll implements backend.BatchRefresher: it extends the mutexes
// among ls in one statement (an UPDATE joined with the leases as a JSON
// document, a parameter of one prepared statement whatever the batch's
// size), and the other kinds' grants one statement each. When the
// UPDATE renewed fewer leases than it was given, a second statement
// finds which: those that are not live and ours get an error wrapping
// backend.ErrNotHeld. A failed statement fails the leases it carried,
// and only those.
func (m *MySQL) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	errs := make([]error, len(ls))
	var idx []int
	var doc strings.Builder
	doc.WriteByte('[')
	for i, l := range ls {
		switch {
		case m.validate(l) != nil:
			errs[i] = m.validate(l)
		case l.Kind != backend.KindMutex:
			errs[i] = m.Refresh(ctx, l)
		default:
			if len(idx) > 0 {
				doc.WriteByte(',')
			}
			idx = append(idx, i)
			fmt.Fprintf(&doc, `{"i":%d,"k":"%X","o":"%X","t":%d}`, len(idx), l.Key, l.Value, micros(l.TTL))
		}
	}
	doc.WriteByte(']')
	if len(idx) == 0 {
		return errs
	}
	n, err := m.exec(ctx, m.refAll, doc.String())
	renewed := make([]bool, len(idx))
	if err == nil && n == int64(len(idx)) {
		return errs
	}
	if err == nil {
		err = func() error {
			rows, err := m.heldAll.QueryContext(ctx, doc.String())
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var j int
				if err := rows.Scan(&j); err != nil {
					return err
				}
				if j >= 1 && j <= len(idx) {
					renewed[j-1] = true
				}
			}
			return rows.Err()
		}()
	}
	for j, i := range idx {
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("sqldb: mysql: refresh %q: %w", ls[i].Key, err)
		case !renewed[j]:
			errs[i] = backend.ErrNotHeld
		}
	}
	return errs
}

// myMismatch decodes a kinds acquire's LAST_INSERT_ID() that says the
// holders took the semaphore with another limit.
func myMismatch(id uint64) (lim int, ok bool) {
	if id&contendedBit == 0 && id&mismatchBit != 0 {
		return int(id &^ mismatchBit), true
	}
	return 0, false
}
