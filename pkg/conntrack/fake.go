package conntrack

import (
	"slices"
	"sync"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Fake is an in-memory Cleaner for unit tests of callers: it holds a table of flows,
// applies Clear's filters to it with the same matching and validation as the real
// Cleaner, and records every call.
type Fake struct {
	mu    sync.Mutex
	flows []Flow
	calls []FakeCall
	// Err, when set, is returned by Clear and List (Clear still records the call
	// but deletes nothing).
	Err error
}

// FakeCall is one recorded Clear call.
type FakeCall struct {
	Family  *family.Family
	Filters []Filter
	Deleted int
}

var _ Cleaner = (*Fake)(nil)

// NewFake returns a Fake holding the given flows.
func NewFake(flows ...Flow) *Fake { return &Fake{flows: slices.Clone(flows)} }

// Add adds flows to the table.
func (f *Fake) Add(flows ...Flow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flows = append(f.flows, flows...)
}

// Flows returns the whole table (both families).
func (f *Fake) Flows() []Flow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.flows)
}

// Calls returns the recorded Clear calls.
func (f *Fake) Calls() []FakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Reset forgets the recorded calls.
func (f *Fake) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// Clear implements Cleaner.
func (f *Fake) Clear(fam *family.Family, filters ...Filter) (int, error) {
	if len(filters) == 0 {
		return 0, nil
	}
	if err := validateAll(fam, filters); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	call := FakeCall{Family: fam, Filters: slices.Clone(filters)}
	if f.Err != nil {
		f.calls = append(f.calls, call)
		return 0, f.Err
	}
	kept := f.flows[:0:0]
	for _, fl := range f.flows {
		if fl.Family() == fam && matchAny(filters, fl) {
			call.Deleted++
			continue
		}
		kept = append(kept, fl)
	}
	f.flows = kept
	f.calls = append(f.calls, call)
	return call.Deleted, nil
}

// List implements Cleaner.
func (f *Fake) List(fam *family.Family) ([]Flow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return nil, f.Err
	}
	var out []Flow
	for _, fl := range f.flows {
		if fl.Family() == fam {
			out = append(out, fl)
		}
	}
	return out, nil
}
