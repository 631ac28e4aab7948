"""One module per figure family; each function returns a matplotlib Figure."""
