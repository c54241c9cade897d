package redis

// Queued returns how many calls wait in r's queue for the next batch.
func Queued(r *Resource) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}

// MaxInFlight is how many batches a Resource keeps in flight at once.
const MaxInFlight = maxInFlight
