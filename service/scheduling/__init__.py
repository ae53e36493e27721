"""Scheduling: the dispatcher, the runs store, the lease, pre-flight and adaptive seeds."""
