package history

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The inputs and outputs of the operations in [FencedMutexModel].
type (
	// AcquireIn is a successful acquisition by Owner.
	AcquireIn struct{ Owner string }
	// AcquireOut is the token it got.
	AcquireOut struct{ Token uint64 }
	// WriteIn is a write to the fenced store by Owner with Token.
	WriteIn struct {
		Owner string
		Token uint64
	}
	// WriteOut is the store's answer.
	WriteOut struct{ Accepted bool }
)

// fencedState is the model's state.
type fencedState struct {
	MaxGranted uint64 // the largest token handed out
	Last       uint64 // the token of the last accepted write
	LastOwner  string // who wrote it
}

// FencedMutexModel is the sequential specification of a lock with fencing
// tokens in front of a fenced store:
//   - an acquisition returns a token larger than every token handed out
//     before it;
//   - a write carries a token that was handed out, and the store accepts
//     it exactly when its token is larger than that of the last accepted
//     write, or equal to it from the same owner (a token names one holder:
//     the same token from another owner is refused).
//
// A history is linearizable against it when some order of its operations
// that respects real time (an operation that returned before another began
// comes first) satisfies both. Tokens that repeat or go backwards across a
// fault (a store that forgot its counter, a failover to a replica that had
// not seen the last grant) make it fail.
var FencedMutexModel = porcupine.Model{
	Init: func() any { return fencedState{} },
	Step: func(state, input, output any) (bool, any) {
		s := state.(fencedState)
		switch in := input.(type) {
		case AcquireIn:
			out := output.(AcquireOut)
			if out.Token <= s.MaxGranted {
				return false, s
			}
			s.MaxGranted = out.Token
			return true, s
		case WriteIn:
			out := output.(WriteOut)
			if in.Token > s.MaxGranted {
				return false, s // a token not yet handed out
			}
			accept := in.Token > s.Last || (in.Token == s.Last && in.Owner == s.LastOwner)
			if out.Accepted != accept {
				return false, s
			}
			if accept {
				s.Last, s.LastOwner = in.Token, in.Owner
			}
			return true, s
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		switch in := input.(type) {
		case AcquireIn:
			return fmt.Sprintf("acquire %s -> token %d", in.Owner, output.(AcquireOut).Token)
		case WriteIn:
			verdict := "refused"
			if output.(WriteOut).Accepted {
				verdict = "accepted"
			}
			return fmt.Sprintf("write %s token %d -> %s", in.Owner, in.Token, verdict)
		}
		return fmt.Sprint(input)
	},
	DescribeState: func(state any) string {
		s := state.(fencedState)
		return fmt.Sprintf("granted<=%d last=%d(%s)", s.MaxGranted, s.Last, s.LastOwner)
	},
}

// Operations converts the successful acquisitions with a token and the
// writes of evs (as the workers saw them) into porcupine operations, one
// client per process.
func Operations(evs []Event) []porcupine.Operation {
	var procs []string
	seen := map[string]bool{}
	for _, e := range evs {
		if (e.Kind == Acquire || e.Kind == Write) && !seen[e.Proc] {
			seen[e.Proc] = true
			procs = append(procs, e.Proc)
		}
	}
	sort.Strings(procs) // client ids that do not depend on timing
	clients := make(map[string]int, len(procs))
	for i, p := range procs {
		clients[p] = i
	}
	client := func(proc string) int { return clients[proc] }
	var ops []porcupine.Operation
	for _, e := range evs {
		switch {
		case e.Kind == Acquire && e.Err == "" && e.Token != 0: // no token: nothing to check
			ops = append(ops, porcupine.Operation{ClientId: client(e.Proc), Call: e.Call, Return: e.Return,
				Input: AcquireIn{Owner: e.Owner}, Output: AcquireOut{Token: e.Token}})
		case e.Kind == Write && e.Err == "":
			ops = append(ops, porcupine.Operation{ClientId: client(e.Proc), Call: e.Call, Return: e.Return,
				Input: WriteIn{Owner: e.Owner, Token: e.Token}, Output: WriteOut{Accepted: e.Accepted}})
		}
	}
	return ops
}

// Linearizable checks evs against [FencedMutexModel] for at most timeout.
// When the history is not linearizable (or the check timed out) it writes
// porcupine's HTML visualisation into dir, when dir is not empty, and
// returns its path.
func Linearizable(evs []Event, timeout time.Duration, dir string) (porcupine.CheckResult, string, error) {
	res, info := porcupine.CheckOperationsVerbose(FencedMutexModel, Operations(evs), timeout)
	if res == porcupine.Ok || dir == "" {
		return res, "", nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, "", err
	}
	path := filepath.Join(dir, "porcupine.html")
	if err := porcupine.VisualizePath(FencedMutexModel, info, path); err != nil {
		return res, "", err
	}
	return res, path, nil
}
