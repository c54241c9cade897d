package tracing

// Open returns the number of hold spans h keeps open.
func (h *Handler) Open() int { return int(h.live.Load()) }
