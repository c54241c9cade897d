package redisscript

import (
	"context"
	_ "embed"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed cleanup.lua
	cleanupSrc string
	//go:embed clock.lua
	clockSrc string
	//go:embed waited.lua
	waitedSrc string
	//go:embed group.lua
	groupSrc string
	//go:embed semacquire.lua
	semAcquireSrc string
	//go:embed rwacquire.lua
	rwAcquireSrc string
	//go:embed grouprelease.lua
	groupReleaseSrc string
	//go:embed groupextend.lua
	groupExtendSrc string
	//go:embed groupcleanup.lua
	groupCleanupSrc string
	//go:embed rwwithdraw.lua
	rwWithdrawSrc string
	//go:embed inspect.lua
	inspectSrc string
	//go:embed multiacquire.lua
	multiAcquireSrc string
	//go:embed batchextend.lua
	batchExtendSrc string
	//go:embed relabel.lua
	relabelSrc string
	//go:embed queue.lua
	queueSrc string
	//go:embed withdraw.lua
	withdrawSrc string
)

// FenceGrace is how long a fence outlives the lock it last served: every
// grant writes its fence with the lock's TTL plus FenceGrace, and a
// renewal of a mutex ([Extend] with its fence flag, [BatchExtend])
// lengthens the fence with the lock. Tokens stay strictly increasing when
// a fence has expired (the hybrid clock, see [Acquire]) unless the
// server's clock steps back by more than FenceGrace. The scripts read it
// as FENCE_GRACE_MS, written in front of their text.
const FenceGrace = 10 * time.Second

// graceSrc defines FENCE_GRACE_MS for the scripts.
var graceSrc = "local FENCE_GRACE_MS = " + strconv.FormatInt(FenceGrace.Milliseconds(), 10) + "\n"

// tokenSrc is what every script that makes tokens starts with.
var tokenSrc = graceSrc + clockSrc

// WaitedMark is appended to a mutex's owner value in the store once an
// attempt of another value was refused the lock, so that its release
// sends a notice only then. An owner value that ends with it cannot be
// told from its marked form: the redis package refuses such values.
const WaitedMark = "\x00"

// Acquire sets the lock if absent and, when a fence key is given, returns
// the next fencing token (see [Clock]); when the lock is held it returns minus the
// holder's remaining milliseconds. A lock that already holds the value
// counts as acquired (a fresh token), with its expiry set again to ttl
// from now: the request was resent after its first run took the lock and
// its reply was lost, as go-redis does after a read timeout, or that
// first run was a late copy of an earlier attempt, whose expiry would
// end the lock before the validity its holder counts from this attempt's
// start. It fails with a DEAD error (see
// [IsDead]) and sets nothing when the value's tombstone ([DeadKey]) exists;
// with a fence it looks for one only while a [Cleanup]'s hint (the key
// lock + [DeadHintSuffix]) lives, which it learns from a mark on the fence
// or when there is no fence, so that an uncontended acquire runs SET,
// TIME and one SET ... GET of the fence. A refused attempt marks the lock
// as waited for (see [Release]).
// With a label, it keeps the label beside the lock (the key lock +
// [LabelSuffix], with the lock's expiry), for [Inspect].
// KEYS: lock [, fence]. ARGV: value, ttl ms [, label].
var Acquire = goredis.NewScript(tokenSrc + waitedSrc + queueSrc + acquireSrc)

// AcquireQuiet is [Acquire] for a store that sends no release notices
// (Redlock): a refused attempt leaves the holder's value as it is.
var AcquireQuiet = goredis.NewScript(tokenSrc + strings.Replace(waitedSrc, "local MARK_REFUSED = true", "local MARK_REFUSED = false", 1) + queueSrc + acquireSrc)

