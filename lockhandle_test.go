package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
)

// TestNilLock calls every method of *Lock on a nil *Lock (what TryLock
// returns with an error) and on a zero Lock: none panics, Extend and
// Unlock return ErrInvalid, Done is closed, the other getters return zero
// values. The methods are found by reflection, so that one added later is
// checked too.
func TestNilLock(t *testing.T) {
	ctx := t.Context()
	args := map[reflect.Type]reflect.Value{
		reflect.TypeFor[context.Context](): reflect.ValueOf(ctx),
		reflect.TypeFor[time.Duration]():   reflect.ValueOf(time.Second),
	}
	errType := reflect.TypeFor[error]()
	typ := reflect.TypeFor[*distlock.Lock]()
	for name, lk := range map[string]*distlock.Lock{"nil": nil, "zero": new(distlock.Lock)} {
		for i := range typ.NumMethod() {
			m := typ.Method(i)
			t.Run(name+"/"+m.Name, func(t *testing.T) {
				in := []reflect.Value{reflect.ValueOf(lk)}
				for j := 1; j < m.Type.NumIn(); j++ {
					a, ok := args[m.Type.In(j)]
					if !ok {
						t.Fatalf("no argument of type %v for %s", m.Type.In(j), m.Name)
					}
					in = append(in, a)
				}
				var out []reflect.Value
				func() {
					defer func() {
						if p := recover(); p != nil {
							t.Fatalf("%s of a %s *Lock panicked: %v", m.Name, name, p)
						}
					}()
					out = m.Func.Call(in)
				}()
				for _, v := range out {
					switch {
					case v.Type() == errType:
						if err, _ := v.Interface().(error); !errors.Is(err, distlock.ErrInvalid) {
							t.Errorf("%s of a %s *Lock = %v; want ErrInvalid", m.Name, name, err)
						}
					case m.Name == "Done":
						select {
						case <-v.Interface().(<-chan struct{}):
						default:
							t.Errorf("Done of a %s *Lock is open; want it closed", name)
						}
					case !v.IsZero():
						t.Errorf("%s of a %s *Lock = %v; want the zero value", m.Name, name, v)
					}
				}
			})
		}
	}
	// Nor does a nil *Lock in a context make TryLock panic.
	d, err := distlock.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	lk, err := d.TryLock(distlock.ContextWithLock(ctx, nil), "k", 0)
	if err != nil {
		t.Fatalf("TryLock with a nil *Lock in the context = %v; want a fresh lock", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Errorf("Unlock = %v", err)
	}
}

// The package doc's pattern, with a store that fails: TryLock returns a
// nil *Lock and an error that is not ErrNotAcquired; a deferred Unlock of
// it returns ErrInvalid instead of panicking.
func ExampleLock_Unlock_nil() {
	var lk *distlock.Lock // as TryLock returns it with an error
	fmt.Println(errors.Is(lk.Unlock(context.Background()), distlock.ErrInvalid), lk.Key() == "", lk.Token())
	// Output: true true 0
}
