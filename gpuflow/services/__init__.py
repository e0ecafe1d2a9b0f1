"""Decisions over the store: capacity, fleets by kind, job records, the learned mix."""