// Cleanup undoes a failed acquire: it writes the value's tombstone
// ([DeadKey]) for ttl ms, so that an [Acquire] of the value still on its
// way (a request delayed past its clean-up) sets nothing, then deletes the
// lock if it holds the value, as [Release]. KEYS: lock [, fence]. ARGV:
// value, ttl ms [, "PUBLISH" | "SPUBLISH"]. Reply: 1 deleted, 0 not held.
// With the fence, it makes the lock's tombstone hint (lock +
// [DeadHintSuffix]) live as long as the tombstone, and marks the fence
// (its token negated): [Acquire] looks for tombstones only while the hint
// lives.
//
// The value is dead afterwards, until the tombstone expires: use it only
// for an acquisition that has been given up, never for one that will try
// again with the same value.
var Cleanup = goredis.NewScript(waitedSrc + queueSrc + cleanupSrc)

// Release deletes the lock if it holds the value and optionally publishes a
// release notice on the channel named like the lock key, only when an
// attempt of another value was refused the lock meanwhile: [Acquire] and
// [MultiAcquire] then append [WaitedMark] to the lock's value, which every
// script that compares a mutex's value accepts. KEYS: lock. ARGV:
// value [, "PUBLISH" | "SPUBLISH" | "" [, "1" | "": delete the label key
// too [, "1": leave a trace]]]. Reply: 1 deleted, 0 not held. With a
// trace, the lock key is renamed to lock + [ReleasedSuffix] (keeping its
// expiry) instead of deleted, and a release of the same value that runs
// again (a client that sends it again after losing the first reply)
// replies 1 too.
var Release = goredis.NewScript(waitedSrc + queueSrc + releaseSrc)

// Extend resets the lock's expiry if it holds the value. KEYS: lock. ARGV:
// value, ttl ms [, "1" | "": the label key's too [, "1": the fence's too,
// to ttl plus [FenceGrace]]]. Reply: 1 extended, 0 not held.
var Extend = goredis.NewScript(graceSrc + waitedSrc + extendSrc)

// SemAcquire takes a permit of a semaphore: KEYS: [SemaphoreKeys].
// ARGV: value, ttl ms, limit [, label]. Reply: the token (> 0), or minus
// the milliseconds until the first holder expires (<= 0); a LIMIT error
// ([IsLimit]) when the live holders took it with another limit, a DEAD
// error as [Acquire]'s.
var SemAcquire = goredis.NewScript(tokenSrc + groupSrc + queueSrc + semAcquireSrc)

// RWAcquire takes the read ("r") or write ("w") side of a read/write lock,
// or records (renews) the request's intent: KEYS: [RWKeys]. ARGV: value,
// ttl ms, "r" | "w" [, label]. Reply as [SemAcquire]'s, without LIMIT.
var RWAcquire = goredis.NewScript(tokenSrc + groupSrc + rwAcquireSrc)

// GroupRelease gives back a semaphore's permit or a read/write lock's
// grant: KEYS: the first three of [SemaphoreKeys] or [RWKeys]. ARGV:
// value, publish command or "", "rw" for a read/write lock or "". Reply:
// 1 given back, 0 not held.
var GroupRelease = goredis.NewScript(groupSrc + queueSrc + groupReleaseSrc)

// GroupExtend extends a semaphore's permit or a read/write lock's grant:
// KEYS as [GroupRelease]'s. ARGV: value, ttl ms. Reply: 1 extended, 0 not
// held.
var GroupExtend = goredis.NewScript(groupSrc + groupExtendSrc)

// GroupCleanup undoes a failed acquire of a semaphore or read/write lock,
// as [Cleanup] does for a mutex: KEYS: the first three of
// [SemaphoreKeys], or the lock, holders and records then the three intent
// sets of [RWKeys]. ARGV: value, ttl ms, publish command or "".
var GroupCleanup = goredis.NewScript(groupSrc + queueSrc + groupCleanupSrc)

// RWWithdraw withdraws a waiting request's intent: KEYS: the lock key
// then the three intent sets of [RWKeys]. ARGV: value, publish command or
// "". Reply: 1 withdrawn, 0 none.
var RWWithdraw = goredis.NewScript(groupSrc + rwWithdrawSrc)

