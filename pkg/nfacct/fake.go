package nfacct

import (
	"fmt"
	"sync"
)

// Fake is an in-memory Interface for unit tests of callers.
type Fake struct {
	mu      sync.Mutex
	objects map[string]Counter
	// Err, when set, fails Ensure and Get.
	Err error
}

var _ Interface = (*Fake)(nil)

// NewFake returns a Fake without objects.
func NewFake() *Fake { return &Fake{objects: map[string]Counter{}} }

// Ensure implements Interface.
func (f *Fake) Ensure(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return f.Err
	}
	if _, ok := f.objects[name]; !ok {
		f.objects[name] = Counter{Name: name}
	}
	return nil
}

// Get implements Interface.
func (f *Fake) Get(name string) (Counter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return Counter{}, f.Err
	}
	c, ok := f.objects[name]
	if !ok {
		return Counter{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return c, nil
}

// Count adds packets and bytes to an existing object, as a rule would.
func (f *Fake) Count(name string, packets, bytes uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.objects[name]
	if !ok {
		panic("nfacct.Fake: counting into missing object " + name)
	}
	c.Packets += packets
	c.Bytes += bytes
	f.objects[name] = c
}

// Names lists the objects that exist.
func (f *Fake) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.objects {
		out = append(out, n)
	}
	return out
}