// Withdraw withdraws a waiting mutex or semaphore request's intent from
// the lock's line and tells those it kept waiting; a mutex kept for the
// value (the head of the line) is handed on to the next in line, or
// freed. KEYS: the lock key. ARGV: value (unmarked), publish command or
// "", "" for a mutex or [SemSuffix] for a semaphore. Reply: 1 withdrawn,
// 0 none.
var Withdraw = goredis.NewScript(queueSrc + withdrawSrc)

// Inspect reads a lock's holders: for a mutex, KEYS: lock, fence; ARGV:
// "m"; reply {} or {token, ms left, label, owner value}. For a semaphore
// or read/write lock, KEYS: the first three of [SemaphoreKeys] or
// [RWKeys]; ARGV: "g"; reply {limit or "", record, ms left, ...} (see
// [ParseRecord]).
var Inspect = goredis.NewScript(groupSrc + waitedSrc + inspectSrc)

// MultiAcquire takes several mutexes at once, all or none: KEYS: lock 1,
// fence 1, lock 2, fence 2, ... (one hash slot on Cluster). ARGV: value,
// ttl ms [, label]. Reply: the tokens, one per lock, or minus the first
// held lock's holder's remaining milliseconds (<= 0); a DEAD error as
// [Acquire]'s, taking none.
var MultiAcquire = goredis.NewScript(tokenSrc + waitedSrc + multiAcquireSrc)

// BatchExtend extends many mutexes at once, each with its fence (to ttl
// plus [FenceGrace]): KEYS: the locks (one hash slot on Cluster). ARGV:
// value, ttl ms, "1" | "" (a label key) per lock. Reply: 1 extended or 0
// not held, per lock.
var BatchExtend = goredis.NewScript(graceSrc + waitedSrc + batchExtendSrc)

// Relabel sets a mutex holder's label (the key lock + [LabelSuffix], with
// the lock's time left) if the lock holds the value, touching nothing
// else: an election's leader publishes its value so. KEYS: lock. ARGV:
// value, label. Reply: 1 set, 0 not held.
var Relabel = goredis.NewScript(waitedSrc + relabelSrc)

// Suffixes of the keys of a semaphore and of a read/write lock, appended
// to the lock key of [Layout].
const (
	SemSuffix        = ":sem"       // holders, by expiry
	SemRecordsSuffix = ":sem:h"     // tokens and labels, and the limit
	SemFenceSuffix   = ":sem:fence" // the last token (see FenceGrace)
	RWSuffix         = ":rw"        // holders, by expiry
	RWRecordsSuffix  = ":rw:h"      // kinds, tokens and labels, and the writer
	RWFenceSuffix    = ":rw:fence"  // the last token (and intent number; see FenceGrace)
	RWWritersSuffix  = ":rw:qw"     // writers' intents, by arrival
	RWReadersSuffix  = ":rw:qr"     // readers' intents, by arrival
	RWIntentsSuffix  = ":rw:qx"     // every intent, by expiry
	QueueSuffix      = ":q"         // a mutex's waiters, by arrival (and a semaphore's, after SemSuffix)
	QueueXSuffix     = ":qx"        // their intents, by expiry
	LabelSuffix      = ":label"     // a mutex holder's label
	DeadHintSuffix   = ":dead"      // a mutex's tombstones may exist (Cleanup's hint)
	ReleasedSuffix   = ":released"  // the last released owner value (Release's trace)
)

// SemaphoreKeys returns the keys of the semaphore whose lock key (from
// [Layout]) is lock: lock itself (the channel and the tombstones' stem),
// the holders, the records and the fence.
func SemaphoreKeys(lock string) []string {
	return []string{lock, lock + SemSuffix, lock + SemRecordsSuffix, lock + SemFenceSuffix}
}

// RWKeys returns the keys of the read/write lock whose lock key is lock:
// lock itself, the holders, the records, the fence, the writers' and the
// readers' intents and the intents' expiries.
func RWKeys(lock string) []string {
	return []string{lock, lock + RWSuffix, lock + RWRecordsSuffix, lock + RWFenceSuffix,
		lock + RWWritersSuffix, lock + RWReadersSuffix, lock + RWIntentsSuffix}
}

// StateKeys returns every key that holds state of key's locks, of every
// kind, under prefix: the lock, its label, the mutex's and the
// semaphore's lines of waiters, the semaphore's and the
// read/write lock's sets and hashes. Fences (which expire [FenceGrace]
// after their lock) and tombstones (which expire after one lease TTL) are
// not among them.
func StateKeys(prefix, key string) []string {
	lock, _ := Layout(prefix, key)
	return []string{lock, lock + LabelSuffix, lock + SemSuffix, lock + SemRecordsSuffix,
		lock + QueueSuffix, lock + QueueXSuffix, lock + SemSuffix + QueueSuffix, lock + SemSuffix + QueueXSuffix,
		lock + RWSuffix, lock + RWRecordsSuffix, lock + RWWritersSuffix, lock + RWReadersSuffix, lock + RWIntentsSuffix}
}

// NoScript reports whether err is a server's NOSCRIPT reply: it does not
// have the script cached (a restart, SCRIPT FLUSH, a failover), and the
// call must be sent again with EVAL, which caches it.
func NoScript(err error) bool {
	return err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT")
}

// Run sends cmd, an EVALSHA of s with keys (cmd is "evalsha", the SHA, the
// number of keys, the keys, the arguments), on c, and sends s again with
// EVAL when the server does not have it cached ([NoScript]). It is the one
// way the stores run a script by itself; [Resend] is the way for a
// pipeline of them.
func Run(ctx context.Context, c goredis.UniversalClient, s *goredis.Script, keys []string, cmd []any) *goredis.Cmd {
	first := goredis.NewCmd(ctx, cmd...)
	_ = c.Process(ctx, first)
	if NoScript(first.Err()) {
		return s.Eval(ctx, c, keys, cmd[3+len(keys):]...)
	}
	return first
}

// Resend sends again, in one more pipeline on c, the calls of a pipeline
// whose reply was NOSCRIPT ([NoScript]): reply(i) is call i's reply, for i
// below n; eval(i, p) queues call i again with EVAL on p and keeps the new
// reply as call i's.
func Resend(ctx context.Context, c goredis.UniversalClient, n int, reply func(i int) *goredis.Cmd,
	eval func(i int, p goredis.Pipeliner)) {
	var again goredis.Pipeliner
	for i := range n {
		if NoScript(reply(i).Err()) {
			if again == nil {
				again = c.Pipeline()
			}
			eval(i, again)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
}

// IsLimit reports whether err is [SemAcquire]'s LIMIT error: the live
// holders took the semaphore with another limit.
func IsLimit(err error) bool {
	return err != nil && goredis.HasErrorPrefix(err, "LIMIT")
}

// ParseRecord reads a holder's record from [Inspect]: "<token>:<label>",
// after a kind byte 'r' or 'w' for a read/write lock (rw). ok is false for
// a record it cannot read.
func ParseRecord(rec string, rw bool) (kind byte, token uint64, label string, ok bool) {
	if rw {
		if rec == "" || (rec[0] != 'r' && rec[0] != 'w') {
			return 0, 0, "", false
		}
		kind, rec = rec[0], rec[1:]
	}
	num, label, found := strings.Cut(rec, ":")
	if !found {
		return 0, 0, "", false
	}
	token, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return 0, 0, "", false
	}
	return kind, token, label, true
}

// Publish commands for [Release]'s second argument.
const (
	NoPublish      = ""         // no release notice
	Publish        = "PUBLISH"  // standalone and Sentinel
	ShardedPublish = "SPUBLISH" // Redis Cluster (Redis 7.0+)
)

// FenceSuffix is appended to the lock key to name the fence, which holds
// the last token.
const FenceSuffix = ":fence"

// DeadInfix comes between the lock key and an owner value in the name of
// the value's tombstone: see [DeadKey].
const DeadInfix = ":dead:"

// DeadKey returns the name of the tombstone [Cleanup] writes for value on
// the lock key lock (from [Layout]): lock + [DeadInfix] + value. The
// scripts build it themselves; it shares lock's hash tag, so it lives in
// the lock's Cluster slot, and it is never the name of another lock or
// fence key.
func DeadKey(lock, value string) string {
	return lock + DeadInfix + value
}

// IsDead reports whether err is [Acquire]'s DEAD error: the owner value's
// tombstone exists, so the value was given up by a failed acquire.
func IsDead(err error) bool {
	return err != nil && goredis.HasErrorPrefix(err, "DEAD")
}

const (
	escapeChar      = '%'
	escapedSpecials = "%{}"
)

// EscapeTag returns k with '%', '{' and '}' replaced by "%25", "%7B" and
// "%7D". The result contains no brace, and distinct keys give distinct
// results (the mapping is a subset of percent-encoding, so [UnescapeTag]
// inverts it). A key without those three bytes is returned as is.
func EscapeTag(k string) string {
	if !strings.ContainsAny(k, escapedSpecials) {
		return k
	}
	var b strings.Builder
	b.Grow(len(k) + 8)
	writeEscaped(&b, k)
	return b.String()
}

func escapedLen(k string) int {
	n := len(k)
	for i := 0; i < len(k); i++ {
		switch k[i] {
		case '%', '{', '}':
			n += 2
		}
	}
	return n
}

func writeEscaped(b *strings.Builder, k string) {
	for i := 0; i < len(k); i++ {
		switch c := k[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
}

// UnescapeTag inverts [EscapeTag]. ok is false when s is not a value
// EscapeTag can return.
func UnescapeTag(s string) (k string, ok bool) {
	if strings.IndexByte(s, escapeChar) < 0 {
		return s, !strings.ContainsAny(s, "{}")
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '{', '}':
			return "", false
		case '%':
			if i+2 >= len(s) {
				return "", false
			}
			switch s[i+1 : i+3] {
			case "25":
				b.WriteByte('%')
			case "7B":
				b.WriteByte('{')
			case "7D":
				b.WriteByte('}')
			default:
				return "", false
			}
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// Layout returns the lock key and the fence key of k under prefix, built
// in one allocation: lock is EscapeTag(prefix) + "{" + EscapeTag(k) + "}"
// and fence is lock + [FenceSuffix] (lock shares fence's memory). Both
// hash to the Cluster slot of the tag EscapeTag(k): the prefix is escaped
// too, so its braces can never make the tag (a prefix without '%', '{' and
// '}' is used as is).
//
// k must not be empty: "{}" is not a hash tag, and the two names would
// then hash apart.
func Layout(prefix, k string) (lock, fence string) {
	n := escapedLen(prefix) + 2 + escapedLen(k)
	var b strings.Builder
	b.Grow(n + len(FenceSuffix))
	writeEscaped(&b, prefix)
	b.WriteByte('{')
	writeEscaped(&b, k)
	b.WriteByte('}')
	b.WriteString(FenceSuffix)
	fence = b.String()
	return fence[:n], fence
}

// Millis converts a TTL to the milliseconds PX and PEXPIRE take, rounding
// up so the store never holds the lock for less than asked; a positive TTL
// under 1ms gives 1.
func Millis(ttl time.Duration) int64 {
	ms := int64(ttl / time.Millisecond)
	if ttl%time.Millisecond != 0 {
		ms++
	}
	if ms < 1 {
		ms = 1
	}
	return ms
}

// Slot returns the Redis Cluster hash slot of key: CRC16 of its hash tag
// (the bytes between the first '{' and the first '}' after it, when not
// empty), else of the whole key, modulo 16384.
func Slot(key string) uint16 {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return crc16(key) % 16384
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// DecodeAcquire reads [Acquire]'s reply: acquired with the token (> 0), or
// not acquired with the holder's remaining time (0 when unknown).
func DecodeAcquire(v int64) (acquired bool, token uint64, holderTTL time.Duration) {
	if v > 0 {
		return true, uint64(v), 0
	}
	return false, 0, time.Duration(-v) * time.Millisecond
}
